"""test_data_bad.py - every kind of bad input of issue #6 gives an error that
names the file, the index or field and what is wrong, from the reader, from
`hpcdl data verify` (exit 1) and from the writer: a missing file, a truncated
or corrupted shard, a manifest that disagrees with the files, labels out of
range, an image that does not decode. Never a wrong or skipped sample."""
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
from torch.utils.data import DataLoader

import data_helpers as dh
from hpcdl.data import DataError, H5ShardDataset, collate
from hpcdl.data.manifest import block_digests


def make(tmp_path, compression="gzip", **kw):
    os.makedirs(tmp_path, exist_ok=True)
    dh.make_npz(tmp_path / "a.npz", n=40, shape=(3, 4), classes=5)
    out = tmp_path / "out"
    dh.write(str(tmp_path / "a.npz"), out, shards=2, chunk_rows=8, compression=compression,
             **kw)
    return str(out), os.path.join(str(out), "train-00000-of-00002.h5")


def edit_manifest(out, change):
    path = os.path.join(out, "manifest.json")
    doc = json.load(open(path))
    change(doc)
    json.dump(doc, open(path, "w"))


def reseal(out, shard_file):
    """Recompute a shard's checksums and size in the manifest after an edit, as
    if the manifest had been written that way (a consistent but bad shard)."""
    with h5py.File(os.path.join(out, shard_file), "r") as f:
        sums = {k: block_digests(f[k][:], 8) for k in ("x", "y", "source_index")}

    def change(doc):
        for s in doc["splits"]["train"]["shards"]:
            if s["file"] == shard_file:
                s["checksums"] = sums
                s["bytes"] = os.path.getsize(os.path.join(out, shard_file))
    edit_manifest(out, change)


def read_all(out, **kw):
    ds = H5ShardDataset(out, **kw)
    return collate(ds.__getitems__(list(range(len(ds)))))


