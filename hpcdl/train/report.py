"""report.py - what rank 0 shows and writes during training: a tqdm bar per
epoch on a terminal (a plain progress line every PLAIN_EVERY_S seconds
otherwise, as in a Slurm output file), one line per epoch, metrics.jsonl,
curves.png (loss, accuracy, learning rate and, on 2+ ranks, the gradient
noise scale B_simple and, with --lr-scaling adascale, the AdaScale gain
against epoch), summary.json and
model.pt at the end. Other ranks get a Reporter that does nothing."""
import hashlib
import json
import os
import sys
import time

import torch
from tqdm import tqdm

from .. import comm
from ..utils.atomic import atomic_open, write_json

PLAIN_EVERY_S = 30.0


class Reporter:
    def __init__(self, cfg, resumed):
        self.cfg = cfg
        self.lead = comm.rank() == 0
        self.metrics = None
        if self.lead and cfg.out:
            os.makedirs(cfg.out, exist_ok=True)
            if not resumed:
                keep_earlier_run(cfg.out)
            # a resumed run continues the file; a fresh one starts it over
            self.metrics = open(os.path.join(cfg.out, "metrics.jsonl"), "a" if resumed else "w")
        elif self.lead:
            comm.print0("hpcdl train: no --out given: metrics.jsonl, summary.json, curves.png "
                        "and model.pt are not written (give --out DIR to keep them)")
        self.bar = None
        self._last_plain = 0.0
        self._noise_said = False

    # ------------------------------------------------------------ progress
    def start_epoch(self, epoch, steps, done):
        """Also within an epoch, when --global-batch auto cut its rest anew."""
        if not self.lead:
            return
        if self.bar is not None:
            self.bar.close()
        if sys.stderr.isatty():
            self.bar = tqdm(total=steps, initial=done, desc=self.epoch_of(epoch),
                            unit="step", leave=False, dynamic_ncols=True)
        self._last_plain = time.monotonic()
        self._epoch, self._steps = epoch, steps

    def epoch_of(self, epoch):
        """'epoch 3/5'; with AdaScale (--lr-scaling adascale, and so --global-batch
        auto) the run ends at its progress, not after --epochs passes over the
        data, so 'epoch 7' alone (issue 38: 'epoch 7/5' confused)."""
        if getattr(self.cfg, "lr_scaling", None) == "adascale":
            return "epoch %d" % epoch
        return "epoch %d/%d" % (epoch, self.cfg.epochs)

    def step(self, step, loss):
        if not self.lead:
            return
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss="%.4f" % loss, refresh=False)
        elif time.monotonic() - self._last_plain >= PLAIN_EVERY_S:
            self._last_plain = time.monotonic()
            comm.print0("  epoch %d step %d/%d  loss %.4f"
                        % (self._epoch, step + 1, self._steps, loss))

    def end_epoch(self, rec):
        if not self.lead:
            return
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        noise = "  B_simple %.4g" % rec["b_simple"] if rec.get("b_simple") else ""
        if noise and not self._noise_said:  # what the number is, once
            comm.print0("hpcdl train: B_simple below is the gradient noise scale (samples): "
                        "batches much larger than it gain little per sample "
                        "(docs/noise_scale.md); summary.json keeps the last one")
            self._noise_said = True
        if rec.get("base_steps"):  # AdaScale: where the run stands is its progress
            head = "epoch %3d (progress %d/%d steps of batch %d)" % (
                rec["epoch"], rec["scale_invariant_steps"], rec["base_steps"],
                self.cfg.base_batch)
        else:
            head = "epoch %3d/%d" % (rec["epoch"], self.cfg.epochs)
        comm.print0(head + "  loss %.4f  acc %.4f  test_acc %.4f  lr %.4g  samples/s %.0f"
                    % (rec["loss"], rec["accuracy"], rec["test_accuracy"], rec["lr"],
                       rec["samples_per_s"]) + noise)
        if self.metrics is not None:
            self.metrics.write(json.dumps(rec) + "\n")
            self.metrics.flush()  # readable while training runs

    def close(self):
        if self.bar is not None:
            self.bar.close()
        if self.metrics is not None:
            self.metrics.close()

    # ------------------------------------------------------------ the end
    def finish(self, summary, model):
        comm.print0("# summary")
        for label, key, fmt in (("test accuracy", "test_accuracy", "%.4f"),
                                ("test loss", "test_loss", "%.4f"),
                                ("samples/s", "samples_per_s", "%.0f"),
                                ("wall time (s)", "wall_s", "%.2f"),
                                ("ranks", "ranks", "%d"),
                                ("global batch", "global_batch", "%d"),
                                ("params sha256", "params_sha256", "%s")):
            comm.print0("%-14s " % label + fmt % summary[key] + (
                "  (%s)" % wall_text(summary["wall_parts_s"])
                if key == "wall_s" and summary.get("wall_parts_s") else ""))
        if summary.get("b_simple") is not None:
            comm.print0("%-14s %.4g samples (gradient noise scale B_simple, last epoch)"
                        % ("noise scale", summary["b_simple"]))
        if summary.get("target_accuracy") is not None:
            comm.print0("%-14s %s" % ("to test acc %g" % summary["target_accuracy"],
                                      target_text(summary)))
        if not (self.lead and self.cfg.out):
            return
        write_json(os.path.join(self.cfg.out, "summary.json"), summary, indent=1)
        with atomic_open(os.path.join(self.cfg.out, "model.pt")) as f:
            torch.save(model.state_dict(), f)
        plot_curves(os.path.join(self.cfg.out, "metrics.jsonl"),
                    os.path.join(self.cfg.out, "curves.png"))


