"""build.py - from a TrainConfig to the objects of a run: the model, the
optimizer (SGD, LARS, LARC over SGD, Adam, LAMB) with the learning rate scaled
to the global batch and its parameter groups (no weight decay on biases and
norm parameters where the recipe says so), its warmup + decay schedule, the
training loss (label smoothing) and the gradient compression."""
import torch
import torch.nn.functional as F

from .. import models
from .. import optim
from ..optim import scale_lr
from ..optim import warmup_schedule
from ..torch import Compression
from .errors import ConfigError


def build_model(cfg, ds):
    """A freshly initialised model for ds's samples (seed torch first)."""
    shape = tuple(ds.sample_shape)
    if cfg.model == "mlp":  # images are flattened by the model itself
        return models.build("mlp", shape if len(shape) > 1 else shape[0], ds.num_classes,
                            hidden=cfg.hidden)
    if cfg.model == "cnn1d":  # flat rows (B, L) read as one-channel sequences
        if len(shape) != 1:
            raise ConfigError("--model cnn1d takes flat sequences, but --data %s has samples "
                              "of shape %s; use --model mlp or a ResNet" % (cfg.data, shape))
        return models.build("cnn1d", shape[0], ds.num_classes)
    if ds.image_shape is None:
        raise ConfigError("--model %s takes images, but --data %s has flat samples; use "
                          "--model mlp or image data" % (cfg.model, cfg.data))
    net = models.build(cfg.model, ds.image_shape, ds.num_classes)
    if shape != tuple(ds.image_shape):  # flat rows (digits) seen as images
        net = torch.nn.Sequential(torch.nn.Unflatten(1, ds.image_shape), net)
    return net


def peak_lr(cfg):
    """base_lr scaled to the global batch by --lr-scaling (Goyal et al. 2017);
    adascale: base_lr, multiplied by each step's gain in the optimizer."""
    return scale_lr(cfg.base_lr, cfg.global_batch, base_batch=cfg.base_batch,
                    rule="none" if cfg.lr_scaling == "adascale" else cfg.lr_scaling)


def param_groups(cfg, model):
    """The optimizer's parameter groups when biases and norm parameters get no
    weight decay (and, with LARS / LARC / LAMB, no layer-wise adaptation: You
    et al. 2017, 2019): always with lars and lamb, else with
    --no-decay-bias-norm. None: one group, every parameter decayed."""
    if cfg.decays_bias_norm():
        return None
    return optim.exclude_bias_and_norm(model, weight_decay=cfg.weight_decay)


def build_optimizer(cfg, model, groups=None):
    """The local optimizer at the peak lr; DistributedOptimizer wraps it later.
    groups: param_groups() when made before the model changed (stage 3)."""
    lr = peak_lr(cfg)
    groups = param_groups(cfg, model) if groups is None else groups
    params = model.parameters() if groups is None else groups
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "lamb":
        return optim.LAMB(params, lr=lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "lars":
        trust = 0.001 if cfg.trust_coefficient is None else cfg.trust_coefficient
        return optim.LARS(params, lr=lr, momentum=cfg.momentum,
                          weight_decay=cfg.weight_decay, trust_coefficient=trust)
    sgd = torch.optim.SGD(params, lr=lr, momentum=cfg.momentum,
                          weight_decay=cfg.weight_decay)
    if cfg.optimizer == "larc":
        trust = 0.02 if cfg.trust_coefficient is None else cfg.trust_coefficient
        return optim.LARC(sgd, trust_coefficient=trust, clip=True)
    return sgd


def train_loss(cfg, logits, y):
    """The mean training loss of a batch: cross entropy against targets
    smoothed by --label-smoothing eps (1 - eps on the label, eps spread evenly
    over all classes; Szegedy et al. 2016). Evaluation uses plain cross entropy."""
    return F.cross_entropy(logits, y, label_smoothing=cfg.label_smoothing)


def build_schedule(cfg, opt, steps_per_epoch):
    """Per-step LR scheduler: warmup from --warmup-start-lr (default: base_lr,
    Goyal et al.'s start) to the scaled lr, then constant / step / poly / cosine."""
    start = None
    if cfg.warmup_epochs > 0:
        start = min(cfg.base_lr if cfg.warmup_start_lr is None else cfg.warmup_start_lr,
                    peak_lr(cfg))
    return warmup_schedule(opt, steps_per_epoch=steps_per_epoch, epochs=cfg.epochs,
                           warmup_epochs=cfg.warmup_epochs, warmup_start=start,
                           decay=cfg.schedule, milestones=cfg.milestones)


def build_compression(spec):
    """none | fp16 | bf16 | topk:RATIO -> a hpcdl.torch compressor."""
    if spec.startswith("topk:"):
        return Compression.topk(float(spec.split(":", 1)[1]))
    if spec in ("none", "fp16", "bf16"):
        return getattr(Compression, spec)
    raise ValueError(spec)

