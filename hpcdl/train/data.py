"""data.py - the trainer's data: a source (digits, MNIST-1D, synthetic, or a
directory of HDF5 shards from `hpcdl data shard`) split into train and test,
and the shard of each epoch's batches that one rank reads.

Shapes: N = samples, F = features, G = global batch (all ranks), L = G / ranks.
torch is imported on use, so the CLI can check names without loading it.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from ..data import DataError, mnist1d
from ..data.split import stratified_split  # as `hpcdl data shard --val-fraction`
from .errors import ConfigError

NAMES = ("digits", "mnist1d[:N]", "synthetic:CxHxW:CLASSES:SAMPLES", "DIR (HDF5 shards)")
SEQUENCE_MODELS = ("cnn1d",)  # flat rows (B, L) read as one-channel sequences
SYNTHETIC = re.compile(r"^synthetic:(\d+(?:x\d+)*):(\d+):(\d+)$")


@dataclass
class Dataset:
    """Train and test tensors held in memory (digits, synthetic)."""
    x_train: "torch.Tensor"   # (N_train, *sample_shape) float32
    y_train: "torch.Tensor"   # (N_train,) int64 class labels
    x_test: "torch.Tensor"    # (N_test, *sample_shape)
    y_test: "torch.Tensor"    # (N_test,)
    num_classes: int
    image_shape: tuple = None  # (C, H, W) the samples can be viewed as, for ResNets

    @property
    def num_features(self):
        return self.x_train[0].numel()

    @property
    def sample_shape(self):
        return tuple(self.x_train.shape[1:])

    @property
    def n_train(self):
        return len(self.y_train)

    @property
    def n_test(self):
        return len(self.y_test)

    def train_batches(self, rows):
        """(x, y) for each row of sample indices (steps, L), in row order."""
        import torch  # on use: loads torch
        for idx in torch.from_numpy(rows):
            yield self.x_train[idx], self.y_train[idx]

    def test_batches(self, idx, batch=512):
        """(x, y) over the test samples idx, batch at a time."""
        for i in range(0, len(idx), batch):
            part = idx[i:i + batch]
            yield self.x_test[part], self.y_test[part]


# ---------------------------------------------------------------- choosing a source
def check_source(spec, model):
    """ConfigError if spec names no source or cannot feed model."""
    try:
        n = mnist1d.parse(spec)
    except ValueError as e:
        raise ConfigError("--data " + str(e))
    if spec == "digits" or n is not None:
        if model not in ("mlp",) + SEQUENCE_MODELS:
            raise ConfigError("--data %s has flat samples and --model %s takes images; use "
                              "--model %s" % (spec, model, " or ".join(("mlp",)
                                                                       + SEQUENCE_MODELS)))
        return
    m = SYNTHETIC.match(spec)
    if m:
        shape, classes, samples = _synthetic_spec(m)
        if classes < 2 or samples < 2 or 0 in shape:
            raise ConfigError("--data %s: give at least 2 classes, 2 samples and non-zero "
                              "dimensions" % spec)
        if model in SEQUENCE_MODELS and len(shape) != 1:
            raise ConfigError("--data %s: %s takes sequences; give one length, e.g. "
                              "synthetic:40:10:1024" % (spec, model))
        if model not in ("mlp",) + SEQUENCE_MODELS and len(shape) != 3:
            raise ConfigError("--data %s: %s takes images; give the shape as CxHxW, e.g. "
                              "synthetic:3x32x32:10:1024" % (spec, model))
        return
    if spec.startswith("synthetic"):
        raise ConfigError("--data %s: write synthetic data as synthetic:CxHxW:CLASSES:SAMPLES "
                          "(e.g. synthetic:3x32x32:10:1024) or synthetic:F:CLASSES:SAMPLES"
                          % spec)
    if not os.path.exists(spec):
        raise ConfigError("--data %s: no such directory (and not a built-in source). Use "
                          "one of: %s; make shards with `hpcdl data shard`"
                          % (spec, ", ".join(NAMES)))
    if not os.path.isdir(spec):
        raise ConfigError("--data %s is a file; give the directory `hpcdl data shard` wrote"
                          % spec)


def _synthetic_spec(m):
    return tuple(int(d) for d in m.group(1).split("x")), int(m.group(2)), int(m.group(3))


def prepare(spec):
    """Makes what spec needs before ranks start (the MNIST-1D cache, with
    progress lines); nothing for other sources. ConfigError if it cannot."""
    n = mnist1d.parse(spec)
    if n is not None:
        try:
            mnist1d.ensure(n)
        except DataError as e:
            raise ConfigError(str(e))


def load(spec, seed=0, test_fraction=0.2, **shard_options):
    """The source spec, split with seed: the same split on every rank and run
    (MNIST-1D brings its own fixed test set: seed and test_fraction do not
    change it)."""
    if spec == "digits":
        return _load_digits(seed, test_fraction)
    n = mnist1d.parse(spec)
    if n is not None:
        return _load_mnist1d(n)
    m = SYNTHETIC.match(spec)
    if m:
        return _load_synthetic(*_synthetic_spec(m), seed, test_fraction)
    from .shards import load_shards  # on use: loads torch and tqdm
    return load_shards(spec, **shard_options)


def _load_digits(seed, test_fraction):
    # scikit-learn ships the 1,797 8x8 digit images: nothing to download
    from sklearn.datasets import load_digits  # on use: loads sklearn
    x, y = load_digits(return_X_y=True)
    train, test = stratified_split(y, test_fraction, seed)
    x_tr, x_te, y_tr, y_te = x[train], x[test], y[train], y[test]
    # pixels are 0..16
    return _standardised(x_tr, y_tr, x_te, y_te, 10, image_shape=(1, 8, 8))


def _load_mnist1d(n):
    """N MNIST-1D samples from the cache (hpcdl.data.mnist1d; generated by
    whichever rank gets there first, the others wait for it and read)."""
    try:
        d = mnist1d.load(n)
    except DataError as e:
        raise ConfigError(str(e))
    return _standardised(d["x_train"], d["y_train"], d["x_test"], d["y_test"],
                         mnist1d.NUM_CLASSES)


def _standardised(x_tr, y_tr, x_te, y_te, num_classes, image_shape=None):
    """A Dataset with each feature standardised by the training set's statistics
    only (the test set stays unseen); a constant feature keeps std 1."""
    import torch  # on use: loads torch
    mean, std = x_tr.mean(axis=0, dtype=np.float64), x_tr.std(axis=0, dtype=np.float64)
    std[std == 0] = 1.0

    def tensor(a):  # in a's precision: float64 digits as ever, float32 MNIST-1D (1M x 40)
        return torch.from_numpy(((a - mean.astype(a.dtype)) / std.astype(a.dtype))
                                .astype(np.float32, copy=False))
    return Dataset(tensor(x_tr), torch.from_numpy(y_tr.astype(np.int64)),
                   tensor(x_te), torch.from_numpy(y_te.astype(np.int64)), num_classes,
                   image_shape=image_shape)


def _load_synthetic(shape, classes, samples, seed, test_fraction):
    """Gaussian samples labelled by a fixed random linear teacher: learnable,
    reproducible from seed, and the same on every rank."""
    import torch  # on use: loads torch
    g = torch.Generator().manual_seed(10_000 + seed)
    x = torch.randn((samples,) + shape, generator=g)
    teacher = torch.randn(x[0].numel(), classes, generator=g)
    y = (x.reshape(samples, -1) @ teacher).argmax(1)
    n_test = max(1, int(round(samples * test_fraction)))
    return Dataset(x[n_test:], y[n_test:], x[:n_test], y[:n_test], classes,
                   image_shape=shape if len(shape) == 3 else None)


# ---------------------------------------------------------------- who reads what
def steps_per_epoch(n, global_batch):
    """Full global batches in an epoch; the remaining n % G samples sit it out."""
    return n // global_batch


def epoch_shard(n, global_batch, rank, size, seed, epoch, start=0):
    """Indices rank reads in epoch: an int64 array (steps, L), row s = its part of step s.

    Every rank draws the same permutation of range(n), seeded by (seed, epoch),
    cuts it into steps_per_epoch global batches of G and takes the rank-th
    contiguous L-sample slice of each. So within an epoch ranks read disjoint
    samples, all make the same number of steps, and together they read exactly
    the batches one process would with the same G and seed.

    start: samples of the permutation already read this epoch at another
    batch (--global-batch auto re-picks within an epoch, train/goodput.py);
    the rest of it is cut at G (a remainder under G is left out, as at 0).
    """
    if global_batch % size:
        raise ValueError("global batch %d does not divide by %d ranks" % (global_batch, size))
    local = global_batch // size
    steps = steps_per_epoch(n - start, global_batch)
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    batches = perm[start:start + steps * global_batch].reshape(steps, size, local)
    return np.ascontiguousarray(batches[:, rank, :])


def eval_shard(n, rank, size):
    """Indices of an n-sample evaluation set that rank scores: near-equal contiguous parts."""
    return np.array_split(np.arange(n), size)[rank]
