"""test_sim_pipeline.py - the pipeline terms of hpcdl/sim/pipeline.py against
values worked out by hand, the closed-form step time against a small
event-by-event simulation of GPipe, and `hpcdl sim pipeline` (its rows, its
JSON, its one-line errors). Pure Python, in-process: no MPI."""
import json

import pytest

from hpcdl.cli.main import main
from hpcdl.sim import pipeline


def test_bubble_by_hand():
    assert pipeline.bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert pipeline.bubble_fraction(4, 8) == pytest.approx(3 / 11)    # m = 2p
    assert pipeline.bubble_fraction(4, 1) == pytest.approx(3 / 4)     # one micro-batch
    assert pipeline.bubble_fraction(1, 5) == 0.0                      # no pipeline
    assert pipeline.bubble_fraction(8, 57) == pytest.approx(7 / 64)


def test_message_by_hand():
    # 64 samples in 4 micro-batches of 16, 1024 elements of 2 bytes: 32768 bytes
    assert pipeline.boundary_bytes(64, 4, 1024, 2) == 32768
    assert pipeline.boundary_bytes(10, 4, 3) == 2.5 * 3 * 4             # the mean size
    assert pipeline.message_time(32768, 5e-6, 1e-9) == pytest.approx(5e-6 + 32768e-9)
    assert pipeline.message_time(0, 5e-6, 1e-9) == 5e-6


def test_step_time_by_hand():
    # free messages: (m + p - 1)(f + b); the tutorial's replay of p = m = 4,
    # f = 1, b = 2 is 21 units wide
    assert pipeline.step_time(4, 4, 1, 2, 0) == 21
    # c = 0.5 <= f, b: forward 1 + 3(1.5) + 3(1) = 8.5, backward 2 + 3(2.5) + 3(2)
    # = 15.5: 24 = 21 + 2 (p - 1) c
    assert pipeline.phase_time(4, 4, 1, 0.5) == 8.5
    assert pipeline.step_time(4, 4, 1, 2, 0.5) == 24
    # link-bound, p = 2, m = 3, f = b = 1, c = 2: stage 0 computes 0-1, 1-2, 2-3;
    # the link delivers at 3, 5, 7; stage 1 ends at 4, 6, 8 (phase 8); backward the same
    assert pipeline.phase_time(2, 3, 1, 2) == 8
    assert pipeline.step_time(2, 3, 1, 1, 2) == 16
    # one stage: no boundary, so no message, however slow the link
    assert pipeline.step_time(1, 3, 1, 2, 100) == 9


def _simulate_gpipe(p, m, f, b, c):
    """GPipe event by event: stage s runs F0..F(m-1) then B0..B(m-1), each when
    the stage is free and its input has arrived; each boundary's link carries
    one message at a time in each direction. Returns the step time."""
    done = {}
    for kind, t, order in (("F", f, range(p)), ("B", b, range(p - 1, -1, -1))):
        link_free = [0.0] * p
        for s in order:
            prev = s - 1 if kind == "F" else s + 1
            free = done.get(("F", s, m - 1), 0.0) if kind == "B" else 0.0
            for i in range(m):
                ready = 0.0
                if 0 <= prev < p:   # the message from the stage before
                    sent = done[(kind, prev, i)]
                    ready = link_free[prev] = max(link_free[prev], sent) + c
                elif kind == "B":
                    ready = done[("F", s, m - 1)]  # the last stage's own forwards
                free = done[(kind, s, i)] = max(free, ready) + t
    return max(done.values())


@pytest.mark.parametrize("p,m,f,b,c", [(4, 4, 1, 2, 0), (4, 8, 1, 2, 0.3), (3, 5, 1, 1, 2),
                                       (2, 6, 0.5, 2, 1), (5, 2, 1, 3, 0.1), (1, 4, 1, 2, 0)])
def test_closed_form_matches_an_event_simulation(p, m, f, b, c):
    assert pipeline.step_time(p, m, f, b, c) == pytest.approx(_simulate_gpipe(p, m, f, b, c))


