"""test_large_batch.py - the analysis of `hpcdl bench large-batch` (steps to
the target, McCandlish's fit, the critical batch) on hand-worked numbers, and
its option checks. The study's runs themselves are benchmarks, not tests."""
import math

import pytest

from hpcdl.bench import large_batch as lb


def _epochs(accs, steps_per_epoch, seconds_per_epoch=2.0):
    return [dict(epoch=i + 1, step=(i + 1) * steps_per_epoch, test_accuracy=a, loss=1.0 / (i + 1),
                 epoch_time_s=seconds_per_epoch) for i, a in enumerate(accs)]


def test_first_reach_counts_steps_and_train_seconds_to_the_first_epoch_at_target():
    recs = _epochs([0.5, 0.8, 0.92, 0.91, 0.95], steps_per_epoch=10, seconds_per_epoch=1.5)
    assert lb.first_reach(recs, 0.9) == (30, 4.5, 3)
    assert lb.first_reach(recs, 0.95) == (50, 7.5, 5)
    assert lb.first_reach(recs, 0.96) is None


def test_fit_recovers_the_model_it_was_made_from():
    s_min, b_noise = 250.0, 1500.0
    pts = [(b, s_min * (1 + b_noise / b)) for b in (64, 256, 1024, 4096)]
    a, bn = lb.fit_steps(pts)
    assert a == pytest.approx(s_min, rel=1e-9) and bn == pytest.approx(b_noise, rel=1e-9)
    assert lb.fit_steps(pts[:1]) is None                 # one batch size: no fit
    assert lb.fit_steps([(64, 100), (128, 200)]) is None  # steps grow with B: no meaning


def test_critical_batch_where_steps_reach_twice_perfect_scaling():
    # perfect scaling from (64, 1000): 500 at 128, 250 at 256, 125 at 512;
    # ratios 1, 1.2, 1.6, 2.56: the crossing of 2 lies between 256 and 512,
    # at log-fraction (ln2 - ln1.6) / (ln2.56 - ln1.6) of the way
    pts = [(128, 600), (64, 1000), (512, 320), (256, 400)]
    t = (math.log(2) - math.log(1.6)) / (math.log(2.56) - math.log(1.6))
    assert lb.critical_batch(pts) == pytest.approx(256 * 2 ** t, rel=1e-12)
    assert lb.critical_batch([(64, 1000), (128, 500)]) is None  # perfect scaling: never
    # points of McCandlish's model cross near B_noise + 2 B0 (docstring)
    s_min, b_noise = 100.0, 4000.0
    model = [(b, s_min * (1 + b_noise / b)) for b in (64, 128, 256, 512, 1024, 2048, 4096, 8192)]
    assert lb.critical_batch(model) == pytest.approx(b_noise + 2 * 64, rel=0.15)


def test_summarize_means_over_seeds_and_counts_runs_that_missed():
    runs = [dict(recipe="goyal", batch=64, seed=s, epochs=_epochs(a, 100))
            for s, a in enumerate(([0.90, 0.96], [0.94, 0.98]))]
    runs += [dict(recipe="goyal", batch=1024, seed=s, epochs=_epochs(a, 7))
             for s, a in enumerate(([0.5, 0.96], [0.6, 0.8]))]
    rows = lb.summarize(runs, target=0.95)
    small, large = rows
    assert small["final_acc"] == pytest.approx(0.97) and small["best_acc"] == pytest.approx(0.97)
    assert small["reached"] == 2 and small["steps_to_target"] == pytest.approx(200)
    assert small["time_to_target_s"] == pytest.approx(4.0)
    assert large["reached"] == 1 and large["steps_to_target"] is None  # one seed missed
    assert large["final_acc"] == pytest.approx(0.88)
    assert small["fit_s_min"] is None  # one batch reached in every seed: no fit


def test_summarize_keeps_the_auto_row_out_of_the_fit(tmp_path):
    """An auto row: its steps and time to the target read as for the others,
    its final batch the last epoch's (mean over seeds); the fit and the
    critical batch over the fixed batches alone (McCandlish points, exact)."""
    s_min, b_noise = 100.0, 500.0
    runs = []
    for b in (64, 256, 1024):  # steps to target = S(B), reached at epoch 2 of 2
        spe = s_min * (1 + b_noise / b) / 2
        runs.append(dict(recipe="plain", batch=b, seed=0, epochs=_epochs([0.5, 0.95], spe)))
    auto = _epochs([0.6, 0.93, 0.96], 40, seconds_per_epoch=1.0)
    for e, g in zip(auto, (64, 256, 1024)):
        e["global_batch"] = g
    runs.insert(1, dict(recipe="plain", batch="auto", seed=0, epochs=auto))
    rows = lb.summarize(runs, target=0.95)
    assert [r["batch"] for r in rows] == [64, 256, 1024, "auto"]
    a = rows[-1]
    assert a["steps_to_target"] == 120 and a["time_to_target_s"] == pytest.approx(3.0)
    assert a["final_batch"] == 1024 and a["final_acc"] == pytest.approx(0.96)
    assert a["fit_s_min"] == pytest.approx(s_min) and a["fit_b_noise"] == pytest.approx(b_noise)
    assert lb.global_batches(runs[1]) == [64, 256, 1024]
    assert lb.global_batches(runs[0]) == [64, 64]
    lb.plot(rows, 0.95, str(tmp_path / "auto.png"))  # the auto row drawn, no error
    assert (tmp_path / "auto.png").stat().st_size > 0