def verify(out):
    r = subprocess.run([sys.executable, "-m", "hpcdl", "data", "verify", out],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "FAILED" in r.stdout, r.stdout + r.stderr
    return r.stderr


# ---------------------------------------------------------------- manifest, files
def test_not_a_shard_directory(tmp_path):
    with pytest.raises(DataError, match="no such directory"):
        H5ShardDataset(tmp_path / "none")
    with pytest.raises(DataError, match="manifest.json: missing"):
        H5ShardDataset(tmp_path)
    out, _ = make(tmp_path)
    edit_manifest(out, lambda d: d.update(format_version=99))
    with pytest.raises(DataError, match="format version 99"):
        H5ShardDataset(out)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        f.write("{half")
    with pytest.raises(DataError, match="not readable JSON"):
        H5ShardDataset(out)


def test_missing_shard(tmp_path):
    out, shard = make(tmp_path)
    os.remove(shard)
    with pytest.raises(DataError, match="train-00000-of-00002.h5: missing"):
        H5ShardDataset(out)
    assert "train-00000-of-00002.h5: missing" in verify(out)


def test_truncated_shard(tmp_path):
    out, shard = make(tmp_path)
    os.truncate(shard, os.path.getsize(shard) // 2)
    with pytest.raises(DataError, match=r"00000-of-00002.h5: \d+ bytes, the manifest says"):
        H5ShardDataset(out)
    assert "train-00000-of-00002.h5" in verify(out)
    reseal_size = lambda d: d["splits"]["train"]["shards"][0].update(
        bytes=os.path.getsize(shard))
    edit_manifest(out, reseal_size)  # size now agrees: HDF5 itself must object
    with pytest.raises(DataError, match="00000-of-00002.h5: does not open as HDF5"):
        read_all(out)
    assert "does not open as HDF5" in verify(out)


def test_corrupted_compressed_chunk(tmp_path):
    out, shard = make(tmp_path, compression="gzip")
    dh.corrupt_chunk(shard, "x", 1, skip=4)  # rows 8..15
    with pytest.raises(DataError, match=r"00000-of-00002.h5: field 'x', rows 8..15 .*"
                                        r"(do not read|checksum differs)"):
        read_all(out)
    assert "field 'x' rows 8..15" in verify(out)


def test_corrupted_uncompressed_value_is_caught_by_checksum(tmp_path):
    out, shard = make(tmp_path, compression="none")
    dh.corrupt_chunk(shard, "x", 2, skip=5, count=1)  # rows 16..19 (the shard has 20)
    with pytest.raises(DataError, match=r"field 'x', rows 16..19 \(samples 16..19 of split "
                                        r"'train'\): checksum differs"):
        read_all(out)
    assert "field 'x' rows 16..19: checksum differs" in verify(out)


def test_corrupted_shard_in_a_dataloader_worker(tmp_path):
    out, shard = make(tmp_path, compression="none")
    dh.corrupt_chunk(shard, "y", 0, count=8)
    loader = iter(DataLoader(H5ShardDataset(out), batch_size=8, num_workers=2,
                             collate_fn=collate))
    try:
        with pytest.raises(DataError, match=r"00000-of-00002.h5: field 'y', rows 0..7"):
            list(loader)
    finally:
        # torch's own clean-up of the workers, now: left to the garbage collector
        # after a worker's exception it waits 5 s per worker
        loader._shutdown_workers()


def test_manifest_disagrees_with_files(tmp_path):
    out, _ = make(tmp_path)

    def more_rows(d):
        d["splits"]["train"]["shards"][0]["num_samples"] += 1
        d["splits"]["train"]["num_samples"] += 1
    edit_manifest(out, more_rows)
    with pytest.raises(DataError, match="field 'x' has 20 rows, the manifest says 21"):
        read_all(out)
    assert "field 'x' has 20 rows, the manifest says 21" in verify(out)
    out2, _ = make(tmp_path / "b")
    edit_manifest(out2, lambda d: d.update(sample_shape=[12]))
    with pytest.raises(DataError, match=r"holds uint8 \(3, 4\) samples, the manifest says"):
        read_all(out2)
    edit_manifest(out2, lambda d: d["splits"]["train"].update(num_samples=7))
    with pytest.raises(DataError, match="shards hold 40 samples, the split says 7"):
        H5ShardDataset(out2)


# ---------------------------------------------------------------- labels
def test_source_labels_out_of_range(tmp_path):
    x = dh.pattern(10, (2,))
    np.savez(tmp_path / "neg.npz", x=x, y=np.array([0, 1, 2, -1, 0, 1, 2, 0, 1, 2]))
    with pytest.raises(DataError, match="label at index 3 is -1"):
        dh.write(str(tmp_path / "neg.npz"), tmp_path / "o1")
    np.savez(tmp_path / "big.npz", x=x, y=np.arange(10) % 4)
    with pytest.raises(DataError, match=r"label at index 3 is 3, outside 0..2"):
        dh.write(str(tmp_path / "big.npz"), tmp_path / "o2", class_names=["a", "b", "c"])
    np.savez(tmp_path / "short.npz", x=x, y=np.arange(9) % 3)
    with pytest.raises(DataError, match="10 samples but 9 labels"):
        dh.write(str(tmp_path / "short.npz"), tmp_path / "o3")
    np.savez(tmp_path / "keys.npz", data=x, target=np.arange(10) % 3)
    with pytest.raises(DataError, match="has arrays data, target; name the samples x"):
        dh.write(str(tmp_path / "keys.npz"), tmp_path / "o4")


def test_shard_label_out_of_range(tmp_path):
    out, shard = make(tmp_path)
    with h5py.File(shard, "r+") as f:
        f["y"][13] = 9
    edit_manifest(out, lambda d: d["splits"]["train"]["shards"][0].update(
        bytes=os.path.getsize(shard)))  # HDF5 may grow the file on an edit
    with pytest.raises(DataError, match="checksum differs"):  # an edit is corruption
        read_all(out)
    reseal(out, os.path.basename(shard))  # a manifest that agrees: the range check
    with pytest.raises(DataError, match=r"00000-of-00002.h5: label 9 at row 13 \(sample 13 "
                                        r"of split 'train'\) is outside 0..4"):
        read_all(out)
    assert "field 'y' row 13: label 9 is outside 0..4" in verify(out)


# ---------------------------------------------------------------- images
def test_source_image_does_not_decode(tmp_path):
    files = dh.make_images(tmp_path / "imgs")
    with open(files[4][0], "r+b") as f:
        f.truncate(30)  # a PNG cut short
    with pytest.raises(DataError, match=r"dog/img_1.png \(sample 4 of .*\): image does not "
                                        r"decode"):
        dh.write(str(tmp_path / "imgs"), tmp_path / "out")
    assert not os.path.exists(tmp_path / "out" / "manifest.json")


def test_mixed_sizes_cannot_be_decoded_to_arrays(tmp_path):
    dh.make_images(tmp_path / "imgs", sizes=[(6, 5), (4, 7)])
    with pytest.raises(DataError, match=r"--decode needs images of one size: .* is 4x7, .* is "
                                        r"6x5"):
        dh.write(str(tmp_path / "imgs"), tmp_path / "out", decode=True)


def test_stored_image_does_not_decode(tmp_path):
    dh.make_images(tmp_path / "imgs")
    out = str(tmp_path / "out")
    dh.write(str(tmp_path / "imgs"), out, shards=1)
    shard = os.path.join(out, "train-00000-of-00001.h5")
    with h5py.File(shard, "r+") as f:
        garbage = np.frombuffer(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, dtype=np.uint8)
        fs = f["x"].id.get_space()
        fs.select_hyperslab((5,), (1,))
        data = np.empty(1, dtype=h5py.vlen_dtype(np.uint8))
        data[0] = garbage
        f["x"].id.write(h5py.h5s.create_simple((1,)), fs, data)
    edit_manifest(out, lambda d: d["splits"]["train"]["shards"][0].update(
        bytes=os.path.getsize(shard)))
    with h5py.File(shard, "r") as f:
        sums = {k: block_digests(f[k][:], json.load(open(os.path.join(out, "manifest.json")))
                                 ["chunk_rows"]) for k in ("x", "y", "source_index")}
    edit_manifest(out, lambda d: d["splits"]["train"]["shards"][0].update(checksums=sums))
    ds = H5ShardDataset(out)
    ds[4]
    with pytest.raises(DataError, match=r"00000-of-00001.h5: row 5 \(sample 5 of split "
                                        r"'train'\): image does not decode"):
        ds[5]
    assert "field 'x' row 5: image does not decode" in verify(out)
