"""test_mnist1d.py - MNIST-1D generated here (hpcdl/data/mnist1d.py): the spec
and its bad values, the chunks against the package's own make_dataset, the
disk cache (read back, not regenerated; grown, not redone; a corrupt file made
again; one generator at a time), the cnn1d model, and `hpcdl train` /
`hpcdl data shard` end to end. Small N throughout: a chunk of 5,000 samples
costs about a second of CPU."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from hpcdl.cli import main as cli_main
from hpcdl.data import DataError
from hpcdl.data import mnist1d as m
from hpcdl.train import data
from hpcdl.train.config import ConfigError, TrainConfig
from mpi_harness import REPO, mpi_env, run_mpi

HPCDL = [sys.executable, "-m", "hpcdl"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache of our own, and a count of the chunks make_chunk made."""
    monkeypatch.setenv("HPCDL_CACHE", str(tmp_path / "cache"))
    made = []
    real = m.make_chunk

    def counting(split, i):
        made.append((split, i))
        return real(split, i)
    monkeypatch.setattr(m, "make_chunk", counting)
    return made


def _silent(line):
    pass


# ---------------------------------------------------------------- the spec
@pytest.mark.parametrize("spec,n", [("mnist1d", m.DEFAULT_N), ("mnist1d:4000", 4000),
                                    ("mnist1d:200k", 200_000), ("mnist1d:2M", 2_000_000),
                                    ("mnist1d:1_000", 1000), ("digits", None),
                                    ("mnist1dx", None)])
def test_spec_gives_the_sample_count(spec, n):
    assert m.parse(spec) == n


def test_split_sizes_keep_one_fixed_test_set_from_200k_on():
    assert m.split_sizes(4000) == (3200, 800)
    assert m.split_sizes(200_000) == (160_000, 40_000)
    assert m.split_sizes(1_000_000) == (960_000, 40_000)
    assert m.split_sizes(m.DEFAULT_N)[0] // 8192 >= 100  # 128 x batch 64: 100+ steps an epoch
    assert m.chunks_of(4000) == {"train": 1, "test": 1}
    assert m.chunks_of(1_000_000) == {"train": 192, "test": 8}