RUN_FILES = ("metrics.jsonl", "summary.json", "curves.png", "model.pt")


def keep_earlier_run(out):
    """A fresh run into an --out that holds an earlier run's files moves them
    into out/earlier-<time of its metrics>/ and says so, instead of silently
    writing over them."""
    found = [f for f in RUN_FILES if os.path.exists(os.path.join(out, f))]
    if not found:
        return
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(
        os.path.getmtime(os.path.join(out, found[0]))))
    keep = os.path.join(out, "earlier-" + stamp)
    os.makedirs(keep, exist_ok=True)
    for f in found:
        os.replace(os.path.join(out, f), os.path.join(keep, f))
    comm.print0("hpcdl train: %s held an earlier run; its %s moved to %s"
                % (out, ", ".join(found), keep))


def wall_text(parts):
    """'training 1.04, evaluation 0.31, checkpoints 0.00, start-up and other 21.67'."""
    return ", ".join("%s %.2f" % (name.replace("_", " ").replace("start up", "start-up"), s)
                     for name, s in parts.items())


def target_text(summary):
    """'12.34 s training (+1.20 s evaluation), 340 steps, 5 epochs' or 'not reached'."""
    if summary["time_to_target_s"] is None:
        return "not reached"
    return ("%.2f s training (+%.2f s evaluation), %d steps, %d epoch(s)"
            % (summary["time_to_target_s"], summary["eval_time_to_target_s"],
               summary["steps_to_target"], summary["epochs_to_target"]))


def params_digest(model):
    """sha256 over every parameter and buffer, in state_dict order: equal
    digests mean bit-identical models."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def plot_curves(metrics_path, png_path):
    """Loss, accuracy (train and test) and learning rate against epoch, under
    a title naming the run (its --out directory) and, from summary.json
    beside it when there, what ran."""
    import matplotlib  # on use: loads matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # on use: loads matplotlib
    from matplotlib.ticker import MaxNLocator  # on use: loads matplotlib
    with open(metrics_path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    if not recs:
        return
    ep = [r["epoch"] for r in recs]
    panels = [(("loss", "test_loss"), "loss"), (("accuracy", "test_accuracy"), "accuracy"),
              (("lr",), "learning rate (end of epoch)")]
    if any(r.get("b_simple") is not None for r in recs):  # 2+ ranks (docs/noise_scale.md)
        panels.append((("b_simple",), "gradient noise scale B_simple (samples)"))
    if any(r.get("gain") is not None for r in recs):  # --lr-scaling adascale (docs/adascale.md)
        panels.append((("gain",), "AdaScale gain r (x base lr, end of epoch)"))
    if any(r.get("next_global_batch") is not None for r in recs):  # --global-batch auto
        panels.append((("global_batch",), "global batch (at the epoch's end)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.9))
    for ax, (keys, title) in zip(axes, panels):
        for k in keys:
            ax.plot(ep, [r.get(k) if r.get(k) is not None else float("nan") for r in recs],
                    marker=".", label="test" if k.startswith("test") else "train")
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend()
    fig.suptitle(_run_title(os.path.dirname(os.path.abspath(png_path))))
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def _run_title(out_dir):
    """'run NAME: mlp on digits, 4 ranks, global batch 128, sgd, fp32' (what
    summary.json in out_dir says; just the name without it)."""
    title = "run %s" % os.path.basename(out_dir)
    try:
        with open(os.path.join(out_dir, "summary.json")) as f:
            s = json.load(f)
        title += ": %s on %s, %d rank(s), global batch %d, %s, %s" % (
            s["model"], s["data"], s["ranks"], s["global_batch"], s["optimizer"],
            s["precision"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return title


def global_sums(*values):
    """Sums each value over ranks (one small float64 all-reduce; collective):
    the reported loss, accuracy and times, and goodput's means."""
    t = torch.tensor(values, dtype=torch.float64)
    comm.allreduce(t, op="sum")
    return t.tolist()
