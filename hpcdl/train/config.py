"""config.py - TrainConfig: every setting of a training run, with its checks.
Light on purpose (no torch): the CLI checks a config before it launches ranks."""
from dataclasses import dataclass

from .. import models
from . import data

OPTIMIZERS = ("sgd",)


class ConfigError(ValueError):
    """A setting that cannot work; the message says what to change."""


@dataclass
class TrainConfig:
    # what to train
    model: str = "mlp"
    hidden: tuple = (256, 128)    # MLP hidden layer widths
    data: str = "digits"
    test_fraction: float = 0.2    # share of the data set held out for testing
    # how
    epochs: int = 30
    global_batch: int = 128       # samples per step over all ranks, split evenly
    base_lr: float = 0.1
    optimizer: str = "sgd"
    momentum: float = 0.9
    seed: int = 0                 # weights, train/test split and per-epoch shuffles
    out: str = None               # directory for metrics.jsonl (rank 0), or None

    def check(self, size):
        """ConfigError, saying what to change, if this cannot run on size ranks."""
        if self.epochs < 1:
            raise ConfigError("--epochs is %d; give 1 or more" % self.epochs)
        if self.global_batch < 1 or self.global_batch % size:
            raise ConfigError("global batch %d does not divide evenly by %d ranks; pick a "
                              "--global-batch that is a multiple of %d"
                              % (self.global_batch, size, size))
        if self.base_lr <= 0:
            raise ConfigError("--base-lr is %g; give a positive learning rate" % self.base_lr)
        if any(h < 1 for h in self.hidden):
            raise ConfigError("--hidden %s has a width below 1; give widths like 256,128"
                              % ",".join(map(str, self.hidden)))
        for kind, name, names in (("model", self.model, models.NAMES),
                                  ("data", self.data, data.NAMES),
                                  ("optimizer", self.optimizer, OPTIMIZERS)):
            if name not in names:
                raise ConfigError("unknown %s %r; use --%s with one of: %s"
                                  % (kind, name, kind, ", ".join(names)))