@pytest.mark.parametrize("changes,message", [
    (dict(data="mnist1d:abc"), "--data mnist1d:abc: N must be a whole number of samples"),
    (dict(data="mnist1d:"), "--data mnist1d:: N must be a whole number"),
    (dict(data="mnist1d:-5"), "--data mnist1d:-5: N must be a whole number"),
    (dict(data="mnist1d:1e6"), "--data mnist1d:1e6: N must be a whole number"),
    (dict(data="mnist1d:999"), "--data mnist1d:999: N is 999; give between 1000 and"),
    (dict(data="mnist1d:60M"), "N is 60000000; give between 1000 and 50000000"),
    (dict(data="mnist1d:4000", model="resnet18"), "--model resnet18 takes images; use "
                                                  "--model mlp or cnn1d"),
    (dict(data="synthetic:3x8x8:10:100", model="cnn1d"), "cnn1d takes sequences"),
])
def test_bad_specs_are_one_line_config_errors(changes, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        TrainConfig(**changes).check(size=2)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("models", ["mlp", "cnn1d"])
def test_good_specs_pass_the_check_without_generating(models, cache):
    TrainConfig(data="mnist1d:4000", model=models).check(size=2)
    TrainConfig(data="mnist1d", model=models).check(size=2)
    assert cache == [] and not os.path.exists(m.cache_root())


def test_bad_spec_fails_before_launching_in_one_line(capsys, monkeypatch, cache):
    monkeypatch.setattr("hpcdl.cli.run.launch", lambda *a, **k: pytest.fail("launched"))
    monkeypatch.setattr("hpcdl.cli.run.inside_parallel_job", lambda: False)
    assert cli_main.main(["train", "-n", "2", "--data", "mnist1d:12x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--data mnist1d:12x: N must be a whole number" in err[0], err
    assert cache == []


# ---------------------------------------------------------------- the generator
def test_a_chunk_is_make_dataset_with_its_seed_and_leaves_numpy_seeding_alone():
    import mnist1d.data
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    x, y = m.make_chunk("test", 0)
    assert (np.random.get_state()[1] == before).all()
    args = mnist1d.data.get_dataset_args()
    args.num_samples, args.seed, args.train_split = m.CHUNK, 1, 1.0  # test chunk 0: seed 1
    ref = mnist1d.data.make_dataset(args)
    assert x.dtype == np.float32 and x.shape == (m.CHUNK, m.LENGTH) and y.dtype == np.int64
    np.testing.assert_array_equal(x, ref["x"].astype(np.float32))
    np.testing.assert_array_equal(y, ref["y"])
    assert (np.bincount(y, minlength=10) == m.CHUNK // 10).all()  # 500 of each digit


def test_second_load_reads_the_cache_and_larger_n_adds_only_its_chunks(cache):
    first = m.load(2000, workers=1, log=_silent)
    assert sorted(cache) == [("test", 0), ("train", 0)]
    folder = m.directory()
    assert folder.startswith(m.cache_root()) and m.cache_root().endswith("mnist1d")
    files = sorted(os.listdir(folder))
    assert files == [".lock", "test-00000.npz", "train-00000.npz"]  # no temporary left
    stamps = {f: os.stat(os.path.join(folder, f)).st_mtime_ns for f in files}
    again = m.load(2000, workers=1, log=_silent)
    assert len(cache) == 2  # nothing generated
    assert {f: os.stat(os.path.join(folder, f)).st_mtime_ns for f in files} == stamps
    for k in first:
        np.testing.assert_array_equal(first[k], again[k])
    assert first["x_train"].shape == (1600, 40) and first["x_test"].shape == (400, 40)
    # N = 8000: 6400 to train (2 chunks), 1600 to test (the same 1 chunk)
    big = m.load(8000, workers=1, log=_silent)
    assert sorted(cache) == [("test", 0), ("train", 0), ("train", 1)]
    assert big["x_train"].shape == (6400, 40) and big["x_test"].shape == (1600, 40)
    np.testing.assert_array_equal(big["x_train"][:1600], first["x_train"])  # a prefix
    np.testing.assert_array_equal(big["y_test"][:400], first["y_test"])
    assert not np.array_equal(big["x_train"][1600:3200], first["x_train"])
    # the two seed streams share no sample
    train_rows = {r.tobytes() for r in big["x_train"]}
    assert not any(r.tobytes() in train_rows for r in big["x_test"])


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "wrong shape"])
def test_a_corrupt_cache_file_is_generated_again_with_a_warning(cache, damage):
    good = m.load(2000, workers=1, log=_silent)
    path = m.chunk_path(m.directory(), "train", 0)
    raw = bytearray(open(path, "rb").read())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0xFF  # inside x's values: the zip's CRC-32 catches it
    elif damage == "truncate":
        raw = raw[:len(raw) // 3]
    elif damage == "garbage":
        raw = b"not a chunk"
    if damage == "wrong shape":
        np.savez(path, x=np.zeros((10, 40), np.float32), y=np.zeros(10, np.int64))
    else:
        open(path, "wb").write(bytes(raw))
    lines = []
    again = m.load(2000, workers=1, log=lines.append)
    assert cache.count(("train", 0)) == 2 and cache.count(("test", 0)) == 1
    warned = [l for l in lines if "cache file %s" % path in l and "generating it again" in l]
    assert len(warned) == 1, lines
    for k in good:
        np.testing.assert_array_equal(good[k], again[k])


def test_an_unwritable_cache_is_a_clear_error(tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("HPCDL_CACHE", str(tmp_path / "a_file" / "cache"))
    with pytest.raises(DataError, match="cannot write the MNIST-1D cache in .*set HPCDL_CACHE"):
        m.load(2000, workers=1, log=_silent)
    with pytest.raises(ConfigError, match="set HPCDL_CACHE"):
        data.prepare("mnist1d:2000")


def test_worker_processes_write_the_same_chunks(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCDL_CACHE", str(tmp_path / "one"))
    one = m.load(2000, workers=1, log=_silent)
    monkeypatch.setenv("HPCDL_CACHE", str(tmp_path / "two"))
    lines = []
    assert m.ensure(2000, workers=2, log=lines.append) == 2
    assert "with 2 process(es)" in lines[0] and "2/2 chunks (100%)" in lines[-1], lines
    two = m.load(2000, workers=2, log=_silent)
    for k in one:
        np.testing.assert_array_equal(one[k], two[k])


def test_processes_that_start_together_generate_each_chunk_once(tmp_path):
    code = ("import sys; from hpcdl.data import mnist1d as m; "
            "print('made', m.ensure(2000, workers=1, log=lambda s: None))")
    env = mpi_env({"HPCDL_CACHE": str(tmp_path)})
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env=env, cwd=REPO) for _ in range(3)]
    made = [int(p.communicate(timeout=120)[0].split()[-1]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert sum(made) == 2, made  # the lock: one made both chunks, the others read them


def test_trainer_data_is_standardised_per_feature_and_ignores_the_seed(cache):
    ds = data.load("mnist1d:2000", seed=0)
    other = data.load("mnist1d:2000", seed=7, test_fraction=0.5)
    assert (ds.n_train, ds.n_test, ds.num_classes, ds.sample_shape) == (1600, 400, 10, (40,))
    assert ds.image_shape is None and str(ds.x_train.dtype) == "torch.float32"
    x = ds.x_train.double().numpy()
    np.testing.assert_allclose(x.mean(axis=0), 0, atol=1e-6)
    np.testing.assert_allclose(x.std(axis=0), 1, rtol=1e-5)
    assert (ds.x_train == other.x_train).all() and (ds.y_test == other.y_test).all()
    raw = m.load(2000, log=_silent)  # by the training set's statistics only
    mean, std = raw["x_train"].mean(0, dtype=np.float64), raw["x_train"].std(0, dtype=np.float64)
    np.testing.assert_allclose(ds.x_test.numpy(), (raw["x_test"] - mean) / std, atol=1e-5)


# ---------------------------------------------------------------- cnn1d
def test_cnn1d_has_the_baselines_shape_and_parameter_count():
    import torch
    from hpcdl import models
    net = models.build("cnn1d", 40, 10)
    convs = [mod for mod in net.modules() if isinstance(mod, torch.nn.Conv1d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size[0], c.stride[0], c.padding[0])
            for c in convs] == [(1, 25, 5, 2, 1), (25, 25, 3, 2, 1), (25, 25, 3, 2, 1)]
    assert (net.head.in_features, net.head.out_features) == (125, 10)  # 25 channels x 5
    # 25*5+25 + 2*(25*25*3+25) + 125*10+10, by hand
    assert sum(p.numel() for p in net.parameters()) == 150 + 1900 + 1900 + 1260 == 5210
    # L = 64: 64 -> 31 -> 16 -> 8, head 200 x 10 + 10
    assert sum(p.numel() for p in models.build("cnn1d", 64, 10).parameters()) == 5960


@pytest.mark.parametrize("batch", [0, 1, 7])
def test_cnn1d_forward_shapes(batch):
    import torch
    from hpcdl import models
    torch.manual_seed(0)
    net = models.build("cnn1d", 40, 10)
    x = torch.randn(batch, 40)
    flat, channel = net(x), net(x.unsqueeze(1))
    assert flat.shape == channel.shape == (batch, 10)
    assert torch.equal(flat, channel)
    assert models.build("cnn1d", 3, 4)(torch.randn(2, 3)).shape == (2, 4)


def test_cnn1d_refuses_images_and_too_short_sequences():
    from hpcdl import models
    with pytest.raises(ValueError, match="cnn1d takes sequences"):
        models.build("cnn1d", (3, 32, 32), 10)
    with pytest.raises(ValueError, match="sequences of 2 values are too short"):
        models.build("cnn1d", 2, 10)


# ---------------------------------------------------------------- end to end
@pytest.mark.mpi
def test_train_two_ranks_generates_once_and_learns(tmp_path):
    out = tmp_path / "run"
    cmd = HPCDL + ["train", "-n", "2", "--data", "mnist1d:4000", "--model", "cnn1d",
                   "--epochs", "2", "--global-batch", "64", "--out", str(out)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       env=mpi_env({"HPCDL_CACHE": str(tmp_path / "cache")}), cwd=REPO,
                       timeout=300)
    assert r.returncode == 0, r.stdout
    assert r.stdout.count("generating 2 chunk(s)") == 1, r.stdout  # by the launcher only
    assert "cnn1d on mnist1d:4000 (3200 train / 800 test), 2 rank(s)" in r.stdout, r.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["test_accuracy"] > 0.3, summary  # chance: 0.1
    # again: the ranks read the cache; nothing is generated
    r = subprocess.run(cmd[:-2] + ["--epochs", "1"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300, cwd=REPO,
                       env=mpi_env({"HPCDL_CACHE": str(tmp_path / "cache")}))
    assert r.returncode == 0 and "generating" not in r.stdout, r.stdout


@pytest.mark.mpi
def test_shards_of_mnist1d_hold_the_cached_arrays_and_train(tmp_path, monkeypatch):
    import h5py
    monkeypatch.setenv("HPCDL_CACHE", str(tmp_path / "cache"))  # the ranks' too (mpi_env)
    shards = tmp_path / "shards"
    r = run_mpi(1, HPCDL + ["data", "shard", "mnist1d:4000", "--out", str(shards),
                            "--shards", "2"], timeout=180)
    assert r.returncode == 0, r.stdout
    assert "train: 2 shards, 3200 samples; val: 2 shards, 800 samples" in r.stdout, r.stdout
    manifest = json.loads((shards / "manifest.json").read_text())
    assert manifest["sample_shape"] == [40] and manifest["dtype"] == "float32", manifest
    assert manifest["source"].startswith("MNIST-1D, 4000 samples"), manifest
    ref = m.load(4000, log=_silent)  # from the cache the shard command made
    for split, key in (("train", "train"), ("val", "test")):
        x, y = np.empty_like(ref["x_" + key]), np.empty_like(ref["y_" + key])
        for name in sorted(os.listdir(shards)):
            if name.startswith(split + "-"):
                with h5py.File(shards / name, "r") as f:
                    idx = f["source_index"][:]
                    x[idx], y[idx] = f["x"][:], f["y"][:]
        np.testing.assert_array_equal(x, ref["x_" + key])
        np.testing.assert_array_equal(y, ref["y_" + key])
    out = tmp_path / "run"
    r = run_mpi(2, HPCDL + ["train", "--data", str(shards), "--model", "cnn1d", "--epochs", "2",
                            "--global-batch", "64", "--workers", "0", "--out", str(out)],
                timeout=180)
    assert r.returncode == 0, r.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["test_accuracy"] > 0.3, summary


@pytest.mark.mpi
def test_ranks_generate_a_missing_cache_themselves(tmp_path):
    """Inside MPI ranks (a script or tutorial started by mpirun, not by
    `hpcdl train -n`), one rank generates the missing chunks in-process while
    the other waits on the lock; a process pool there failed to start under
    Open MPI (BrokenProcessPool). Both ranks then hold the same arrays."""
    src = ("import hashlib; from hpcdl import comm; from hpcdl.data import mnist1d as m; "
           "comm.init(); d = m.load(10000); "
           "h = hashlib.sha256(d['x_train'].tobytes() + d['x_test'].tobytes()).hexdigest(); "
           "print('digest', comm.rank(), h, d['x_train'].shape[0], m.default_workers())")
    r = run_mpi(2, [sys.executable, "-c", src], timeout=180,
                env={"HPCDL_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stdout[-3000:]
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("digest")]
    assert sorted(int(x[1]) for x in rows) == [0, 1], r.stdout[-3000:]
    assert len({x[2] for x in rows}) == 1 and {x[3] for x in rows} == {"8000"}
    assert {x[4] for x in rows} == {"1"}  # in-process inside a rank
