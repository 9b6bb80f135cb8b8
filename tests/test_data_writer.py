"""test_data_writer.py - `hpcdl data shard` for every source type: what is read
back from the shards equals the source exactly (value, label, position via
source_index), every sample lands in exactly one shard of one split, and the
manifest describes the files (counts, shape, dtype, chunking, filter). The CLI's
shard / inspect / verify in one process."""
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

import data_helpers as dh
from hpcdl.data import H5ShardDataset, Manifest
from hpcdl.data import images as img

HPCDL = [sys.executable, "-m", "hpcdl", "data"]


def check_split_union(out, sizes):
    """Every source index of every split appears exactly once; shards differ by <= 1."""
    for split, n in sizes.items():
        ds = H5ShardDataset(out, split)
        idx = np.sort(ds.read_field("source_index"))
        assert len(idx) == len(ds)
        counts = [s["num_samples"] for s in Manifest(out).split(split)["shards"]]
        assert max(counts) - min(counts) <= 1 and sum(counts) == len(ds)
        if n is not None:
            assert np.array_equal(idx, np.arange(n))


def test_digits_round_trip_and_stratified_val(tmp_path):
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    dh.write("digits", tmp_path, shards=3, val_fraction=0.2, seed=5)
    seen = []
    for split in ("train", "val"):
        ds = H5ShardDataset(tmp_path, split)
        assert ds.sample_shape == (64,) and ds.num_classes == 10
        assert ds.class_names == [str(k) for k in range(10)]
        for s, (xs, ys) in dh.stored(ds).items():
            assert np.array_equal(xs, x[s]) and ys == y[s]
        seen.append(ds.read_field("source_index"))
        if split == "val":  # a fifth of every class, rounded as scikit-learn does
            got = np.bincount(ds.read_field("y"), minlength=10)
            assert np.all(np.abs(got - 0.2 * np.bincount(y)) < 1), got
            assert len(ds) == 360  # ceil(0.2 * 1797)
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(len(y)))
    # `hpcdl train --seed 5` holds out the same images (one split function)
    from hpcdl.train import data
    held_out = data.load("digits", seed=5, test_fraction=0.2)
    mean, std = x[seen[0]].mean(0), x[seen[0]].std(0)
    std[std == 0] = 1
    want = np.sort(((x[seen[1]] - mean) / std).astype(np.float32), axis=0)
    assert np.array_equal(np.sort(held_out.x_test.numpy(), axis=0), want)


@pytest.mark.parametrize("compression, chunk_rows", [("gzip", 7), ("lzf", 1), ("none", 0)])
def test_npz_round_trip_and_layout(tmp_path, compression, chunk_rows):
    src = dh.make_npz(tmp_path / "a.npz", n=53, shape=(2, 3), classes=4, val=11,
                      class_names=np.array(["ant", "bee", "cow", "doe"]))
    out = tmp_path / "out"
    dh.write(str(tmp_path / "a.npz"), out, shards=4, compression=compression,
             chunk_rows=chunk_rows)
    m = Manifest(out)
    assert m.class_names == ["ant", "bee", "cow", "doe"] and m.dtype == np.uint8
    assert m.sample_shape == (2, 3) and sorted(m.splits) == ["train", "val"]
    rows = chunk_rows or m.chunk_rows
    for split, (x, y) in (("train", (src["x"], src["y"])), ("val", (src["x_val"],
                                                                   src["y_val"]))):
        ds = H5ShardDataset(out, split)
        for s, (xs, ys) in dh.stored(ds).items():
            assert np.array_equal(xs, x[s]) and ys == y[s]
        for shard in m.split(split)["shards"]:
            with h5py.File(m.shard_path(shard), "r") as f:
                assert f["x"].chunks == (min(rows, shard["num_samples"]), 2, 3)
                assert f["x"].compression == (None if compression == "none" else compression)
                assert len(shard["checksums"]["x"]) == -(-shard["num_samples"] // rows)
    check_split_union(out, {"train": 53, "val": 11})


def test_npy_pair_float_samples(tmp_path):
    x = dh.pattern(40, (4, 2, 3), dtype=np.float32) / 7
    y = dh.labels(40, 3)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y.astype(np.int32))
    out = tmp_path / "out"
    dh.write(str(tmp_path / "x.npy"), out, labels=str(tmp_path / "y.npy"), shards=3,
             class_names=["a", "b", "c"])
    ds = H5ShardDataset(out)
    assert ds.sample_shape == (4, 2, 3) and ds.manifest.dtype == np.float32
    for s, (xs, ys) in dh.stored(ds).items():
        assert np.array_equal(xs, x[s]) and ys == y[s]
    t, label = ds[3]
    assert t.dtype.is_floating_point and str(t.dtype) == "torch.float32"
    assert np.array_equal(t.numpy(), ds.get_raw(3)[0]) and label == ds.get_raw(3)[1]