def test_a_run_that_ends_at_chance_counts_as_diverged():
    """issue 38: goyal at 2048 ended at 0.1000 with a finite loss and the table
    said `diverged 0`. At chance (within 1 point of the most common class's
    share of the test set) a run learned nothing: it counts, as does a loss
    that is not finite; just above is a slow run, not a diverged one."""
    runs = [dict(recipe="goyal", batch=2048, seed=s, epochs=_epochs(a, 10))
            for s, a in enumerate(([0.3, 0.1], [0.5, 0.1099], [0.2, 0.1101]))]
    runs[2]["epochs"][0]["loss"] = math.nan  # diverged, whatever it ended at
    runs += [dict(recipe="goyal", batch=64, seed=0, epochs=_epochs([0.5, 0.12], 10))]
    big, small = sorted(lb.summarize(runs, target=0.9, chance=0.1), key=lambda r: -r["batch"])
    assert (big["diverged"], small["diverged"]) == (3, 0)
    assert lb.summarize(runs, target=0.9)[1]["diverged"] == 1  # chance unknown: the loss alone
    assert lb.chance_accuracy("synthetic:8:4:400") >= 0.25
    digits = lb.chance_accuracy("digits")  # 10 classes, nearly balanced: a bit over 0.1
    assert 0.1 <= digits < 0.12


def test_the_json_is_strict_and_the_table_says_what_inf_means(tmp_path, capsys):
    """issue 38: --json wrote bare Infinity (B_frozen inf), which is not JSON;
    it is now the string "inf", and the table's footer says what inf means."""
    import json
    epochs = _epochs([0.5, 0.96], 10)
    epochs[-1]["b_simple"] = math.inf
    runs = [dict(recipe="lamb", batch=b, seed=0, epochs=epochs, b_simple_frozen=math.inf,
                 b_simple_offline=-math.inf) for b in (64, 256)]
    rows = lb.summarize(runs, target=0.9, chance=0.1)
    doc = lb.strict_json(dict(rows=rows, runs=runs, nan=math.nan, ok=(1.5, None, "x")))
    text = json.dumps(doc, allow_nan=False)  # raises on a bare Infinity
    back = json.loads(text, parse_constant=lambda c: pytest.fail("bare " + c))
    assert back["rows"][0]["b_simple_frozen"] == "inf" and back["nan"] == "nan"
    assert back["runs"][1]["b_simple_offline"] == "-inf" and back["ok"] == [1.5, None, "x"]
    assert float(back["runs"][0]["epochs"][-1]["b_simple"]) == math.inf
    lb.print_table(rows, 0.97, 0.96, lb.Options(batches=[64, 256], recipes=["lamb"]), 0.1)
    out = capsys.readouterr().out
    assert "# inf: |G|^2 came out <= 0" in out and "ended at chance (test accuracy <= 0.1100" \
        in out, out


def test_diverged_reads_the_runs_of_the_json_back():
    """The JSON holds a nan loss as the string "nan" (strict_json); diverged()
    judges those records as the run's own (it raised TypeError on them, as in
    the end-to-end study's check of its JSON)."""
    import json
    bad, good = _epochs([0.5, 0.9], 10), _epochs([0.5, 0.9], 10)
    bad[0]["loss"] = math.nan
    back = json.loads(json.dumps(lb.strict_json([bad, good]), allow_nan=False))
    assert back[0][0]["loss"] == "nan"
    assert lb.diverged(back[0], 0.1) and not lb.diverged(back[1], 0.1)


def test_no_noise_scale_check_without_two_global_batches_of_data(tmp_path):
    """digits (1437 training samples) at batch 1024: the check at the final
    weights needs two global batches; it crashed (reshape) after the run."""
    cfg = lb.TrainConfig(data="digits", model="mlp", global_batch=1024)
    assert lb.noise_scale_check(cfg, str(tmp_path / "no-model-needed"), 256) is None


