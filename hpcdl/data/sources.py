"""sources.py - what `hpcdl data shard SOURCE` reads, as parts (one per split
the source brings) that the writer can read by index:

    digits                    scikit-learn's built-in 8x8 digits, stored (64,) uint8
    mnist1d[:N]               MNIST-1D generated here (data/mnist1d.py): N samples, its
                              fixed test set as split "val", stored (40,) float32
    FILE.npz                  arrays x, y (optional x_val, y_val, class_names)
    X.npy --labels Y.npy      a pair of .npy files (memory-mapped, not loaded)
    DIR/data_batch_*          CIFAR-10 python batches (test_batch becomes "val")
    DIR/CLASS/*.jpg|png       an image folder in ImageNet layout; DIR/train/CLASS
                              and DIR/val/CLASS give both splits

An ArrayPart holds samples as arrays; an ImagePart holds image files, stored
as their encoded bytes (decoded at read time) or decoded to uint8 (C, H, W).
"""
import os
import pickle

import numpy as np

from . import images
from .manifest import DataError
from . import mnist1d
from ..utils.log import warn


class ArrayPart:
    """n samples in arrays: x (n, *sample_shape), y (n,) int64."""
    encoding = "raw"

    def __init__(self, x, y, origin):
        self.x, self.y, self.origin = x, y, origin
        self.sample_shape, self.dtype = tuple(x.shape[1:]), x.dtype

    def __len__(self):
        return len(self.y)

    def read(self, idx):
        """Samples idx (sorted int array) as one array (len(idx), *sample_shape)."""
        return np.asarray(self.x[idx])


class ImagePart:
    """n image files with labels; read() gives encoded bytes or decoded arrays."""

    def __init__(self, files, y, origin):
        self.files, self.y, self.origin = files, y, origin
        self.decode_to = None  # (channels, H, W) when storing decoded arrays

    def __len__(self):
        return len(self.y)

    @property
    def encoding(self):
        return "image" if self.decode_to is None else "raw"

    def scan(self, idx):
        """Decodes images idx once: (channels seen, {(H, W): first path}).
        DataError naming the first image that does not decode."""
        channels, sizes = set(), {}
        for i in idx:
            try:
                _, c, hw = images.probe(self.files[i])
            except (OSError, ValueError) as e:
                raise DataError("%s (sample %d of %s): %s" % (self.files[i], i, self.origin, e))
            channels.add(c)
            sizes.setdefault(hw, self.files[i])
        return channels, sizes

    def read(self, idx):
        if self.decode_to is None:
            out = []
            for i in idx:
                with open(self.files[i], "rb") as f:
                    out.append(np.frombuffer(f.read(), dtype=np.uint8))
            return out
        out = np.empty((len(idx),) + self.decode_to, dtype=np.uint8)
        for k, i in enumerate(idx):
            with open(self.files[i], "rb") as f:
                try:
                    out[k] = images.decode(f.read(), self.decode_to[0])
                except ValueError as e:
                    raise DataError("%s (sample %d): %s" % (self.files[i], i, e))
        return out


class Source:
    """A source opened for sharding: parts by split, classes, a description."""

    def __init__(self, description, parts, class_names):
        self.description, self.parts, self.class_names = description, parts, class_names


# ---------------------------------------------------------------- labels
def check_labels(y, origin, num_classes=None):
    """y as int64 after checking it: 1-D, whole numbers, 0 <= y < num_classes."""
    y = np.asarray(y)
    if y.ndim != 1:
        raise DataError("%s: labels have shape %s; expected one label per sample (N,)"
                        % (origin, y.shape))
    if y.dtype.kind == "f":
        frac = np.flatnonzero(y != np.round(y))
        if len(frac):
            raise DataError("%s: label at index %d is %r, not a class number"
                            % (origin, frac[0], y[frac[0]]))
    elif y.dtype.kind not in "iub":
        raise DataError("%s: labels have dtype %s; expected integers" % (origin, y.dtype))
    y = y.astype(np.int64)
    bad = np.flatnonzero((y < 0) | (y >= (num_classes or np.iinfo(np.int64).max)))
    if len(bad):
        raise DataError("%s: label at index %d is %d, outside 0..%s"
                        % (origin, bad[0], y[bad[0]],
                           num_classes - 1 if num_classes else "(no negatives)"))
    return y