def test_cifar10_batches(tmp_path):
    parts = dh.make_cifar(tmp_path / "cifar", per_batch=12, batches=2, test=7)
    out = tmp_path / "out"
    dh.write(str(tmp_path / "cifar"), out, shards=2)
    train_x = np.concatenate([parts["data_batch_1"][0], parts["data_batch_2"][0]])
    train_y = np.concatenate([parts["data_batch_1"][1], parts["data_batch_2"][1]])
    ds = H5ShardDataset(out, "train")
    assert ds.sample_shape == (3, 32, 32) and ds.class_names[:2] == ["plane", "car"]
    for s, (xs, ys) in dh.stored(ds).items():
        assert np.array_equal(xs, train_x[s]) and ys == train_y[s]
    val = H5ShardDataset(out, "val")
    for s, (xs, ys) in dh.stored(val).items():
        assert np.array_equal(xs, parts["test_batch"][0][s]) and ys == parts["test_batch"][1][s]
    check_split_union(out, {"train": 24, "val": 7})


def test_image_folder_encoded_keeps_bytes_and_decodes(tmp_path):
    files = dh.make_images(tmp_path / "imgs", sizes=[(6, 5), (4, 7)])  # mixed sizes
    out = tmp_path / "out"
    dh.write(str(tmp_path / "imgs"), out, shards=2, val_fraction=0.34, seed=1)
    m = Manifest(out)
    assert m.encoding == "image" and m.sample_shape is None and m.channels == 3
    assert m.class_names == ["cat", "dog", "emu"]
    got = 0
    for split in ("train", "val"):
        ds = H5ShardDataset(out, split)
        for i, s in enumerate(ds.read_field("source_index")):
            path, label = files[s]
            raw, y = ds.get_raw(i)
            assert bytes(raw) == open(path, "rb").read() and y == label
            x, y2 = ds[i]
            assert np.array_equal(x.numpy(), img.decode(open(path, "rb").read(), 3)) and y2 == y
            got += 1
    assert got == len(files)


def test_image_folder_decoded_split_layout_grey(tmp_path):
    train = dh.make_images(tmp_path / "f" / "train", mode="L", size=(5, 4))
    val = dh.make_images(tmp_path / "f" / "val", classes=("cat", "emu"), per_class=(1, 2),
                         mode="L", size=(5, 4))
    out = tmp_path / "out"
    dh.write(str(tmp_path / "f"), out, shards=2, decode=True)
    m = Manifest(out)
    assert m.encoding == "raw" and m.sample_shape == (1, 5, 4) and m.channels == 1
    for split, files in (("train", train), ("val", val)):
        ds = H5ShardDataset(out, split)
        for s, (xs, ys) in dh.stored(ds).items():
            from PIL import Image
            want = np.asarray(Image.open(files[s][0]))[None]
            assert np.array_equal(xs, want)
            assert m.class_names[ys] == os.path.basename(os.path.dirname(files[s][0]))


def test_seed_fixes_order_and_shuffles(tmp_path):
    dh.make_npz(tmp_path / "a.npz", n=60)
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        dh.write(str(tmp_path / "a.npz"), tmp_path / name, shards=2, seed=seed)
    order = {n: H5ShardDataset(tmp_path / n).read_field("source_index") for n in "abc"}
    assert np.array_equal(order["a"], order["b"])
    assert not np.array_equal(order["a"], order["c"])
    assert not np.array_equal(order["a"], np.arange(60))  # shuffled before sharding
    assert Manifest(tmp_path / "a").doc["splits"] == Manifest(tmp_path / "b").doc["splits"]


# ---------------------------------------------------------------- the CLI
def run(args, **kw):
    return subprocess.run(HPCDL + args, capture_output=True, text=True, timeout=120, **kw)


def test_cli_shard_inspect_verify(tmp_path):
    out = str(tmp_path / "d")
    r = run(["shard", "digits", "--out", out, "--shards", "3", "--val-fraction", "0.25"])
    assert r.returncode == 0, r.stderr
    assert "train: 3 shards" in r.stdout and "val: 3 shards" in r.stdout
    r = run(["inspect", out])
    assert r.returncode == 0, r.stderr
    total = sum(int(line.split()[2]) for line in r.stdout.splitlines()
                if line.split()[:1] in (["train"], ["val"]))
    assert total == 1797 and "10 classes" in r.stdout and "64 uint8" in r.stdout
    r = run(["verify", out])
    assert r.returncode == 0 and "bad shards: 0 of 6 OK" in r.stdout, r.stdout + r.stderr
    # a second shard into the same directory needs --force
    r = run(["shard", "digits", "--out", out])
    assert r.returncode == 2 and "--force" in r.stderr
    assert run(["shard", "digits", "--out", out, "--force"]).returncode == 0
    assert json.load(open(os.path.join(out, "manifest.json")))["splits"].keys() == {"train"}


@pytest.mark.parametrize("args, message", [
    (["shard", "digits", "--compression", "zstd"], "--compression"),
    (["shard", "digits", "--val-fraction", "1.5"], "between 0 and 1"),
    (["shard", "digits", "--shards", "0"], "--shards must be"),
    (["shard", "nowhere.npz"], "no such file"),
    (["inspect", "/nonexistent/dir"], "no such directory")])
def test_cli_usage_errors(tmp_path, args, message):
    if args[0] == "shard":
        args = args + ["--out", str(tmp_path / "o")]
    r = run(args)
    assert r.returncode == 2 and message in r.stderr, r.stderr
