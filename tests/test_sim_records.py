"""test_sim_records.py - `hpcdl sim profile` (hooks record each gradient's
size in backward order), the simulator reading a profile (and refusing one
for another model), `hpcdl sim records` with the package's records file
and bad records files, and the hook comparing with `hpcdl bench train`."""
import json
import subprocess
import sys

import pytest

from hpcdl.sim import compare, profile, records, terms
from mpi_harness import run_mpi

HPCDL = [sys.executable, "-m", "hpcdl"]


def hpcdl(*args, timeout=180, cwd=None):
    return subprocess.run(HPCDL + list(args), capture_output=True, text=True, timeout=timeout,
                          cwd=cwd)


TINY = '''
import torch
def build():
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
def with_shape():
    return build(), (6,), 3
'''


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    (tmp_path / "tinynet.py").write_text(TINY)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_profile_records_gradients_in_backward_order(tiny):
    doc = profile.run("tinynet:with_shape", batch=4, steps=3, warmup=1)
    # backward produces the last layer's gradients first: 2.bias/2.weight then 0.*
    names = [row["name"] for row in doc["layers"]]
    assert sorted(names[:2]) == ["2.bias", "2.weight"] and sorted(names[2:]) == ["0.bias",
                                                                               "0.weight"]
    sizes = {row["name"]: row["nbytes"] for row in doc["layers"]}
    assert sizes == {"2.bias": 12, "2.weight": 60, "0.bias": 20, "0.weight": 120}
    assert doc["params"] == 53 and doc["model"] == "tinynet:with_shape"
    assert all(row["backward_s"] >= 0 for row in doc["layers"]) and doc["spread"] >= 0
    assert doc["spread"] == pytest.approx(profile.spread(doc["step_times"]))


def test_profile_entry_point_needs_a_shape(tiny):
    with pytest.raises(ValueError, match="--input-shape"):
        profile.run("tinynet:build", steps=2)
    with pytest.raises(ValueError, match="cannot load the model entry point 'tinynet:nope'"):
        profile.run("tinynet:nope", steps=2)
    with pytest.raises(ValueError, match="unknown model 'vgg'"):
        profile.run("vgg", steps=2)


def test_profile_models_are_bench_trains():
    from hpcdl.bench import train
    for name in profile.MODELS:
        model, shape, classes = profile.build(name)
        want, want_shape, want_classes = train.build_model(name)
        assert (shape, classes) == (want_shape, want_classes)
        assert [p.shape for p in model.parameters()] == [p.shape for p in want.parameters()]


def test_spread_by_hand():
    assert profile.spread([1.0, 3.0]) == pytest.approx(0.5)      # sigma 1, mean 2
    assert profile.spread([2.0]) == 0.0


def test_profile_cli_feeds_sim_step(tiny):
    prof = tiny / "prof.json"
    r = hpcdl("sim", "profile", "--model", "tinynet:build", "--input-shape", "6",
              "--classes", "3", "--batch", "4", "--steps", "3", "--json", str(prof), cwd=tiny)
    assert r.returncode == 0, r.stderr
    assert "0.weight" in r.stdout and json.loads(prof.read_text())["params"] == 53
    base = ["sim", "step", "--profile", str(prof), "--alpha", "5us", "--beta", "1GB/s",
            "--gpus", "2,4", "--gpus-per-node", "2"]
    r = hpcdl(*base, "--model", "tinynet:build", "--json", str(tiny / "s.json"))
    assert r.returncode == 0, r.stderr
    rows = json.loads((tiny / "s.json").read_text())["rows"]
    doc = profile.load(str(prof))
    step = terms.Step(profile.layers_of(doc), doc["forward_s"], cv=doc["spread"],
                      optimizer_s=doc["optimizer_s"])
    fab = terms.Fabric(5e-6, 1e-9, 5e-6, 1e-9, per_node=2)
    assert rows[1]["step_s"] == pytest.approx(terms.breakdown(4, step, fab).step_s)
    r = hpcdl(*base, "--model", "resnet50")
    assert r.returncode == 2 and "is for model 'tinynet:build', not 'resnet50'" in r.stderr


