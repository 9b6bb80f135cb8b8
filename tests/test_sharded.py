"""test_sharded.py - hpcdl/checkpoint/files.py, the one on-disk checkpoint
format, in one process (the ranks' files written one after another): a save
reads back exactly; a bad manifest, a missing or damaged rank file, a file
of another save and a manifest of another kind are each refused with one
line naming the file; a save without its manifest is passed over by latest()."""
import json
import os

import pytest
import torch

from hpcdl.checkpoint import files as sharded


def _save(directory, ranks, save="s1", kind="test"):
    entries = [sharded.write_shard(str(directory), r, ranks, save,
                                   {"w": torch.arange(10.0) * (r + 1), "note": "rank%d" % r})
               for r in range(ranks)]
    return sharded.write_manifest(str(directory), kind, save, entries, extra_field=7)


def _refused(message, fn):
    with pytest.raises(ValueError) as e:
        fn()
    text = str(e.value)
    assert "\n" not in text and message in text, text
    return text


def test_save_reads_back_and_records_sizes_and_checksums(tmp_path):
    m = _save(tmp_path, 3)
    got = sharded.read_manifest(str(tmp_path), kind="test")
    assert got == m and got["extra_field"] == 7 and got["format"] == sharded.FORMAT
    assert got["files"] == [sharded.shard_file(r, 3) for r in range(3)]
    for r in range(3):
        part = sharded.read_shard(str(tmp_path), got, r)
        assert torch.equal(part["w"], torch.arange(10.0) * (r + 1)) and part["note"] == "rank%d" % r
        assert (part["rank"], part["ranks"], part["save"]) == (r, 3, "s1")
    assert sorted(os.listdir(tmp_path)) == sorted(got["files"] + [sharded.MANIFEST])


def test_refusals_are_one_line_and_name_the_file(tmp_path):
    d = tmp_path / "ck"
    _save(d, 2)
    m = sharded.read_manifest(str(d))
    _refused("is a test checkpoint, not a elastic one",
             lambda: sharded.read_manifest(str(d), kind="elastic"))
    f1 = d / sharded.shard_file(1, 2)
    good = f1.read_bytes()
    f1.write_bytes(good[:100])
    _refused("%s cannot be read (damaged or cut short? size: 100 bytes" % f1.name,
             lambda: sharded.read_shard(str(d), m, 1))
    f1.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    _refused("its sha256 differs from the manifest's", lambda: sharded.read_shard(str(d), m, 1))
    f1.write_bytes(good)
    other = tmp_path / "other"
    _save(other, 2, save="s2")
    os.replace(other / f1.name, f1)  # a file of another save
    _refused("holds rank 1 of 2 of save s2, the manifest expects rank 1 of 2 of save s1",
             lambda: sharded.read_shard(str(d), sharded.read_manifest(str(d)), 1))
    f1.unlink()
    _refused("is missing rank file(s) %s of 2" % f1.name, lambda: sharded.read_manifest(str(d)))
    man = d / sharded.MANIFEST
    man.write_text("{not json")
    _refused("%s cannot be read (" % man, lambda: sharded.read_manifest(str(d)))
    man.write_text(json.dumps({"format": 99, "files": [], "ranks": 0}))
    _refused("is not a sharded checkpoint manifest (format 99", lambda: sharded.read_manifest(str(d)))
    man.unlink()
    _refused("has no manifest.json: not a sharded checkpoint, or its save did not finish",
             lambda: sharded.read_manifest(str(d)))


def test_format_1_manifest_without_checksums_reads(tmp_path):
    _save(tmp_path, 2)
    man = tmp_path / sharded.MANIFEST
    m = json.loads(man.read_text())
    for key in ("kind", "bytes", "sha256"):
        del m[key]
    man.write_text(json.dumps(dict(m, format=1)))
    m = sharded.read_manifest(str(tmp_path), kind="test")
    assert torch.equal(sharded.read_shard(str(tmp_path), m, 1)["w"], torch.arange(10.0) * 2)


def test_latest_skips_a_save_without_manifest_and_prune_keeps_one(tmp_path):
    assert sharded.latest(str(tmp_path), "c") is None
    first = tmp_path / sharded.new_dir_name("c")
    _save(first, 1)
    cut = tmp_path / sharded.new_dir_name("c")  # newer, but cut short before its manifest
    sharded.write_shard(str(cut), 0, 1, "s9", {"w": torch.zeros(1)})
    assert sharded.latest(str(tmp_path), "c") == str(first)
    assert sharded.latest(str(tmp_path), "d") is None
    second = tmp_path / sharded.new_dir_name("c")
    _save(second, 1)
    assert sharded.latest(str(tmp_path), "[cd]") == str(second)
    sharded.prune(str(tmp_path), "c", keep=second.name)
    assert os.listdir(tmp_path) == [second.name]


def test_write_failure_is_one_oserror(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OSError) as e:
        sharded.write_shard(str(blocker / "sub"), 0, 1, "s", {"w": torch.zeros(1)})
    assert "could not write" in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------- elastic commits
def test_elastic_commits_on_the_format(tmp_path, monkeypatch):
    from hpcdl.torch.elastic import _store
    monkeypatch.setenv("HPCDL_ELASTIC_DIR", str(tmp_path))
    assert _store.load() is None
    # a commit of the one-file format before this one still loads
    torch.save({"format": _store.LEGACY_FORMAT, "size": 3, "saved": {"step": 1}},
               tmp_path / _store.LEGACY_FILE)
    assert _store.load()["saved"] == {"step": 1}
    first = _store.save({"size": 2, "saved": {"step": 2, "obj": {1, 2}}})
    assert os.listdir(tmp_path) == [os.path.basename(first)]  # state.pt superseded
    assert _store.load() == {"size": 2, "saved": {"step": 2, "obj": {1, 2}}}
    second = _store.save({"size": 2, "saved": {"step": 3}})
    assert os.listdir(tmp_path) == [os.path.basename(second)]  # the older commit removed
    cut = tmp_path / sharded.new_dir_name(_store.PREFIX)  # a commit cut short
    sharded.write_shard(str(cut), 0, 1, "x", {"payload": {"size": 2, "saved": {"step": 4}}})
    assert _store.load()["saved"] == {"step": 3}
    f = os.path.join(second, sharded.shard_file(0, 1))
    with open(f, "r+b") as fh:
        fh.truncate(50)
    with pytest.raises(RuntimeError) as e:
        _store.load()
    assert "elastic: cannot read the last commit %s" % second in str(e.value)
    assert "\n" not in str(e.value) and "cut short? size: 50 bytes" in str(e.value)
