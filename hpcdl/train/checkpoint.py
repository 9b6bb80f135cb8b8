"""checkpoint.py - the trainer's door to hpcdl/checkpoint/ (root.py: the
format, the checks, the save directories): the same calls with the
trainer's ConfigError and the model's whole shapes (a stage-3 model's too)."""
from ..checkpoint import root
from ..checkpoint.root import FORMAT, path_in, pieces_dir, resumed_path  # noqa: F401
from ..torch.zero.stage3 import shards_of
from .errors import ConfigError


class SaveDirs(root.SaveDirs):
    error_type = ConfigError


def shapes_of(model):
    """The model's tensors' shapes; a stage-3 model's whole, not its pieces."""
    shards = shards_of(model)
    if shards is not None:
        return shards.full_shapes()
    return {k: list(v.shape) for k, v in model.state_dict().items()}


def meta_of(cfg, model):
    return root.meta_of(cfg, shapes_of(model))


def save(path, state):
    root.save(path, state, ConfigError)


def load(path, cfg, model):
    return root.load(path, meta_of(cfg, model), ConfigError)
