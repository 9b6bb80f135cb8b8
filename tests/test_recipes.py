"""test_recipes.py - issue 28's recipe pieces: LAMB step by step against its
formula in float64 (weight decay, excluded groups, zero norms, resume), label
smoothing against a hand-computed loss, which parameters get no weight decay,
the named recipes (load, print, scale with the global batch, precedence, bad
values as one-line errors), and --target-accuracy in summary.json from real
runs, where LAMB on 2 ranks follows 1 process."""
import json
import math
import re
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn

from hpcdl import optim
from hpcdl.cli import main as cli_main
from hpcdl.train import build
from hpcdl.train.config import RECIPES, ConfigError, TrainConfig, load_recipe, recipe_lines, \
    resolve, with_recipe
from mpi_harness import run_mpi
from test_optim import SHAPES, LRS, as_params, assert_close, grads, norm, run_torch, \
    start_weights

TRAIN = [sys.executable, "-m", "hpcdl", "train"]


# ---------------------------------------------------------------- LAMB
def lamb_reference(ws, steps, wd, adapt, zero_g=(), betas=(0.9, 0.999), eps=1e-6, lrs=LRS):
    """You et al. 2019, Algorithm 2, written out per tensor (wd, adapt per tensor)."""
    b1, b2 = betas
    ws = [w.copy() for w in ws]
    ms, vs = [np.zeros_like(w) for w in ws], [np.zeros_like(w) for w in ws]
    for t in range(steps):
        for i, g in enumerate(grads(t, [w.shape for w in ws], zero_g)):
            w = ws[i]
            ms[i] = b1 * ms[i] + (1 - b1) * g
            vs[i] = b2 * vs[i] + (1 - b2) * g * g
            m_hat, v_hat = ms[i] / (1 - b1 ** (t + 1)), vs[i] / (1 - b2 ** (t + 1))
            u = m_hat / (np.sqrt(v_hat) + eps) + wd[i] * w
            ratio = norm(w) / norm(u) if adapt[i] and norm(w) > 0 and norm(u) > 0 else 1.0
            ws[i] = w - lrs[t] * ratio * u
    return ws


def lamb_groups(params, wd):
    """Tensors 0, 1 decayed and adapted; 2 adapted, not decayed; 3 neither."""
    return [{"params": params[:2], "weight_decay": wd},
            {"params": [params[2]], "weight_decay": 0.0},
            {"params": [params[3]], "weight_decay": 0.0, "lars_adaptation": False}]


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_lamb_matches_its_formula(wd):
    params = as_params(start_weights())
    got = run_torch(optim.LAMB(lamb_groups(params, wd), lr=0.1), params, 5)
    want = lamb_reference(start_weights(), 5, [wd, wd, 0.0, 0.0], [True, True, True, False])
    assert_close(got, want)
    assert max(norm(a - b) for a, b in zip(got, start_weights())) > 1e-2  # it moved


def test_lamb_zero_norms_use_ratio_one():
    # tensor 1 starts at 0 (||w|| = 0); tensor 2 has no gradient at step 0 and no
    # decay, so its first update is 0 (||u|| = 0): both take ratio 1
    zero_w, zero_g = (1,), ((0, 2),)
    params = as_params(start_weights(zero=zero_w))
    got = run_torch(optim.LAMB(lamb_groups(params, 0.01), lr=0.1), params, 5, zero_g=zero_g)
    want = lamb_reference(start_weights(zero=zero_w), 5, [0.01, 0.01, 0.0, 0.0],
                          [True, True, True, False], zero_g=zero_g)
    assert_close(got, want)
    assert norm(got[1]) > 0 and all(np.isfinite(w).all() for w in got)


def test_lamb_without_adaptation_is_adamw():
    a, b = as_params(start_weights()), as_params(start_weights())
    lamb = optim.LAMB([{"params": a, "lars_adaptation": False}], lr=0.1, weight_decay=0.01)
    adamw = torch.optim.AdamW(b, lr=0.1, eps=1e-6, weight_decay=0.01)
    assert_close(run_torch(lamb, a, 5), run_torch(adamw, b, 5), rtol=1e-10)