def array_part(x, y, origin, num_classes=None):
    if x.dtype.kind not in "biuf":
        raise DataError("%s: samples have dtype %s; expected numbers" % (origin, x.dtype))
    if x.ndim < 1 or len(x) != len(y):
        raise DataError("%s: %d samples but %d labels; they must match one to one"
                        % (origin, len(x) if x.ndim else 0, len(y)))
    return ArrayPart(x, check_labels(y, origin, num_classes), origin)


def class_names_for(parts, names, origin):
    """The given class names, else "0".."K-1" with K = largest label + 1."""
    if names is not None:
        return [str(n) for n in names]
    top = max((int(p.y.max()) for p in parts.values() if len(p)), default=-1)
    if top < 0:
        raise DataError("%s: no samples" % origin)
    return [str(k) for k in range(top + 1)]


# ---------------------------------------------------------------- sources
def open_source(spec, labels=None, class_names=None):
    """The Source named by spec (see the module docstring). class_names: a list
    that fixes the classes (labels must fall inside it), for arrays only."""
    if spec == "digits":
        return _digits()
    try:
        n = mnist1d.parse(spec)
    except ValueError as e:
        raise DataError(str(e))
    if n is not None:
        return _mnist1d(n)
    if not os.path.exists(spec):
        raise DataError("%s: no such file or directory (sources: digits, mnist1d[:N], "
                        "FILE.npz, X.npy --labels Y.npy, a CIFAR-10 batches folder, an image "
                        "folder)" % spec)
    if spec.endswith(".npz"):
        return _npz(spec, class_names)
    if spec.endswith(".npy"):
        return _npy_pair(spec, labels, class_names)
    if os.path.isdir(spec):
        if any(n.startswith("data_batch_") or n == "test_batch" for n in os.listdir(spec)):
            return _cifar10(spec)
        return _image_folder(spec)
    raise DataError("%s: not a source hpcdl reads (.npz, .npy, CIFAR-10 batches folder, "
                    "image folder, or 'digits')" % spec)


def _digits():
    from sklearn.datasets import load_digits  # on use: loads sklearn
    x, y = load_digits(return_X_y=True)
    part = array_part(x.astype(np.uint8), y, "digits")  # pixel values are 0..16
    return Source("digits (scikit-learn)", {"train": part}, [str(k) for k in range(10)])


def _mnist1d(n):
    """N MNIST-1D samples from the cache (generated on first use); the test set
    becomes split "val", so --val-fraction is not needed (nor allowed)."""
    d = mnist1d.load(n)
    parts = {"train": array_part(d["x_train"], d["y_train"], "mnist1d:%d train" % n,
                                 mnist1d.NUM_CLASSES),
             "val": array_part(d["x_test"], d["y_test"], "mnist1d:%d test" % n,
                               mnist1d.NUM_CLASSES)}
    return Source("MNIST-1D, %d samples generated by mnist1d.data.make_dataset (%s)"
                  % (n, mnist1d.directory()), parts,
                  [str(k) for k in range(mnist1d.NUM_CLASSES)])


def _npz(path, class_names):
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataError("%s: not a readable .npz file (%s)" % (path, e))
    if "x" not in z.files or "y" not in z.files:
        raise DataError("%s has arrays %s; name the samples x and the labels y (optional: "
                        "x_val, y_val, class_names)" % (path, ", ".join(z.files) or "none"))
    if class_names is None and "class_names" in z.files:
        class_names = [str(n) for n in z["class_names"]]
    k = len(class_names) if class_names is not None else None
    parts = {"train": array_part(z["x"], z["y"], path + ":x,y", k)}
    if ("x_val" in z.files) != ("y_val" in z.files):
        raise DataError("%s: give both x_val and y_val, or neither" % path)
    if "x_val" in z.files:
        parts["val"] = array_part(z["x_val"], z["y_val"], path + ":x_val,y_val", k)
    return Source(path, parts, class_names_for(parts, class_names, path))


