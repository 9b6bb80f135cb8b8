"""data.py - the training data: a built-in data set split into train and test,
and the shard of each epoch's batches that one rank reads.

Shapes: N = samples, F = features, G = global batch (all ranks), L = G / ranks.
torch is imported on use, so the CLI can check names without loading it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NAMES = ("digits",)


@dataclass
class Dataset:
    x_train: torch.Tensor   # (N_train, F) float32, standardised
    y_train: torch.Tensor   # (N_train,) int64 class labels
    x_test: torch.Tensor    # (N_test, F), standardised with the training statistics
    y_test: torch.Tensor    # (N_test,)
    num_classes: int

    @property
    def num_features(self):
        return self.x_train.shape[1]


def load(name, seed=0, test_fraction=0.2):
    """The data set `name`, split with `seed`: the same split on every rank and run."""
    if name == "digits":
        return _load_digits(seed, test_fraction)
    raise ValueError("unknown data set %r; use one of: %s" % (name, ", ".join(NAMES)))


def _load_digits(seed, test_fraction):
    # scikit-learn ships the 1,797 8x8 digit images: nothing to download
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    x, y = load_digits(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y)
    # pixels are 0..16; standardise each with the training set's statistics
    # only (the test set stays unseen); always-blank pixels keep std 1
    mean, std = x_tr.mean(axis=0), x_tr.std(axis=0)
    std[std == 0] = 1.0

    def tensor(a):
        return torch.from_numpy(((a - mean) / std).astype(np.float32))
    return Dataset(tensor(x_tr), torch.from_numpy(y_tr.astype(np.int64)),
                   tensor(x_te), torch.from_numpy(y_te.astype(np.int64)), 10)


def steps_per_epoch(n, global_batch):
    """Full global batches in an epoch; the remaining n % G samples sit it out."""
    return n // global_batch


def epoch_shard(n, global_batch, rank, size, seed, epoch):
    """Indices rank reads in epoch: an int64 array (steps, L), row s = its part of step s.

    Every rank draws the same permutation of range(n), seeded by (seed, epoch),
    cuts it into steps_per_epoch global batches of G and takes the rank-th
    contiguous L-sample slice of each. So within an epoch ranks read disjoint
    samples, all make the same number of steps, and together they read exactly
    the batches one process would with the same G and seed.
    """
    if global_batch % size:
        raise ValueError("global batch %d does not divide by %d ranks" % (global_batch, size))
    local = global_batch // size
    steps = steps_per_epoch(n, global_batch)
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    batches = perm[:steps * global_batch].reshape(steps, size, local)
    return np.ascontiguousarray(batches[:, rank, :])


def eval_shard(n, rank, size):
    """Indices of an n-sample evaluation set that rank scores: near-equal contiguous parts."""
    return np.array_split(np.arange(n), size)[rank]