def test_the_study_caps_a_recipes_warmup_as_its_help_says():
    """--warmup-epochs' help said a recipe's own warmup 'must fit in --epochs';
    the runs cap it at half of --epochs (config.fit_recipe), as train does."""
    from hpcdl.cli.main import build_parser, parsers
    from hpcdl.train.config import with_recipe
    opts = lb.Options(batches=[64], recipes=["lamb"], epochs=3)
    cfg = with_recipe(lb.TrainConfig(**lb.run_values(opts, "lamb", 64, 0, None)))
    assert cfg.warmup_epochs == 1.5
    (bench,) = [p for p in parsers(build_parser()) if p.prog == "hpcdl bench large-batch"]
    assert "capped at half of --epochs" in " ".join(bench.format_help().split())


def test_cli_reads_auto_in_any_position_and_checks_it_before_any_rank():
    from hpcdl.cli.bench_large_batch import _batches, check_configs
    from hpcdl.cli.errors import UsageError
    assert _batches("1024,auto,64") == ([64, 1024], True)
    assert _batches("256,64") == ([64, 256], False)
    opts = lb.Options(batches=[64, 1024], recipes=["plain", "goyal"], auto=True)
    check_configs(opts)  # plain and goyal: base batch 64 <= the ceiling 1024
    values = lb.run_values(opts, "plain", "auto", 0, None)
    assert values["global_batch"] == "auto" and values["lr_scaling"] == "adascale"
    assert values["max_global_batch"] == 1024
    with pytest.raises(UsageError, match="recipe lars, batch auto: --max-global-batch 1024"):
        check_configs(lb.Options(batches=[64, 1024], recipes=["lars"], auto=True))
    with pytest.raises(UsageError, match="batch auto: .*1 rank"):
        check_configs(opts, ranks=1)


def test_cli_refuses_bad_values_in_one_line(capsys):
    from hpcdl.cli.main import main
    for argv, text in ((["--batches", "64,x"], "--batches"), (["--batches", "0"], "at least 1"),
                       (["--batches", "auto"], "at least one fixed batch beside auto"),
                       (["--batches", "auto,64,auto"], "give auto once"),
                       (["--batches", "64,automatic"], "or the word auto"),
                       (["--target", "1.5"], "(0, 1]"), (["--epochs", "0"], "--epochs"),
                       (["--offline-noise-scale", "-1"], "--offline-noise-scale"),
                       (["--batches", "auto,64", "--modes", "ddp-gloo"],
                        "--batches auto runs with --mode allreduce only")):
        rc = main(["bench", "large-batch"] + argv)
        err = capsys.readouterr().err
        assert rc == 2 and text in err, (argv, rc, err)


