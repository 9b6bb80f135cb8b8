"""data_helpers.py - small sources for the hpcdl.data tests, written here so
every value depends on the sample's position (a misplaced sample shows):
an .npz / .npy pair, CIFAR-10 python batches, an image folder of PNGs (and
JPEGs); helpers that read a shard directory back or damage one of its chunks."""
import os
import pickle

import numpy as np

from hpcdl.data import sources, writer


def pattern(n, shape, dtype=np.uint8, salt=0):
    """x[i] differs from every other sample's: (i * 31 + j * 7 + salt) % 251."""
    j = np.arange(int(np.prod(shape)))
    x = (np.arange(n)[:, None] * 31 + j[None, :] * 7 + salt) % 251
    return x.reshape((n,) + tuple(shape)).astype(dtype)


def labels(n, classes, salt=0):
    i = np.arange(n)
    return ((i * 2 + i // 3 + salt) % classes).astype(np.int64)  # every class shows up


def write(source_spec, out, **kw):
    """Shards source_spec (a path or 'digits') into out in this process."""
    labels_file = kw.pop("labels", None)
    class_names = kw.pop("class_names", None)
    src = sources.open_source(source_spec, labels=labels_file, class_names=class_names)
    return writer.write_shards(src, str(out), writer.ShardOptions(**kw))


def make_npz(path, n=53, shape=(5,), classes=4, val=0, **extra):
    arrays = dict(x=pattern(n, shape), y=labels(n, classes), **extra)
    if val:
        arrays.update(x_val=pattern(val, shape, salt=100), y_val=labels(val, classes, 1))
    np.savez(path, **arrays)
    return arrays


def make_cifar(folder, per_batch=12, batches=2, test=7):
    """CIFAR-10's python format: data_batch_k and test_batch pickles of
    {b'data': (N, 3072) uint8, b'labels': [..]}, and batches.meta."""
    os.makedirs(folder, exist_ok=True)
    names = [b"plane", b"car", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse",
             b"ship", b"truck"]
    with open(os.path.join(folder, "batches.meta"), "wb") as f:
        pickle.dump({b"label_names": names}, f)
    parts = {}
    for k, name in enumerate(["data_batch_%d" % (b + 1) for b in range(batches)] +
                             ["test_batch"]):
        n = test if name == "test_batch" else per_batch
        x, y = pattern(n, (3072,), salt=k), labels(n, 10, salt=k)
        with open(os.path.join(folder, name), "wb") as f:
            pickle.dump({b"data": x, b"labels": y.tolist()}, f)
        parts[name] = (x.reshape(n, 3, 32, 32), y)
    return parts


def make_images(root, classes=("cat", "dog", "emu"), per_class=(3, 2, 4), size=(6, 5),
                mode="RGB", ext=".png", sizes=None):
    """root/CLASS/img_k.EXT with position-dependent pixels; returns [(path, label)]."""
    from PIL import Image
    out, serial = [], 0
    for label, (name, count) in enumerate(zip(classes, per_class)):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for k in range(count):
            h, w = sizes[serial % len(sizes)] if sizes else size
            channels = 3 if mode == "RGB" else 1
            arr = pattern(1, (h, w, channels), salt=serial)[0]
            img = Image.fromarray(arr if channels == 3 else arr[:, :, 0])  # RGB or L
            path = os.path.join(root, name, "img_%d%s" % (k, ext))
            img.save(path)
            out.append((path, label))
            serial += 1
    return out


def stored(ds):
    """{source_index: (x as stored, label)} of every sample of an H5ShardDataset."""
    index = ds.read_field("source_index")
    return {int(s): ds.get_raw(i) for i, s in enumerate(index)}


def corrupt_chunk(shard, field, chunk, skip=0, count=16):
    """Inverts `count` bytes of the stored chunk `chunk` of `field`, `skip` bytes in."""
    import h5py
    with h5py.File(shard, "r") as f:
        info = f[field].id.get_chunk_info(chunk)
    with open(shard, "r+b") as f:
        f.seek(info.byte_offset + skip)
        data = f.read(min(count, info.size - skip))
        f.seek(info.byte_offset + skip)
        f.write(bytes(b ^ 0xFF for b in data))