@pytest.mark.mpi
def test_profile_spread_over_ranks(tiny):
    # under mpirun every rank profiles; the spread covers all ranks' steps
    prof = tiny / "prof.json"
    r = run_mpi(2, HPCDL + ["sim", "profile", "--model", "tinynet:with_shape", "--steps", "3",
                            "--json", str(prof)], timeout=120,
                env={"PYTHONPATH": str(tiny)})
    assert r.returncode == 0, r.stdout
    assert r.stdout.count("# hpcdl sim profile:") == 1          # rank 0 prints
    doc = json.loads(prof.read_text())
    assert doc["ranks"] == 2 and doc["spread_over"] == "6 step(s) on 2 rank(s)"


# ----------------------------------------------------------------------------
# records

def test_package_records_predict_and_explain():
    rows = [records.predict(r) for r in records.load()]
    assert len(rows) >= 3 and "goyal2017" in [r["id"] for r in rows]
    for r in rows:
        assert r["sources"]["reported"]                   # every figure says where from
        if "reported" in r:
            assert r["within_target"] == (abs(r["miss_points"]) <= records.TARGET_POINTS)
            if not r["within_target"]:
                assert r["why"]                           # a miss is explained
        assert sum(r["terms"].values()) == pytest.approx(r["step_s"])


def test_cv_to_match_closes_the_gap():
    rec = next(r for r in records.load() if r["id"] == "goyal2017")
    step, fab = records.inputs(rec)
    cv = records.cv_to_match(rec, step, fab, 0.9)
    got = terms.breakdown(256, terms.with_terms(step, cv=cv), fab, base_gpus=8).efficiency
    assert got == pytest.approx(0.9, abs=1e-6)


def test_records_cli_json():
    r = hpcdl("sim", "records", "--json")
    assert r.returncode == 0, r.stderr
    assert {row["id"] for row in json.loads(r.stdout)} >= {"goyal2017", "akiba2017"}
    r = hpcdl("sim", "records")
    assert r.returncode == 0 and "goyal2017" in r.stdout and "why:" in r.stdout


def test_records_file_missing_a_field(tmp_path):
    doc = json.load(open(records.PATH))
    del doc["records"][1]["nics_per_node"]
    bad = tmp_path / "records.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="record chainermn2017 has no field 'nics_per_node'"):
        records.load(str(bad))
    r = hpcdl("sim", "records", "--file", str(bad))
    assert r.returncode == 2 and "no field 'nics_per_node'" in r.stderr and str(bad) in r.stderr


def test_records_file_bad_values(tmp_path):
    doc = json.load(open(records.PATH))
    doc["records"][0]["gpus"] = 100                       # 100 GPUs, 8 per node
    bad = tmp_path / "records.json"
    bad.write_text(json.dumps(doc))
    r = hpcdl("sim", "records", "--file", str(bad))
    assert r.returncode == 2 and "100 GPUs do not fill nodes of 8" in r.stderr


# ----------------------------------------------------------------------------
# the hook for the vcluster check (pending): a bench train JSON

def test_measured_step_from_bench_train(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"ranks": 2, "model": "mlp", "batch_per_rank": 32,
                                 "rows": [{"impl": "hpcdl", "samples_per_s": 640.0}]}))
    assert compare.measured_step(str(bench)) == (pytest.approx(0.1), 2, "mlp")
    b = terms.Breakdown(2, 0.08, 0.9, 0.0, 0.0, 1, {"compute": 0.08})
    assert compare.against(b, 0.1)["ratio"] == pytest.approx(1.25)
    bench.write_text("{}")
    with pytest.raises(ValueError, match="cannot read a measured step"):
        compare.measured_step(str(bench))
