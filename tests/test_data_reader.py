"""test_data_reader.py - H5ShardDataset, the batch path and collate, the
DataLoader with worker processes, DistributedShardSampler against torch's
DistributedSampler and its own rules, the chunk cache, node-local staging and
feature statistics, all in one process (multi-rank runs: test_data_mpi.py)."""
import os
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

import data_helpers as dh
from hpcdl.data import DistributedShardSampler, H5ShardDataset, collate, stage_shards
from hpcdl.data import dataset as dataset_module
from hpcdl.data.cache import ChunkCache


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """103 samples of (3, 4) uint8 in 3 shards, chunks of 8 rows; the source arrays."""
    d = tmp_path_factory.mktemp("reader")
    src = dh.make_npz(d / "a.npz", n=103, shape=(3, 4), classes=5,
                      class_names=np.array(list("abcde")))
    dh.write(str(d / "a.npz"), d / "out", shards=3, chunk_rows=8)
    return str(d / "out"), src["x"], src["y"]


def truth(ds, x, y, indices):
    """What samples `indices` of ds must be: the source rows they came from."""
    s = ds.read_field("source_index")[np.asarray(indices)]
    return x[s].astype(np.float32), y[s]


def test_attributes_and_getitem(shards):
    out, x, y = shards
    ds = H5ShardDataset(out)
    assert len(ds) == 103 and ds.num_classes == 5 and ds.class_names == list("abcde")
    assert ds.sample_shape == (3, 4)
    want_x, want_y = truth(ds, x, y, range(103))
    for i in (0, 7, 8, 34, 35, 102, -1):
        t, label = ds[i]
        assert t.dtype == torch.float32 and t.shape == (3, 4) and isinstance(label, int)
        assert np.array_equal(t.numpy(), want_x[i]) and label == want_y[i]
    with pytest.raises(IndexError, match="out of range"):
        ds[103]


def test_batch_path_equals_items_and_pickles(shards, monkeypatch):
    out, x, y = shards
    ds = H5ShardDataset(out)
    idx = [50, 3, 99, 3, 0, 71, 8, 9]  # several shards and chunks, a repeat
    xb, yb = collate(ds.__getitems__(idx))
    want_x, want_y = truth(ds, x, y, idx)
    assert xb.dtype == torch.float32 and yb.dtype == torch.int64
    assert np.array_equal(xb.numpy(), want_x) and np.array_equal(yb.numpy(), want_y)
    # the default collate reads the same batch as a sequence of samples
    dx, dy = torch.utils.data.default_collate(ds.__getitems__(idx))
    assert torch.equal(dx, xb) and torch.equal(dy, yb)
    batch = ds.__getitems__(idx)
    assert batch.x.dtype == np.uint8  # stored dtype until it arrives
    for limit in (1 << 20, 0):  # through the pipe as numpy bytes, or as a shared tensor
        monkeypatch.setattr(dataset_module, "WIRE_PIPE_MAX_BYTES", limit)
        bx, by = pickle.loads(pickle.dumps(dataset_module._WireBatch(batch.x, batch.y)))
        assert torch.equal(bx, xb) and torch.equal(by, yb)


def test_each_chunk_read_once_per_batch(shards):
    out, _, _ = shards
    ds = H5ShardDataset(out)
    chunks = {(int(s), int(r) // 8) for s, r in zip(*ds.locate(range(0, 40)))}
    ds.__getitems__(list(range(40))[::-1])
    assert ds._cache.misses == len(chunks)
    ds.__getitems__(list(range(40)))
    assert ds._cache.misses == len(chunks) and ds._cache.hits >= len(chunks)


@pytest.mark.parametrize("use_collate", [True, False])
def test_dataloader_two_workers_reads_every_sample_once(shards, use_collate):
    out, x, y = shards
    ds = H5ShardDataset(out)
    ds[0]  # files opened in the parent first: workers must open their own
    sampler = DistributedShardSampler(ds, num_replicas=1, rank=0, seed=4)
    kw = {"collate_fn": collate} if use_collate else {}
    loader = DataLoader(ds, batch_size=10, sampler=sampler, num_workers=2, **kw)
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        order = list(sampler)
        xs, ys = zip(*[(a.numpy(), b.numpy()) for a, b in loader])
        want_x, want_y = truth(ds, x, y, order)
        assert np.array_equal(np.concatenate(xs), want_x)
        assert np.array_equal(np.concatenate(ys), want_y)
        assert sorted(order) == list(range(103))


def test_transform_applies_to_each_sample(shards):
    out, x, y = shards
    ds = H5ShardDataset(out, transform=lambda t: t * 2 + 1)
    want_x, _ = truth(ds, x, y, [5, 60])
    xb, _ = collate(ds.__getitems__([5, 60]))
    assert np.array_equal(xb.numpy(), want_x * 2 + 1)
    assert np.array_equal(ds[60][0].numpy(), want_x[1] * 2 + 1)


def test_feature_stats(shards):
    out, x, y = shards
    mean, std = H5ShardDataset(out).feature_stats()
    xf = x.astype(np.float64)
    want_std = xf.std(0)
    want_std[want_std == 0] = 1
    assert np.allclose(mean, xf.mean(0)) and np.allclose(std, want_std)


# ---------------------------------------------------------------- sampler
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 33])
@pytest.mark.parametrize("drop_last", [False, True])
def test_sampler_is_torch_distributed_sampler(n, drop_last):
    data = list(range(n))
    for replicas in (1, 2, 3, 4, 8):
        for rank in range(replicas):
            for shuffle in (False, True):
                ours = DistributedShardSampler(data, replicas, rank, shuffle, 7, drop_last)
                theirs = DistributedSampler(data, replicas, rank, shuffle, 7, drop_last)
                for epoch in (0, 3):
                    ours.set_epoch(epoch)
                    theirs.set_epoch(epoch)
                    assert list(ours) == list(theirs) and len(ours) == len(theirs)


