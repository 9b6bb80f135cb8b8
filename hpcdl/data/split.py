"""split.py - the one train / validation split of a labelled set, used by
`hpcdl train` for digits and by `hpcdl data shard --val-fraction`, so both cut
digits the same way: with fraction 0.2 and seed 0, 1,437 training and 360
validation images, the same images in both.

The rule is scikit-learn's stratified train_test_split: ceil(fraction * N)
samples go to validation, every class in proportion to its size (the
leftover samples of the rounding go to the larger classes), drawn with
random_state=seed. A set too small to stratify (a class with one sample, or
fewer validation samples than classes) is split the same way without
stratification.
"""
import numpy as np


def stratified_split(y, fraction, seed):
    """(train, val): int64 index arrays into the labels y, in a random order
    fixed by seed (the trainer keeps it, the shard writer shuffles again)."""
    from sklearn.model_selection import train_test_split  # on use: loads sklearn
    idx = np.arange(len(y))
    try:
        train, val = train_test_split(idx, test_size=fraction, random_state=seed, stratify=y)
    except ValueError:  # scikit-learn cannot stratify a set this small
        train, val = train_test_split(idx, test_size=fraction, random_state=seed)
    return train.astype(np.int64), val.astype(np.int64)