def test_peak_activations():
    assert [pipeline.peak_activations("gpipe", 4, 8, s) for s in range(4)] == [8] * 4
    assert [pipeline.peak_activations("1f1b", 4, 8, s) for s in range(4)] == [4, 3, 2, 1]
    assert pipeline.peak_activations("1f1b", 4, 2) == 2   # m < p: all of them


def test_predict_by_hand():
    # p = 4, m = 4, 120 ms of compute (2/3 backward): f = 40/16 = 2.5 ms, b = 5 ms;
    # 32 samples / 4 = 8 x 1000 x 4 = 32000 bytes; c = 100 us + 32 us = 132 us;
    # step = 7 x 7.5 + 2 x 3 x 0.132 = 53.292 ms; ideal = 120 / 4 = 30 ms
    r = pipeline.predict(4, 4, 0.120, 32, 1000, 1e-4, 1e-9)
    assert r["forward_s"] == pytest.approx(2.5e-3) and r["backward_s"] == pytest.approx(5e-3)
    assert r["message_bytes"] == 32000 and r["message_s"] == pytest.approx(132e-6)
    assert r["p2p_bytes_per_step"] == 2 * 4 * 32000
    assert r["step_s"] == pytest.approx(53.292e-3) and r["ideal_s"] == pytest.approx(0.030)
    assert r["efficiency"] == pytest.approx(30 / 53.292) and r["bubble"] == pytest.approx(3 / 7)
    assert not r["link_bound"] and (r["activations_gpipe"], r["activations_1f1b"]) == (4, 4)


@pytest.mark.parametrize("call,words", [
    (lambda: pipeline.bubble_fraction(0, 4), "number of stages must be a positive integer"),
    (lambda: pipeline.bubble_fraction(4, 2.5), "micro-batches must be a positive integer"),
    (lambda: pipeline.message_time(10, -1, 1e-9), "alpha must be >= 0"),
    (lambda: pipeline.boundary_bytes(0, 1, 10), "the batch must be a positive integer"),
    (lambda: pipeline.peak_activations("zb", 4, 4), "schedule must be gpipe or 1f1b"),
    (lambda: pipeline.peak_activations("gpipe", 4, 4, 4), "stage must be 0..3"),
    (lambda: pipeline.predict(2, 2, 1, 4, 4, 0, 0, backward_share=1.5), "backward share"),
])
def test_bad_input(call, words):
    with pytest.raises(ValueError, match=words):
        call()


BASE = ["sim", "pipeline", "--stages", "4", "--batch", "32", "--activation-elements", "1000",
        "--step-compute-ms", "120", "--alpha", "100us", "--beta", "1GB/s"]


def test_cli_rows_and_json(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(BASE + ["--micro-batches", "1,4", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "(p-1)/(m+p-1)" in text and "53.292" in text, text   # the row worked out above
    rows = json.loads(out.read_text())["rows"]
    assert [r["micro_batches"] for r in rows] == [1, 4]
    assert rows[1]["step_s"] == pytest.approx(53.292e-3)


@pytest.mark.parametrize("args,words", [
    (["--stages", "0"], "number of stages must be a positive integer"),
    (["--micro-batches", "2,x"], "bad --micro-batches '2,x'"),
    (["--micro-batches", "0"], "micro-batches must be a positive integer"),
    (["--activation-elements", "wide"], "bad --activation-elements 'wide'"),
    (["--beta", "0GB/s"], "--beta bandwidth must be > 0"),
    (["--alpha", "soon"], "bad --alpha 'soon'"),
    (["--backward-share", "-0.1"], "backward share must be in 0..1"),
])
def test_cli_bad_input(args, words, capsys):
    assert main(BASE + args) == 2  # argparse: the last of a repeated flag wins
    err = capsys.readouterr()
    assert words in err.err and err.err.startswith("hpcdl: error:") and not err.out, err
    assert len(err.err.strip().splitlines()) == 1