def rank_lists(ds, replicas, epoch=0, **kw):
    out = []
    for r in range(replicas):
        s = DistributedShardSampler(ds, replicas, r, **kw)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


def check_partition(parts, n, drop_last):
    """Equal counts; disjoint; union = all (padding only repeats samples)."""
    counts = {len(p) for p in parts}
    assert len(counts) == 1
    flat = [i for p in parts for i in p]
    if drop_last:
        assert len(set(flat)) == len(flat) and len(flat) == n - n % len(parts)
    else:
        assert set(flat) == set(range(n)) and len(flat) - n == (-n) % len(parts)


@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("window", [0, 1, 3])
def test_sampler_partition_rules(shards, replicas, drop_last, window):
    ds = H5ShardDataset(shards[0])
    for epoch in (0, 1):
        parts = rank_lists(ds, replicas, epoch, drop_last=drop_last, chunk_window=window)
        check_partition(parts, len(ds), drop_last)
    a = rank_lists(ds, replicas, 0, chunk_window=window)
    assert a == rank_lists(ds, replicas, 0, chunk_window=window)  # reproducible
    assert a != rank_lists(ds, replicas, 1, chunk_window=window)  # new order per epoch


def test_sampler_small_dataset_fewer_samples_than_ranks():
    for n, replicas in ((1, 4), (3, 4), (5, 8)):
        parts = rank_lists(list(range(n)), replicas)
        check_partition(parts, n, False)
        assert all(len(p) == 1 for p in parts)
        assert rank_lists(list(range(n)), replicas, drop_last=True) == [[]] * replicas


def test_grouped_sampler_touches_few_chunks(shards):
    ds = H5ShardDataset(shards[0])
    spans = ds.chunk_spans()
    chunk_of = np.repeat(np.arange(len(spans)), spans[:, 1] - spans[:, 0])
    for replicas in (2, 3):
        grouped = [set(chunk_of[p]) for p in rank_lists(ds, replicas, 5, chunk_window=2)]
        plain = [set(chunk_of[p]) for p in rank_lists(ds, replicas, 5)]
        # ranks hold runs of whole chunks: only a boundary (or a padding repeat) is shared
        pad = (-len(ds)) % replicas
        assert sum(map(len, grouped)) <= len(spans) + (replicas - 1) + pad
        assert all(len(g) < len(p) for g, p in zip(grouped, plain))
        for part in rank_lists(ds, replicas, 5, chunk_window=2):
            # each window of 2 chunks' samples spans at most 3 chunks of the run
            for lo in range(0, len(part), 2 * ds.chunk_rows):
                window = chunk_of[part[lo:lo + 2 * ds.chunk_rows]]
                assert len(set(window)) <= 2 + 1 + int(np.sum(spans[:, 1] - spans[:, 0] < 8))


def test_sampler_rejects():
    with pytest.raises(ValueError, match="rank 2 is not in"):
        DistributedShardSampler(list(range(5)), num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="empty"):
        DistributedShardSampler([], num_replicas=1, rank=0)
    with pytest.raises(TypeError, match="chunk_spans"):
        DistributedShardSampler(list(range(5)), 1, 0, chunk_window=2)


# ---------------------------------------------------------------- caches
def test_chunk_cache_lru_within_bytes():
    cache = ChunkCache(max_bytes=100)
    loads = []

    def loader(key, nbytes):
        return lambda: (loads.append(key) or key, nbytes)
    for key in "abc":
        cache.get(key, loader(key, 40))  # c pushes a out (120 > 100)
    assert cache.nbytes == 80 and loads == list("abc")
    assert cache.get("b", loader("b", 40)) == "b" and loads == list("abc")
    cache.get("a", loader("a", 40))     # reloaded; evicts c (b was used more recently)
    assert loads == list("abca") and cache.get("b", loader("b", 40)) == "b"
    cache.get("big", loader("big", 500))  # larger than the cache: not kept
    assert cache.nbytes <= 100


def test_stage_copies_once_and_refreshes_stale_files(shards, tmp_path, capfd):
    out, x, y = shards
    staged = stage_shards(out, str(tmp_path / "local"), splits=("train",))
    assert "copied 3 of 3" in capfd.readouterr().err
    files = sorted(f for f in os.listdir(staged) if f.endswith(".h5"))
    mtimes = [os.stat(os.path.join(staged, f)).st_mtime_ns for f in files]
    assert stage_shards(out, str(tmp_path / "local")) == staged
    assert "were there already" in capfd.readouterr().err
    assert mtimes == [os.stat(os.path.join(staged, f)).st_mtime_ns for f in files]
    with open(os.path.join(staged, files[1]), "ab") as f:  # a damaged staged copy
        f.write(b"junk")
    ds = H5ShardDataset(out, stage_to=str(tmp_path / "local"))
    assert "copied 1 of 3" in capfd.readouterr().err and ds.directory == staged
    want_x, want_y = truth(ds, x, y, range(len(ds)))
    xb, yb = collate(ds.__getitems__(list(range(len(ds)))))
    assert np.array_equal(xb.numpy(), want_x) and np.array_equal(yb.numpy(), want_y)
