"""hpcdl.models - the models `hpcdl train --model NAME` can build, by name,
and the image models the examples (examples/) build the same way.

    from hpcdl import models
    net = models.build("mlp", in_features=64, num_classes=10, hidden=(256, 128))
    net = models.build("cnn1d", in_features=40, num_classes=10)   # MNIST-1D's CNN shape
    net = models.build("resnet18", in_features=(3, 32, 32), num_classes=10)

in_features is the shape of one sample: an int F for flat rows (B, F), or
(C, H, W) for images (B, C, H, W). The MLP flattens images; ResNets need them;
cnn1d reads flat rows (B, L) as one-channel sequences of length L.
"""

# name -> builder(in_features, num_classes, **options); imported on use so
# that listing the names (the CLI does, before launching) does not load torch.
# NAMES are the ones `hpcdl train` trains: flat rows, and no batch norm, so N
# ranks follow one process's path. IMAGE_NAMES need (C, H, W) samples.
NAMES = ("mlp", "cnn1d")
IMAGE_NAMES = ("resnet18", "resnet50")
ALL_NAMES = NAMES + IMAGE_NAMES


def build(name, in_features, num_classes, **options):
    """A freshly initialised model (seed torch first for identical weights).

    mlp options: hidden. cnn1d options: channels. resnet options: small_input
    (default: the CIFAR stem for images up to 64x64, else the ImageNet stem),
    norm_layer."""
    if name == "mlp":
        from .mlp import MLP  # on use: loads numpy and torch and tqdm
        if isinstance(in_features, int):
            return MLP(in_features, num_classes, **options)
        from torch import nn  # on use: loads torch
        width = 1
        for d in in_features:
            width *= d
        return nn.Sequential(nn.Flatten(), MLP(width, num_classes, **options))
    if name == "cnn1d":
        from .cnn1d import CNN1D  # on use: loads numpy and torch and tqdm
        if not isinstance(in_features, int):
            raise ValueError("cnn1d takes sequences: give in_features as the length L of flat "
                             "rows (B, L), e.g. 40, not %r" % (in_features,))
        return CNN1D(in_features, num_classes, **options)
    if name in IMAGE_NAMES:
        from . import resnet  # on use: loads numpy and torch and tqdm
        if isinstance(in_features, int) or len(in_features) != 3:
            raise ValueError("%s takes images: give in_features as (C, H, W), e.g. "
                             "(3, 32, 32), not %r" % (name, in_features))
        c, h, w = in_features
        options.setdefault("small_input", h <= 64 and w <= 64)
        return getattr(resnet, name)(num_classes, in_channels=c, **options)
    raise ValueError("unknown model %r; use one of: %s" % (name, ", ".join(ALL_NAMES)))
