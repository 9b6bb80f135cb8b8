"""test_train_curves.py - curves.png from metrics.jsonl (hpcdl/train/report.py
plot_curves): B_simple, with --lr-scaling adascale the AdaScale gain, and with
--global-batch auto the global batch get panels of their own holding the
records' values; runs without them get none."""
import json
import math

import matplotlib
import pytest

from hpcdl.train.report import plot_curves

matplotlib.use("Agg")


def _record(epoch, **extra):
    return dict(epoch=epoch, loss=1.0 / epoch, test_loss=1.1 / epoch, accuracy=0.5 + epoch / 10,
                test_accuracy=0.45 + epoch / 10, lr=0.1 * epoch, samples_per_s=1000.0, **extra)


def _plot(tmp_path, monkeypatch, recs):
    """Writes recs to metrics.jsonl, plots curves.png; returns {title: y values}."""
    from matplotlib.figure import Figure
    figures = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig",
                        lambda fig, *a, **k: (figures.append(fig), save(fig, *a, **k))[1])
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in recs))
    png = tmp_path / "curves.png"
    plot_curves(str(metrics), str(png))
    assert png.stat().st_size > 0 and len(figures) == 1
    return {ax.get_title(): [list(line.get_ydata()) for line in ax.get_lines()]
            for ax in figures[0].axes}


def test_gain_and_b_simple_panels(tmp_path, monkeypatch):
    recs = [_record(1, b_simple=120.0, gain=3.5), _record(2, b_simple=250.0, gain=5.25),
            _record(3, b_simple=None, gain=None)]  # an epoch whose estimate was unusable
    panels = _plot(tmp_path, monkeypatch, recs)
    gain = [v for t, v in panels.items() if "gain" in t]
    noise = [v for t, v in panels.items() if "B_simple" in t]
    assert len(gain) == 1 and len(noise) == 1, list(panels)
    (ys,), (bs,) = gain[0], noise[0]
    assert ys[:2] == [3.5, 5.25] and math.isnan(ys[2])
    assert bs[:2] == [120.0, 250.0] and math.isnan(bs[2])
    assert len(panels) == 5


@pytest.mark.parametrize("extra,panels", [({}, 3), ({"b_simple": 80.0}, 4)])
def test_no_gain_no_gain_panel(tmp_path, monkeypatch, extra, panels):
    """One rank (no B_simple) and plain all-reduce (B_simple, no gain)."""
    got = _plot(tmp_path, monkeypatch, [_record(1, **extra), _record(2, **extra)])
    assert len(got) == panels and not any("gain" in t for t in got), list(got)


def test_global_batch_panel_under_auto(tmp_path, monkeypatch):
    """--global-batch auto: the batch each epoch ended at gets a panel."""
    recs = [_record(1, b_simple=100.0, gain=1.0, global_batch=64, next_global_batch=512),
            _record(2, b_simple=900.0, gain=6.0, global_batch=512, next_global_batch=1024)]
    panels = _plot(tmp_path, monkeypatch, recs)
    batch = [v for t, v in panels.items() if "global batch" in t]
    assert len(batch) == 1 and batch[0] == [[64, 512]] and len(panels) == 6, list(panels)