@pytest.mark.mpi
def test_study_runs_end_to_end_on_two_ranks(tmp_path):
    """The seconds-long version of the study: 2 recipes x (2 batches + auto) on
    digits, two epochs; the table, the JSON and the plot come out, and the
    JSON's rows agree with its own per-run epoch records."""
    import json
    import sys

    from mpi_harness import run_mpi
    out = tmp_path / "lb.json"
    r = run_mpi(2, [sys.executable, "-m", "hpcdl", "bench", "large-batch", "--data", "digits",
                    "--model", "mlp", "--batches", "256,auto,32", "--recipes", "goyal,plain",
                    "--epochs", "2", "--warmup-epochs", "1", "--json", str(out),
                    "--offline-noise-scale", "512",
                    "--plot", str(tmp_path / "lb.png")], timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "== run 6/6: recipe plain, global batch auto" in r.stdout
    data = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail("bare " + c))
    assert [(row["recipe"], row["batch"]) for row in data["rows"]] == \
        [("goyal", 32), ("goyal", 256), ("goyal", "auto"), ("plain", 32), ("plain", 256),
         ("plain", "auto")]
    autos = [run for run in data["runs"] if run["batch"] == "auto"]
    for run in autos:  # auto starts at the recipes' base batch 64, ends within 64..256
        row = next(x for x in data["rows"] if (x["recipe"], x["batch"]) == (run["recipe"],
                                                                           "auto"))
        assert run["global_batches"][0] == 64 and set(run["global_batches"]) <= {64, 128, 256}
        assert row["final_batch"] == run["global_batches"][-1]
        assert row["final_acc"] == run["epochs"][-1]["test_accuracy"]
        assert row["fit_s_min"] == next(x for x in data["rows"] if x["recipe"] == run[
            "recipe"])["fit_s_min"]  # the recipe's fit, of its fixed batches
        assert run["b_simple_offline"] is None  # no single batch to check at
    assert "plain auto: --global-batch auto, lr by AdaScale" in r.stdout
    base = next(run for run in data["runs"] if run["recipe"] == "goyal" and run["batch"] == 32)
    assert data["a0"] == base["epochs"][-1]["test_accuracy"]
    assert data["target"] == pytest.approx(data["a0"] - 0.01)
    for row in data["rows"][:2] + data["rows"][3:5]:
        run = next(x for x in data["runs"] if (x["recipe"], x["batch"]) == (row["recipe"],
                                                                             row["batch"]))
        assert row["final_acc"] == run["epochs"][-1]["test_accuracy"]
        assert len(run["epochs"]) == 2 and run["epochs"][-1]["step"] == 2 * (1437 // row["batch"])
    assert (tmp_path / "lb.png").stat().st_size > 0
    for run in [x for x in data["runs"] if x["batch"] != "auto"]:  # the offline check
        diverged = lb.diverged(run["epochs"], data["chance"])
        assert diverged or (float(run["b_simple_offline"]) > 0
                            and float(run["b_simple_frozen"]) > 0), run  # "inf" too
    assert "B_simple at the final weights (frozen, 512 samples)" in r.stdout, r.stdout
    assert "B_offline" in r.stdout


def test_median_b_simple_skips_epochs_without_an_estimate():
    recs = [dict(b_simple=v) for v in (400, None, 900, 100)] + [dict()]
    assert lb.median_b_simple(recs) == 400
    assert lb.median_b_simple(recs[:3]) == 650
    assert lb.median_b_simple([dict(b_simple=None)]) is None


def test_modes_have_their_own_rows_and_a_comparison_against_the_first():
    """--modes allreduce,ddp-gloo: a series per recipe x mode (own rows and
    fit), the same target for both, and the first mode's times against the
    other's (ratios > 1: the first is faster)."""
    runs = []
    for mode, secs in (("allreduce", 2.0), ("ddp-gloo", 3.0)):
        for b, spe in ((64, 100), (1024, 10)):
            runs.append(dict(recipe="lamb", batch=b, seed=0, mode=mode,
                             epochs=_epochs([0.5, 0.96, 0.97], spe, seconds_per_epoch=secs)))
    rows = lb.summarize(runs, target=0.95)
    assert [(lb.label(r), r["batch"]) for r in rows] == [
        ("lamb", 64), ("lamb", 1024), ("lamb/ddp-gloo", 64), ("lamb/ddp-gloo", 1024)]
    assert rows[2]["steps_to_target"] == 200 and rows[2]["time_to_target_s"] == 6.0
    assert lb.compare_modes(rows, ["allreduce"]) == []
    (small, large) = lb.compare_modes(rows, ["allreduce", "ddp-gloo"])
    assert (small["batch"], small["other"]) == (64, "ddp-gloo")
    assert small["time_to_target_s"] == (4.0, 6.0) and small["target_speedup"] == 1.5
    assert large["train_s"] == (6.0, 9.0) and large["train_speedup"] == 1.5
    # an old run without a mode is allreduce's
    assert lb.series(dict(recipe="goyal")) == ("goyal", "allreduce")


def test_cli_checks_every_mode_before_any_rank():
    from hpcdl.cli.bench_large_batch import check_configs
    from hpcdl.cli.errors import UsageError
    opts = lb.Options(batches=[64], recipes=["goyal"], modes=["allreduce", "ddp-gloo"],
                      auto=True)
    check_configs(opts)  # auto runs only with allreduce: no adascale under DDP
    assert lb.run_values(opts, "goyal", 64, 0, None, "ddp-gloo")["mode"] == "ddp-gloo"
    with pytest.raises(UsageError, match="recipe goyal, batch 64, mode ddp-nccl: unknown mode"):
        check_configs(lb.Options(batches=[64], recipes=["goyal"], modes=["ddp-nccl"]))


def test_dash_n_forwards_the_modes_to_the_ranks(monkeypatch):
    from hpcdl.cli.main import main
    calls = []
    monkeypatch.setattr("hpcdl.cli.run.launch", lambda n, argv, **kw: calls.append(argv) or 0)
    monkeypatch.setattr("hpcdl.cli.run.inside_parallel_job", lambda: False)
    monkeypatch.setattr("hpcdl.cli.bench_large_batch.prepare_data", lambda spec: None)
    assert main(["bench", "large-batch", "-n", "2", "--data", "digits", "--model", "mlp",
                 "--recipes", "goyal", "--batches", "64", "--modes", "allreduce,ddp-gloo"]) == 0
    (argv,) = calls
    assert argv[argv.index("--modes") + 1] == "allreduce,ddp-gloo"
