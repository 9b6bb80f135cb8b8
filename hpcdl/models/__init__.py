"""hpcdl.models - the models `hpcdl train --model NAME` can build, by name.

    from hpcdl import models
    net = models.build("mlp", in_features=64, num_classes=10, hidden=(256, 128))
"""

# name -> builder(in_features, num_classes, **options); imported on use so
# that listing the names (the CLI does, before launching) does not load torch
NAMES = ("mlp",)


def build(name, in_features, num_classes, **options):
    """A freshly initialised model (seed torch first for identical weights)."""
    if name == "mlp":
        from .mlp import MLP
        return MLP(in_features, num_classes, **options)
    raise ValueError("unknown model %r; use one of: %s" % (name, ", ".join(NAMES)))
