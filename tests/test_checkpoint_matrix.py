"""test_checkpoint_matrix.py - any --zero stage resumes any other on any
number of ranks (hpcdl/checkpoint/: each save re-sharded by parameter name).

The resume matrix: `hpcdl train` at --zero 0, 1, 2 and 3 on 2, 3 and 4
ranks each writes a checkpoint after epoch 1 (12 checkpoints); each is
resumed by each (stage, rank count) for epoch 2 (144 resumes) and compared
with that reader's uninterrupted 2-epoch run on this machine: bit for bit
where the sums cannot differ (the same stage and ranks, any stages on 2
ranks, stages 0 and 1 on the same ranks), else within 1e-5 relative (the
first epoch's gradients summed in another order; 2.8e-7 at worst when
written). All 168 runs in one 4-rank launch (each on a sub-communicator of
the job; tests/mpi_scripts/checkpoint_matrix.py), about 75 s on 2 cores.

Older checkpoints: tests/data/checkpoints-703d852 (written by 703d852's
hpcdl train on 2 ranks at --zero 0-3) and checkpoints-72df3c7 (--zero 0, 2,
3) are each resumed by every stage on 2 ranks in one launch: the resumes of
one set agree bit for bit, and with today's uninterrupted run within 1e-4
(their first epoch may come from another CPU).

The re-shard step alone, in one process (no MPI, so `make check` runs it):
Adam's state over two groups by name and back to torch's numbering; a 3-rank
cut joined by name; this rank's pieces of a 2-rank cut restored from it.
"""
import os

import pytest

from mpi_harness import run_python

SCRIPT = os.path.join(os.path.dirname(__file__), "mpi_scripts", "checkpoint_matrix.py")
DATA = os.path.join(os.path.dirname(__file__), "data")


@pytest.mark.mpi
@pytest.mark.slow
def test_every_stage_and_rank_count_resumes_every_other(tmp_path):
    r = run_python(4, SCRIPT, timeout=600, args=["matrix", str(tmp_path)])
    assert r.stdout.count("PAIR ") == 144 and "MATRIX OK" in r.stdout, r.stdout
    # exact(): 12 own checkpoints, 12 more on 2 ranks, stages 0 <-> 1 on 3 and on 4 ranks
    assert r.stdout.count(" exact") == 12 + 12 + 4, r.stdout


@pytest.mark.mpi
def test_older_checkpoints_resume_at_every_stage():
    sets = [os.path.join(DATA, d) for d in ("checkpoints-703d852", "checkpoints-72df3c7")]
    before = {d: _listing(d) for d in sets}
    r = run_python(2, SCRIPT, timeout=300, args=["older", *sets])
    assert r.stdout.count("PAIR ") == 4 * 4 + 3 * 4 and "MATRIX OK" in r.stdout, r.stdout
    assert {d: _listing(d) for d in sets} == before  # resumed without --checkpoint-dir


def _listing(directory):
    return sorted((root, sorted(files)) for root, _, files in os.walk(directory))


# ---------------------------------------------------------------- the re-shard step, one process
def _stepped_model():
    """Two layers, Adam over two groups, two steps: per-element moments and a 0-d step."""
    import torch
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.Adam([{"params": [model[0].weight, model[1].weight]},
                            {"params": [model[0].bias, model[1].bias], "lr": 0.05}], lr=0.01)
    for k in range(2):
        opt.zero_grad()
        model(torch.arange(6.0).view(2, 3) + k).pow(2).sum().backward()
        opt.step()
    return model, opt


def _cut(flat_by_name, names, ranks):
    """The parts and manifest of a save of one unit holding names' tensors,
    cut over ranks as ZeRO cuts a bucket (layout.py): each rank's pieces of
    the parameters and of their per-element state, the 0-d step whole."""
    import torch
    from hpcdl.torch.zero.layout import block_counts, pieces_of
    numels = [flat_by_name[n][0].numel() for n in names]
    counts = block_counts(sum(numels), ranks)
    parts = []
    for r in range(ranks):
        params, state = {}, {}
        for c in pieces_of(numels, counts, r):
            n = names[c.index]
            flat, st = flat_by_name[n]
            params[n] = flat[c.start:c.stop].clone()
            state[n] = {k: v.reshape(-1)[c.start:c.stop].clone() if v.dim() else v
                        for k, v in st.items()}
        parts.append({"params": params, "optimizer": {"state": state, "param_groups": None}})
    manifest = {"ranks": ranks, "units": [{"names": names, "numel": sum(numels),
                                           "counts": counts}],
                "params": [{"name": n, "shape": [flat_by_name[n][0].numel()]} for n in names]}
    return manifest, parts


def test_reshard_joins_any_cut_and_round_trips_torchs_numbering():
    # a whole model and torch optimizer dict -> by name -> torch's numbering
    # again: equal, tensors in their shapes, the 0-d step untouched; pieces of
    # a 3-rank cut joined by name equal the whole; cut again for 2 ranks, each
    # rank's piece and state are the whole's slices
    import torch
    from hpcdl.checkpoint import zero
    from hpcdl.checkpoint.reshard import Whole, optimizer_names, restore_pieces
    model, opt = _stepped_model()
    names = optimizer_names(model, opt)
    assert names == ["0.weight", "1.weight", "0.bias", "1.bias"]
    sd = opt.state_dict()
    whole = Whole.of_torch(model.state_dict(), sd, names)
    back = whole.torch_optimizer(names)
    assert [g["params"] for g in back["param_groups"]] == [[0, 1], [2, 3]]
    assert back["param_groups"][1]["lr"] == 0.05
    for i, st in sd["state"].items():
        for k, v in st.items():
            assert torch.equal(back["state"][i][k], v) and back["state"][i][k].shape == v.shape
    assert all(torch.equal(whole.model_state()[n], v) for n, v in model.state_dict().items())

    flat = {n: (whole.params[n], whole.state[n]) for n in names}
    manifest, parts = _cut(flat, names, 3)
    assert sum(len(p["params"]) for p in parts) > len(names)  # some parameter is split
    joined = zero._whole(manifest, parts)
    for n in names:
        assert torch.equal(joined.params[n], whole.params[n])
        assert torch.equal(joined.state[n]["exp_avg_sq"], whole.state[n]["exp_avg_sq"])
        assert joined.state[n]["step"] == whole.state[n]["step"]
    for r in range(2):  # this rank's pieces of a 2-rank cut, with a plain optimizer over them
        _, mine = _cut({n: (torch.zeros_like(t), {}) for n, (t, _) in flat.items()}, names, 2)
        pieces = [(n, t, _start(names, flat, 2, r, n)) for n, t in mine[r]["params"].items()]
        inner = torch.optim.Adam([t for _, t, _ in pieces], lr=0.01)
        groups = [dict(sd["param_groups"][0], params=[n for n, _, _ in pieces])]
        restore_pieces(pieces, inner, [n for n, _, _ in pieces], joined.piece,
                       joined.piece_state, groups)
        for j, (n, t, start) in enumerate(pieces):
            assert torch.equal(t, whole.params[n][start:start + t.numel()])
            got = inner.state_dict()["state"][j]["exp_avg"]
            assert torch.equal(got, whole.state[n]["exp_avg"][start:start + t.numel()])


def _start(names, flat, ranks, rank, name):
    """Where rank's piece of name starts in the parameter (layout.py's cut)."""
    from hpcdl.torch.zero.layout import block_counts, pieces_of
    numels = [flat[n][0].numel() for n in names]
    for c in pieces_of(numels, block_counts(sum(numels), ranks), rank):
        if names[c.index] == name:
            return c.start
    raise KeyError(name)