def _npy_pair(path, labels, class_names):
    if not labels:
        raise DataError("%s: a .npy source needs its labels: --labels LABELS.npy" % path)
    try:
        x = np.load(path, mmap_mode="r", allow_pickle=False)
        y = np.load(labels, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataError("%s / %s: not readable .npy files (%s)" % (path, labels, e))
    k = len(class_names) if class_names is not None else None
    parts = {"train": array_part(x, y, "%s + %s" % (path, labels), k)}
    return Source("%s + %s" % (path, labels), parts, class_names_for(parts, class_names, path))


def _cifar10(folder):
    def load(name):
        path = os.path.join(folder, name)
        try:
            with open(path, "rb") as f:
                d = pickle.load(f, encoding="bytes")
            x = np.asarray(d[b"data"], dtype=np.uint8)
            y = d[b"labels"]
        except (OSError, pickle.UnpicklingError, KeyError, TypeError, EOFError) as e:
            raise DataError("%s: not a CIFAR-10 python batch (%s: %s)"
                            % (path, type(e).__name__, e))
        if x.ndim != 2 or x.shape[1] != 3 * 32 * 32:
            raise DataError("%s: data has shape %s; CIFAR-10 rows are 3072 bytes"
                            % (path, x.shape))
        return x.reshape(-1, 3, 32, 32), np.asarray(y), path

    names = sorted((n for n in os.listdir(folder) if n.startswith("data_batch_")),
                   key=lambda n: int(n.rsplit("_", 1)[1]) if n.rsplit("_", 1)[1].isdigit() else 0)
    meta = os.path.join(folder, "batches.meta")
    class_names = [str(k) for k in range(10)]
    if os.path.exists(meta):
        with open(meta, "rb") as f:
            class_names = [n.decode() for n in pickle.load(f, encoding="bytes")[b"label_names"]]
    parts = {}
    if names:
        loaded = [load(n) for n in names]
        parts["train"] = array_part(np.concatenate([a[0] for a in loaded]),
                                    np.concatenate([a[1] for a in loaded]),
                                    os.path.join(folder, "data_batch_*"), len(class_names))
    if os.path.exists(os.path.join(folder, "test_batch")):
        x, y, path = load("test_batch")
        parts["val" if names else "train"] = array_part(x, y, path, len(class_names))
    return Source("CIFAR-10 batches in " + folder, parts, class_names)


def _image_folder(folder):
    train = os.path.join(folder, "train")
    split_layout = os.path.isdir(train) and _class_dirs(train)
    root = train if split_layout else folder
    class_names = _class_dirs(root)
    if not class_names:
        raise DataError("%s: no class folders with .jpg/.png images (expected "
                        "%s/CLASS_NAME/IMAGE.jpg, or train/ and val/ folders of those)"
                        % (folder, folder))
    parts = {"train": _image_part(root, class_names)}
    val = os.path.join(folder, "val")
    if split_layout and os.path.isdir(val):
        extra = sorted(set(_class_dirs(val)) - set(class_names))
        if extra:
            raise DataError("%s: class folder(s) %s are not in %s" % (val, ", ".join(extra),
                                                                      train))
        parts["val"] = _image_part(val, class_names)
    return Source("image folder " + folder, parts, class_names)


def _class_dirs(root):
    return sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and any(
        f.lower().endswith(images.IMAGE_EXTENSIONS) for f in os.listdir(os.path.join(root, d))))


def _image_part(root, class_names):
    files, labels, ignored = [], [], []
    for label, name in enumerate(class_names):
        d = os.path.join(root, name)
        if not os.path.isdir(d):
            continue  # a class absent from this split (val) has no samples here
        for f in sorted(os.listdir(d)):
            path = os.path.join(d, f)
            if f.lower().endswith(images.IMAGE_EXTENSIONS):
                files.append(path)
                labels.append(label)
            elif os.path.isfile(path):
                ignored.append(path)
    if ignored:  # said out loud: no sample disappears silently
        warn("%s: ignored %d file(s) without a .jpg/.jpeg/.png name, e.g. %s"
             % (root, len(ignored), ignored[0]))
    return ImagePart(files, np.asarray(labels, dtype=np.int64), root)
