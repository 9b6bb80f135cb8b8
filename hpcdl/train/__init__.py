"""hpcdl.train - the built-in trainer behind `hpcdl train`.

    from hpcdl.train import TrainConfig, train
    summary = train(TrainConfig(epochs=10))   # collective: run on every rank
"""
from .config import TrainConfig
from .errors import ConfigError

__all__ = ["ConfigError", "TrainConfig", "train"]


def train(cfg):
    """Runs cfg on this job's ranks; see trainer.train."""
    from .trainer import train as _train  # torch loads here, not on import
    return _train(cfg)