def test_lamb_float32_and_resume():
    n = len(SHAPES)
    want = lamb_reference(start_weights(), 5, [0.01] * n, [True] * n)
    params = as_params(start_weights(), torch.float32)
    opt = optim.LAMB(params, lr=0.1, weight_decay=0.01)
    assert_close(run_torch(opt, params, 5), want, rtol=1e-4)
    # 2 steps, then 3 more by the same optimizer == by a fresh one loading its state
    ends = []
    for fresh in (False, True):
        params = as_params(start_weights())
        opt = optim.LAMB(params, lr=0.1, weight_decay=0.01)
        run_torch(opt, params, 2)
        if fresh:
            saved, opt = opt.state_dict(), optim.LAMB(params, lr=0.1, weight_decay=0.01)
            opt.load_state_dict(saved)
        ends.append(run_torch(opt, params, 3, lrs=LRS[2:]))
    assert_close(ends[1], ends[0], rtol=0)


@pytest.mark.parametrize("kw,words", [(dict(lr=-1.0), "lr must be a number >= 0"),
                                      (dict(betas=(0.9, 1.0)), "betas[1] must be below 1"),
                                      (dict(betas=(0.9,)), "betas must be a pair"),
                                      (dict(eps=float("nan")), "eps must be a number")])
def test_lamb_bad_input(kw, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        optim.LAMB([torch.zeros(2, requires_grad=True)], **kw)


# ---------------------------------------------------------------- label smoothing
def test_label_smoothing_matches_a_hand_computed_loss():
    # p = softmax(0, ln 3) = (1/4, 3/4), label 0; eps 0.2 puts 0.9 on class 0 and 0.1
    # on class 1: loss = 0.9 ln 4 + 0.1 ln(4/3) = 1.276433...
    logits, y = torch.tensor([[0.0, math.log(3.0)]], dtype=torch.float64), torch.tensor([0])
    smoothed = build.train_loss(TrainConfig(label_smoothing=0.2), logits, y).item()
    assert smoothed == pytest.approx(0.9 * math.log(4) + 0.1 * math.log(4 / 3), rel=1e-12)
    assert smoothed == pytest.approx(1.2764331, rel=1e-7)
    assert build.train_loss(TrainConfig(), logits, y).item() == pytest.approx(math.log(4))


# ---------------------------------------------------------------- weight decay groups
def _decays(cfg):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    opt = build.build_optimizer(cfg, model)
    inner = getattr(opt, "optimizer", opt)  # LARC wraps SGD
    name = {p: n for n, p in model.named_parameters()}
    return {name[p]: g["weight_decay"] for g in inner.param_groups for p in g["params"]}


@pytest.mark.parametrize("optimizer,flag,excluded", [
    ("sgd", False, False), ("sgd", True, True), ("adam", True, True), ("larc", True, True),
    ("lars", False, True), ("lamb", False, True)])
def test_which_parameters_get_weight_decay(optimizer, flag, excluded):
    got = _decays(TrainConfig(optimizer=optimizer, weight_decay=0.1, no_decay_bias_norm=flag))
    weights = {"0.weight", "3.weight"}
    assert set(got) == weights | {"0.bias", "1.weight", "1.bias", "3.bias"}
    assert {n: d for n, d in got.items() if n in weights} == {n: 0.1 for n in weights}
    others = {d for n, d in got.items() if n not in weights}
    assert others == ({0.0} if excluded else {0.1}), got


# ---------------------------------------------------------------- recipes
@pytest.mark.parametrize("recipe,batch,lr,words", [
    ("plain", 64, 0.05, "warmup 0 epoch(s), then cosine"),
    ("plain", 2048, 1.6, "sgd, base lr 0.05 at batch 64, linear scaling -> lr 1.6 at global "
                         "batch 2048"),
    ("goyal", 2048, 1.6, "warmup 5 epoch(s) from lr 0.05, then cosine"),
    ("lars", 8192, 40.0, "trust coefficient 0.001"),
    ("lamb", 8192, 0.06, "lamb, base lr 0.03 at batch 2048, sqrt scaling -> lr 0.06"),
])
def test_recipes_load_print_and_scale_with_the_batch(recipe, batch, lr, words):
    cfg = resolve({}, dict(recipe=recipe, global_batch=batch))
    cfg.check(size=4)
    values = load_recipe(recipe)
    assert {k: getattr(cfg, k) for k in values} == values
    assert build.peak_lr(cfg) == pytest.approx(lr, rel=1e-12)
    text = "\n".join(recipe_lines(cfg, build.peak_lr(cfg)))
    assert text.startswith("recipe %s (" % recipe) and words in text, text


def test_every_recipe_is_a_file_that_checks():
    for recipe in RECIPES:
        resolve({}, dict(recipe=recipe)).check(size=1)
    assert recipe_lines(TrainConfig(), 0.1) == []


def test_precedence_defaults_recipe_file_flags(tmp_path):
    cfg = resolve({"recipe": "goyal", "base_lr": 0.02}, {"momentum": 0.5})
    assert (cfg.recipe, cfg.optimizer, cfg.warmup_epochs) == ("goyal", "sgd", 5.0)  # recipe
    assert (cfg.base_lr, cfg.momentum, cfg.epochs) == (0.02, 0.5, 30)  # file, flag, default
    cfg = resolve({"recipe": "goyal", "base_lr": 0.02}, {"recipe": "lamb", "base_lr": 0.03})
    assert (cfg.recipe, cfg.optimizer, cfg.base_lr) == ("lamb", "lamb", 0.03)
    # a TrainConfig(recipe=...) made in Python (hpcdl.train.train applies it):
    # what differs from the defaults wins, the recipe fills the rest
    cfg = with_recipe(TrainConfig(recipe="lars", global_batch=4096, base_lr=5.0))
    assert (cfg.optimizer, cfg.base_lr, cfg.global_batch, cfg.warmup_epochs) == \
        ("lars", 5.0, 4096, 5.0)
    assert with_recipe(cfg) is cfg and with_recipe(TrainConfig()) == TrainConfig()
    own = tmp_path / "mine.yaml"
    own.write_text("optimizer: lamb\nbase-lr: 0.004\nno-decay-bias-norm: yes\n")
    cfg = resolve({}, {"recipe": str(own)})
    assert (cfg.optimizer, cfg.base_lr, cfg.no_decay_bias_norm) == ("lamb", 0.004, True)


@pytest.mark.parametrize("recipe,rule", [("plain", "linear"), ("lamb", "sqrt"),
                                         ("goyal", "linear"), ("lars", "linear")])
def test_global_batch_auto_takes_adascale_over_the_recipes_rule(recipe, rule):
    """issue 38: docs/goodput.md's `--recipe plain --global-batch auto` was
    refused (auto needs adascale, the recipe said linear): the recipe's rule
    gives way, and rank 0's recipe lines say so; a --lr-scaling the user
    names is still checked."""
    flags = dict(recipe=recipe, global_batch="auto", max_global_batch=4096)
    cfg = resolve({}, flags)
    cfg.check(size=4)
    assert (cfg.auto_batch, cfg.lr_scaling) == (True, "adascale")
    assert cfg.optimizer == load_recipe(recipe)["optimizer"]  # the rest is the recipe's
    text = "\n".join(recipe_lines(cfg, build.peak_lr(cfg)))
    assert "lr by AdaScale, not the recipe's %s scaling" % rule in text, text
    for file_values, named in (({}, {"lr_scaling": rule}), ({"lr_scaling": rule}, {})):
        with pytest.raises(ConfigError, match="--global-batch auto takes its lr from "
                                              "AdaScale: use --lr-scaling adascale"):
            resolve(file_values, dict(flags, **named)).check(4)  # a flag, a config file
    assert resolve({}, dict(recipe=recipe, global_batch=2048)).lr_scaling == rule


@pytest.mark.parametrize("recipe,epochs,warmup", [("lamb", 3, 1.5), ("goyal", 1, 0.5),
                                                  ("lars", 8, 4.0), ("lamb", 10, 5.0),
                                                  ("goyal", 30, 5.0), ("plain", 1, 0.0)])
def test_a_recipes_warmup_fits_the_run(recipe, epochs, warmup):
    """issue 38: `--recipe lamb --epochs 3` was refused with `--warmup-epochs 5
    must be between 0 and --epochs 3`, a flag never given: the recipe's warmup
    is capped at half the run, and rank 0's recipe lines say so."""
    cfg = resolve({}, dict(recipe=recipe, epochs=epochs))
    cfg.check(size=2)
    assert cfg.warmup_epochs == warmup
    text = "\n".join(recipe_lines(cfg, build.peak_lr(cfg)))
    scaled = warmup < load_recipe(recipe)["warmup_epochs"]
    assert ("the recipe's warmup of 5 epochs scaled to %g, half of --epochs %d "
            "(--warmup-epochs overrides)" % (warmup, epochs) in text) == scaled, text


def test_a_warmup_the_user_named_that_does_not_fit_is_refused(tmp_path):
    for file_values, flags in (({}, {"warmup_epochs": 5.0}), ({"warmup_epochs": 5.0}, {})):
        with pytest.raises(ConfigError, match=re.escape("--warmup-epochs 5 must be between "
                                                        "0 and --epochs 3")):
            resolve(file_values, dict(flags, recipe="lamb", epochs=3)).check(2)
    cfg = resolve({}, dict(recipe="lamb", epochs=3, warmup_epochs=3.0))  # fits: kept
    cfg.check(2)
    assert cfg.warmup_epochs == 3.0 and cfg.recipe_notes == []


def test_bad_boolean_flag_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main.main(["train", "--no-decay-bias-norm", "maybe"])
    assert e.value.code == 2
    assert "'maybe': give true or false" in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize("text,message", [
    ("data: digits\n", "sets data; a recipe holds only how to train"),
    ("recipe: lars\n", "sets recipe"),
    ("base-lr: fast\n", "base-lr = 'fast' is not a float"),
    ("no-decay-bias-norm: perhaps\n", "is not a boolean (true or false)"),
    ("learning-rate: 0.1\n", "unknown key 'learning-rate'"),
])
def test_bad_recipe_files(tmp_path, text, message):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve({}, {"recipe": str(path)})


def test_relaunch_forwards_the_new_flags(monkeypatch):
    calls = []
    monkeypatch.setattr("hpcdl.cli.run.launch", lambda n, cmd, hosts=None, **launcher:
                        calls.append(cmd) or 0)
    monkeypatch.setattr("hpcdl.cli.run.inside_parallel_job", lambda: False)
    argv = ["--recipe", "lars", "--global-batch", "1024", "--no-decay-bias-norm",
            "--label-smoothing", "0.1", "--target-accuracy", "0.9"]
    assert cli_main.main(["train", "-n", "2"] + argv) == 0
    again = cli_main.build_parser().parse_args(calls[0][3:])
    assert vars(again) == vars(cli_main.build_parser().parse_args(["train"] + argv))
    assert again.no_decay_bias_norm is True


# ---------------------------------------------------------------- real runs
RUN = ["--recipe", "lamb", "--base-batch", "64", "--base-lr", "0.01", "--warmup-epochs", "1",
       "--epochs", "2", "--global-batch", "64", "--label-smoothing", "0.1"]


def _run(n, out, *args):
    r = run_mpi(n, TRAIN + RUN + ["--out", str(out)] + list(args), timeout=150, check=True)
    epochs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    return r.stdout, epochs, json.loads((out / "summary.json").read_text())


@pytest.mark.mpi
def test_target_accuracy_and_lamb_on_two_ranks(tmp_path):
    one = _run(1, tmp_path / "one", "--target-accuracy", "0.5")
    two = _run(2, tmp_path / "two", "--target-accuracy", "0.5")
    out, epochs, summary = two
    assert "recipe lamb (" in out and "label smoothing 0.1" in out, out
    assert summary["recipe"] == "lamb" and summary["optimizer"] == "lamb"
    first = next(e for e in epochs if e["test_accuracy"] >= 0.5)  # reached in epoch 1 or 2
    assert summary["target_accuracy"] == 0.5
    assert summary["epochs_to_target"] == first["epoch"]
    assert summary["steps_to_target"] == first["step"] == first["epoch"] * (1437 // 64)
    assert 0 < summary["time_to_target_s"] <= sum(e["epoch_time_s"] for e in epochs) + 1e-9
    assert summary["eval_time_to_target_s"] > 0
    assert re.search(r"to test acc 0.5 +[0-9.]+ s training \(\+[0-9.]+ s evaluation\), "
                     r"%d steps, %d epoch" % (first["step"], first["epoch"]), out), out
    # the same global batch on 2 ranks: LAMB follows one process up to rounding
    for a, b in zip(one[1], epochs):
        for key in ("loss", "test_loss"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), key
    assert one[2]["steps_to_target"] == summary["steps_to_target"]


@pytest.mark.mpi
def test_target_accuracy_not_reached(tmp_path):
    out, _, summary = _run(1, tmp_path, "--target-accuracy", "1.0", "--epochs", "1",
                           "--warmup-epochs", "0")
    assert summary["target_accuracy"] == 1.0
    assert all(summary[k] is None for k in ("time_to_target_s", "eval_time_to_target_s",
                                            "steps_to_target", "epochs_to_target"))
    assert re.search(r"to test acc 1 +not reached", out), out
