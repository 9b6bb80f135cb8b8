"""groups.py - parameter groups for large-batch training: biases and
normalisation-layer parameters get neither LARS adaptation nor weight decay
(as in Goyal et al. 2017 and most LARS recipes); their norms are tiny or
meaningless as a scale, and decaying them only hurts."""
import torch.nn as nn

# BatchNorm (any dimension, SyncBatchNorm) and InstanceNorm derive from _NormBase
NORM_LAYERS = tuple(t for t in (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm,
                                getattr(nn, "RMSNorm", None)) if t is not None)


def exclude_bias_and_norm(model, weight_decay=None):
    """Splits model's trainable parameters into two param groups:

      [{"params": weights, "weight_decay": weight_decay},      # adapted, decayed
       {"params": biases_and_norm, "weight_decay": 0.0, "lars_adaptation": False}]

    Excluded: every parameter with ndim <= 1 (biases, norm scales and shifts)
    and every parameter of a normalisation layer (BatchNorm, SyncBatchNorm,
    InstanceNorm, LayerNorm, GroupNorm, RMSNorm). weight_decay=None leaves the
    first group's decay to the optimizer's default. Empty groups are left out.
    Works with LARS, LARC and plain torch optimizers (extra keys are ignored).
    """
    if not isinstance(model, nn.Module):
        raise TypeError("exclude_bias_and_norm takes an nn.Module, got %s"
                        % type(model).__name__)
    in_norm = {id(p) for m in model.modules() if isinstance(m, NORM_LAYERS)
               for p in m.parameters(recurse=False)}
    decayed, excluded = [], []
    for p in model.parameters():  # shared parameters come once
        if p.requires_grad:
            (excluded if p.ndim <= 1 or id(p) in in_norm else decayed).append(p)
    if not decayed and not excluded:
        raise ValueError("the model has no trainable parameters (requires_grad=True)")
    main = {"params": decayed}
    if weight_decay is not None:
        main["weight_decay"] = weight_decay
    rest = {"params": excluded, "weight_decay": 0.0, "lars_adaptation": False}
    return [g for g in (main, rest) if g["params"]]
