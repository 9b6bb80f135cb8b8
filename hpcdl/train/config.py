"""config.py - TrainConfig: every setting of a training run, the checks that
say what to change, config files (YAML or TOML) with strict keys, and the
named recipes of configs/recipes/. Light on purpose (no torch): the CLI
checks a config before it launches ranks.

A config file holds the same names as the flags (dashes or underscores):

    # configs/digits-lars.yaml
    model: mlp
    global-batch: 1024
    optimizer: lars
    warmup-epochs: 5
    schedule: poly

A recipe (--recipe NAME, or `recipe: NAME` in a config file) is a file
configs/recipes/NAME.yaml of the same keys: the optimizer, its base lr at a
base batch, the scaling rule, warmup and decay, so that the global batch the
user picks sets the learning rate.

Precedence: TrainConfig defaults < recipe < config file < flags given on the
command line (resolve()).
"""
import os
from dataclasses import dataclass, fields

from .. import models
from .errors import ConfigError  # noqa: F401 - raised here, importable from here too

OPTIMIZERS = ("sgd", "lars", "larc", "adam", "lamb")
RECIPES = ("plain", "goyal", "lars", "lamb")
# package data, so an installed hpcdl has them; configs/recipes links here
RECIPE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "recipes")
SCHEDULES = ("constant", "step", "poly", "cosine")
LR_SCALING = ("none", "linear", "sqrt", "adascale")
PRECISIONS = ("fp32", "bf16", "fp16")
MODES = ("allreduce", "ps-bsp", "ps-asp", "ps-ssp", "ddp-gloo", "ddp-hpcdl")
ZERO_STAGES = (0, 1, 2, 3)
TRAIN_MODELS = models.NAMES + models.IMAGE_NAMES


@dataclass
class TrainConfig:
    # what to train
    model: str = "mlp"
    hidden: tuple = (256, 128)    # MLP hidden layer widths
    data: str = "digits"          # digits | synthetic:CxHxW:CLASSES:SAMPLES | shard directory
    test_fraction: float = 0.2    # held-out share of digits / synthetic data
    workers: int = 2              # DataLoader worker processes for shard directories
    stage_to: str = None          # copy shards to node-local storage first (e.g. /dev/shm)
    # how: batch, optimizer, learning rate
    recipe: str = None            # plain | goyal | lars | lamb: configs/recipes/NAME.yaml
    epochs: int = 30
    global_batch: int = 128       # samples per step over all ranks, split evenly; "auto":
                                  # re-picked per epoch for goodput (docs/goodput.md)
    max_global_batch: int = None  # the ceiling of --global-batch auto (default 16 x base_batch)
    repick_steps: int = 200  # --global-batch auto also re-picks every this many steps (0: epoch ends only)
    optimizer: str = "sgd"
    base_lr: float = 0.1          # the lr at base_batch; --lr-scaling scales it to global_batch
    base_batch: int = 256
    lr_scaling: str = "none"      # none: lr = base_lr; linear: x G/base_batch; sqrt;
                                  # adascale: x the AdaScale gain, epochs in base-batch progress
    momentum: float = 0.9         # SGD, LARS, LARC (LAMB and Adam: betas 0.9, 0.999)
    weight_decay: float = 0.0
    no_decay_bias_norm: bool = False  # biases and norm parameters get no weight decay
                                  # (always so with lars and lamb)
    label_smoothing: float = 0.0  # training loss: cross entropy with smoothed targets
    trust_coefficient: float = None  # LARS 0.001, LARC 0.02 when not given
    warmup_epochs: float = 0.0    # linear warmup from warmup_start_lr to the scaled lr
    warmup_start_lr: float = None  # default: base_lr (Goyal et al.'s gradual warmup)
    schedule: str = "constant"    # after warmup: constant | step | poly | cosine
    milestones: tuple = ()        # step schedule: epochs at which lr *= 0.1
    # how: communication and numerics
    compression: str = "none"     # none | fp16 | bf16 | topk:RATIO
    precision: str = "fp32"       # fp32 | bf16 | fp16 (autocast; fp16 with loss scaling)
    mode: str = "allreduce"       # allreduce | ps-bsp | ps-asp | ps-ssp | ddp-gloo | ddp-hpcdl
    staleness: int = 0            # SSP bound (steps a worker may run ahead)
    ps_ranks: int = 1             # parameter-server ranks in ps-* modes
    zero: int = 0                 # ZeRO stage (allreduce mode): 0 none, 1 optimizer state, 2 + grads, 3 + params
    seed: int = 0                 # weights, train/test split and per-epoch shuffles
    target_accuracy: float = None  # record time/steps/epochs until test accuracy >= this
    stop_at_target: bool = False  # end the run at the epoch the target is first reached
    # where
    checkpoint_dir: str = None    # checkpoint.pt here, every checkpoint_every epochs
    checkpoint_every: int = 1
    resume: str = None            # "auto" (checkpoint_dir's, if any) or a checkpoint path
    out: str = None               # metrics.jsonl, summary.json, curves.png, model.pt (rank 0)

    def __post_init__(self):
        """--global-batch auto starts at the base batch, its lr by AdaScale."""
        self.auto_batch = self.global_batch == "auto"
        if self.auto_batch:
            self.global_batch = self.base_batch
            if self.lr_scaling == "none":
                self.lr_scaling = "adascale"

    def check(self, size):
        """ConfigError, saying what to change, if this cannot run on size ranks."""
        for kind, name, names in (("model", self.model, TRAIN_MODELS),
                                  ("optimizer", self.optimizer, OPTIMIZERS),
                                  ("schedule", self.schedule, SCHEDULES),
                                  ("lr-scaling", self.lr_scaling, LR_SCALING),
                                  ("precision", self.precision, PRECISIONS),
                                  ("mode", self.mode, MODES)):
            if name not in names:
                raise ConfigError("unknown %s %r; use --%s with one of: %s"
                                  % (kind, name, kind, ", ".join(names)))
        if self.recipe is not None and self.recipe not in RECIPES \
                and not _is_file_name(self.recipe):
            raise ConfigError("unknown recipe %r; use --recipe with one of: %s (or a .yaml / "
                              ".toml file of the same keys)" % (self.recipe, ", ".join(RECIPES)))
        _positive("--epochs", self.epochs)
        _positive("--base-batch", self.base_batch)
        _positive("--checkpoint-every", self.checkpoint_every)
        if self.base_lr <= 0:
            raise ConfigError("--base-lr is %g; give a positive learning rate" % self.base_lr)
        self._check_recipe_values()
        self._check_ps(size)
        self._check_zero()
        self._check_ddp()
        _positive("--global-batch", self.global_batch)
        self._check_adascale(size)
        self._check_auto_batch()
        if self.global_batch % self._workers(size):
            w = self._workers(size)
            fits = [k for k in range(1, min(self.global_batch, 64) + 1)
                    if self.global_batch % k == 0]
            raise ConfigError("global batch %d does not divide evenly by %d %s; pick a "
                              "--global-batch that is a multiple of %d (a resumed run must "
                              "keep its checkpoint's global batch: then run on %s that "
                              "divide %d: %s)"
                              % (self.global_batch, w,
                                 "workers" if self.mode.startswith("ps-") else "ranks", w,
                                 "worker counts" if self.mode.startswith("ps-") else
                                 "rank counts", self.global_batch,
                                 ", ".join(map(str, fits))))
        if any(h < 1 for h in self.hidden):
            raise ConfigError("--hidden %s has a width below 1; give widths like 256,128"
                              % ",".join(map(str, self.hidden)))
        if self.warmup_epochs < 0 or self.warmup_epochs > self.epochs:
            raise ConfigError("--warmup-epochs %g must be between 0 and --epochs %d"
                              % (self.warmup_epochs, self.epochs))
        if self.resume not in (None, "auto") and not os.path.isfile(self.resume):
            raise ConfigError("--resume %s: no such checkpoint file" % self.resume)
        if self.resume == "auto" and not self.checkpoint_dir:
            raise ConfigError("--resume without a path needs --checkpoint-dir (where to "
                              "look for checkpoint.pt)")
        _check_compression(self.compression)
        from . import data  # names and paths of data sources
        data.check_source(self.data, self.model)

    def _check_recipe_values(self):
        if not 0 <= self.label_smoothing < 1:
            raise ConfigError("--label-smoothing %g must be in [0, 1) (0: none; 0.1 is usual)"
                              % self.label_smoothing)
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise ConfigError("--target-accuracy %g must be in (0, 1] (a test accuracy, e.g. "
                              "0.95)" % self.target_accuracy)
        if self.stop_at_target and self.target_accuracy is None:
            raise ConfigError("--stop-at-target needs --target-accuracy A (the accuracy to "
                              "stop at)")
        if self.weight_decay < 0:
            raise ConfigError("--weight-decay %g is negative; give 0 or more"
                              % self.weight_decay)
        if self.momentum < 0 or self.momentum >= 1:
            raise ConfigError("--momentum %g must be in [0, 1)" % self.momentum)
        if self.trust_coefficient is not None and self.trust_coefficient <= 0:
            raise ConfigError("--trust-coefficient %g must be positive" % self.trust_coefficient)
        if self.warmup_start_lr is not None and self.warmup_start_lr < 0:
            raise ConfigError("--warmup-start-lr %g is negative; give 0 or more"
                              % self.warmup_start_lr)

    def decays_bias_norm(self):
        """Whether biases and norm parameters get weight decay: never with the
        layer-wise lars / lamb, else unless --no-decay-bias-norm."""
        return not (self.no_decay_bias_norm or self.optimizer in ("lars", "lamb"))

    def _check_zero(self):
        if self.zero not in ZERO_STAGES:
            raise ConfigError("--zero %s: use 0 (unsharded), 1 (optimizer state sharded), "
                              "2 (optimizer state and gradients sharded) or 3 (parameters "
                              "too)" % (self.zero,))
        if self.zero and self.optimizer == "lamb":
            raise ConfigError("--optimizer lamb needs --zero 0: its trust ratio needs each "
                              "whole layer's Adam update, which no rank holds at --zero %d"
                              % self.zero)
        if self.zero and self.mode != "allreduce":
            raise ConfigError("--zero %d needs --mode allreduce (it shards the all-reduce "
                              "strategy's optimizer), not --mode %s" % (self.zero, self.mode))
        if self.zero == 3 and self.compression.startswith("topk"):
            raise ConfigError("--zero 3 compresses with fp16 or bf16 only, not --compression "
                              "%s: top-k keeps residuals of whole gradients, which no rank "
                              "holds at stage 3" % self.compression)

    def _check_ddp(self):
        """--mode ddp-*: torch DDP averages whole gradients (train/ddp_mode.py)."""
        if not self.mode.startswith("ddp-"):
            return
        if self.auto_batch or self.lr_scaling == "adascale":
            raise ConfigError("%s is not supported with --mode %s (AdaScale's gain needs hpcdl's "
                              "DistributedOptimizer); use --mode allreduce"
                              % ("--global-batch auto" if self.auto_batch else
                                 "--lr-scaling adascale", self.mode))
        if self.compression != "none":
            raise ConfigError("--compression %s is not supported with --mode %s (DDP "
                              "all-reduces whole gradients); use --compression none or "
                              "--mode allreduce" % (self.compression, self.mode))

    def _check_adascale(self, size):
        """--lr-scaling adascale takes its gain from the gradient noise scale,
        measured by the all-reduce strategy's DistributedOptimizer."""
        if self.lr_scaling != "adascale":
            return
        why = ("--mode %s (it needs the all-reduce strategy's optimizer)" % self.mode
               if self.mode != "allreduce" else
               "--zero 3 (use --zero 0, 1 or 2)" if self.zero == 3 else
               "--compression %s (the noise scale needs the whole averaged gradient: use "
               "none, fp16 or bf16)" % self.compression if self.compression.startswith("topk")
               else "1 rank (the gain compares each rank's gradient with their average: "
               "run on 2 or more)" if size < 2 else None)
        if why:  # under auto the user may never have named adascale: say where it came from
            raise ConfigError("%s does not work with %s" % (
                "--global-batch auto (its lr is AdaScale's)" if self.auto_batch
                else "--lr-scaling adascale", why))
        if self.global_batch < self.base_batch:
            raise ConfigError("--lr-scaling adascale needs --global-batch (%d) >= --base-batch "
                              "(%d): the gain scales the base batch's lr up, never down"
                              % (self.global_batch, self.base_batch))

    def _check_auto_batch(self):
        if self.repick_steps < 0:
            raise ConfigError("--repick-steps %d: give 0 (re-pick only at epoch ends) or a "
                              "positive step count" % self.repick_steps)
        if not self.auto_batch:
            if self.max_global_batch is not None:
                raise ConfigError("--max-global-batch is the ceiling of --global-batch auto; "
                                  "give --global-batch auto or leave it out")
            return
        if self.lr_scaling != "adascale":
            raise ConfigError("--global-batch auto takes its lr from AdaScale: use "
                              "--lr-scaling adascale (or none), not %s" % self.lr_scaling)
        if self.max_global_batch is not None and self.max_global_batch < self.base_batch:
            raise ConfigError("--max-global-batch %d is below --base-batch %d; --global-batch "
                              "auto picks between them" % (self.max_global_batch,
                                                           self.base_batch))

    def _workers(self, size):
        return size - self.ps_ranks if self.mode.startswith("ps-") else size

    def _check_ps(self, size):
        if self.staleness < 0:
            raise ConfigError("--staleness %d is impossible; give 0 (BSP) or more"
                              % self.staleness)
        if not self.mode.startswith("ps-"):
            return
        if self.ps_ranks < 1 or self.ps_ranks >= size:
            raise ConfigError("--ps-ranks %d with %d ranks: parameter-server mode needs at "
                              "least one server and one worker (1 <= --ps-ranks < ranks)"
                              % (self.ps_ranks, size))
        for flag, bad in (("--precision", self.precision != "fp32"),
                          ("--compression", self.compression != "none"),
                          ("--optimizer", self.optimizer != "sgd"),
                          ("--label-smoothing", self.label_smoothing != 0),
                          ("--no-decay-bias-norm", self.no_decay_bias_norm)):
            if bad:
                raise ConfigError("%s is not supported with --mode %s (the servers apply "
                                  "plain SGD with momentum in fp32)" % (flag, self.mode))


def _check_compression(spec):
    try:
        if spec.startswith("topk:"):
            if not 0 < float(spec.split(":", 1)[1]) <= 1:
                raise ValueError
        elif spec not in ("none", "fp16", "bf16"):
            raise ValueError
    except ValueError:
        raise ConfigError("unknown --compression %r; use none, fp16, bf16 or topk:RATIO "
                          "with 0 < RATIO <= 1 (e.g. topk:0.01)" % spec)


def _positive(flag, value):
    if value < 1:
        raise ConfigError("%s is %d; give 1 or more" % (flag, value))


# ---------------------------------------------------------------- config files
FIELDS = {f.name: f for f in fields(TrainConfig)}


def load_file(path):
    """{field: value} from a YAML (.yaml/.yml) or TOML (.toml) file; unknown keys
    and values of the wrong kind raise ConfigError naming them."""
    if not os.path.isfile(path):
        raise ConfigError("config file %s does not exist" % path)
    try:
        if path.endswith(".toml"):
            import tomllib
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        elif path.endswith((".yaml", ".yml")):
            import yaml
            with open(path) as f:
                raw = yaml.safe_load(f) or {}
        else:
            raise ConfigError("config file %s: name it .yaml, .yml or .toml" % path)
    except ConfigError:
        raise
    except Exception as e:  # the parser's own message says where
        raise ConfigError("config file %s does not parse: %s" % (path, e))
    if not isinstance(raw, dict):
        raise ConfigError("config file %s must hold key: value pairs" % path)
    return {_field(path, k): _coerce(path, k, v) for k, v in raw.items()}


def _field(path, key):
    name = str(key).replace("-", "_")
    if name not in FIELDS or name == "resume":
        known = ", ".join(sorted(k.replace("_", "-") for k in FIELDS if k != "resume"))
        raise ConfigError("config file %s: unknown key %r (known keys: %s)"
                          % (path, key, known))
    return name


def _coerce(path, key, value):
    """The value as the field's declared type: lists become tuples of ints."""
    kind = FIELDS[_field(path, key)].type
    if _field(path, key) == "global_batch" and value == "auto":
        return value
    try:
        if kind is tuple:
            items = value.split(",") if isinstance(value, str) else list(value)
            return tuple(int(v) for v in items if str(v).strip())
        if value is None:
            return None
        if kind is bool:
            return parse_bool(value)
        if kind is int and not float(value).is_integer():
            raise ValueError(value)
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError("config file %s: %s = %r is not a%s %s"
                          % (path, key, value, "n" if kind is int else "",
                             "list of integers" if kind is tuple else
                             "boolean (true or false)" if kind is bool else kind.__name__))


def parse_bool(value):
    """True / False from a bool or from true|false|yes|no|on|off|1|0 (any case)."""
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in ("true", "yes", "on", "1"):
        return True
    if word in ("false", "no", "off", "0"):
        return False
    raise ValueError(value)


# ---------------------------------------------------------------- recipes
def _is_file_name(recipe):
    return str(recipe).endswith((".yaml", ".yml", ".toml"))


def recipe_path(recipe):
    """The file of a recipe name (configs/recipes/NAME.yaml) or a recipe file."""
    if _is_file_name(recipe):
        return recipe
    if recipe not in RECIPES:
        raise ConfigError("unknown recipe %r; use --recipe with one of: %s (or a .yaml / "
                          ".toml file of the same keys)" % (recipe, ", ".join(RECIPES)))
    return os.path.join(RECIPE_DIR, recipe + ".yaml")


def load_recipe(recipe):
    """{field: value} of a recipe, checked like a config file; a recipe names
    no other recipe and no paths of a run."""
    path = recipe_path(recipe)
    values = load_file(path)
    for key in ("recipe", "out", "checkpoint_dir", "data", "stage_to"):
        if key in values:
            raise ConfigError("recipe %s sets %s; a recipe holds only how to train (optimizer, "
                              "lr at a base batch, scaling, warmup, decay, regularisation)"
                              % (path, key.replace("_", "-")))
    return values


def resolve(file_values=None, flag_values=None):
    """The TrainConfig of defaults < recipe < config file < flags, where the
    recipe is the flags' --recipe, else the config file's recipe key. The
    recipe's values bend to the run where they would not fit it
    (fit_recipe); cfg.recipe_notes says how, for recipe_lines."""
    file_values, flag_values = dict(file_values or {}), dict(flag_values or {})
    recipe = flag_values.get("recipe", file_values.get("recipe"))
    values = load_recipe(recipe) if recipe is not None else {}
    user = dict(file_values, **flag_values)  # what the user named: file or flags
    values.update(user)
    values["recipe"] = recipe
    notes = fit_recipe(values, user) if recipe is not None else []
    cfg = TrainConfig(**values)
    cfg.recipe_applied = True
    cfg.recipe_notes = notes
    return cfg


# a recipe's warmup takes at most this share of --epochs (fit_recipe)
RECIPE_WARMUP_SHARE = 0.5


def fit_recipe(values, user):
    """Changes values (the recipe's, under the user's) where a recipe's value
    does not fit the run; returns one line per change. A value the user named
    (config file or flag) is never changed: TrainConfig.check judges it.
    - --global-batch auto takes its lr from AdaScale: the recipe's scaling
      rule gives way to adascale (a --lr-scaling the user named stays, and is
      checked).
    - The recipe's warmup is capped at RECIPE_WARMUP_SHARE of --epochs, so
      a short run keeps time to decay (lamb's 5 epochs in a 3-epoch run: 1.5)."""
    notes = []
    if values.get("global_batch") == "auto" and "lr_scaling" not in user \
            and values.get("lr_scaling", "none") not in ("none", "adascale"):
        notes.append("--global-batch auto: lr by AdaScale, not the recipe's %s scaling "
                     "(auto always takes its lr from AdaScale)" % values.pop("lr_scaling"))
    epochs = values.get("epochs", TrainConfig.epochs)
    warmup = values.get("warmup_epochs", 0) or 0
    if "warmup_epochs" not in user and isinstance(epochs, int) and epochs > 0 \
            and warmup > RECIPE_WARMUP_SHARE * epochs:
        values["warmup_epochs"] = RECIPE_WARMUP_SHARE * epochs
        notes.append("the recipe's warmup of %g epochs scaled to %g, half of --epochs %d "
                     "(--warmup-epochs overrides)" % (warmup, values["warmup_epochs"], epochs))
    return notes


def with_recipe(cfg):
    """cfg with its recipe's values applied, for a TrainConfig(recipe=...)
    made in Python rather than by resolve(): its fields that differ from the
    defaults win over the recipe, the others take the recipe's values."""
    if cfg.recipe is None or getattr(cfg, "recipe_applied", False):
        return cfg
    values = {name: getattr(cfg, name) for name, f in FIELDS.items()
              if getattr(cfg, name) != f.default}
    if getattr(cfg, "auto_batch", False):
        values["global_batch"] = "auto"
    return resolve({}, values)


def recipe_lines(cfg, peak_lr):
    """What rank 0 prints at start: the recipe's values as they ran (after the
    config file and flags), and the lr they give at this global batch."""
    if cfg.recipe is None:
        return []
    rule = {"linear": "x %g/%d" % (cfg.global_batch, cfg.base_batch),
            "sqrt": "x sqrt(%g/%d)" % (cfg.global_batch, cfg.base_batch),
            "none": "unscaled",
            "adascale": "x the AdaScale gain, in [1, %g]" % (cfg.global_batch / cfg.base_batch)
            }[cfg.lr_scaling]
    start = cfg.base_lr if cfg.warmup_start_lr is None else cfg.warmup_start_lr
    text = ["recipe %s (%s):" % (cfg.recipe, recipe_path(cfg.recipe)),
            "  %s, base lr %g at batch %d, %s scaling -> lr %g at global batch %d (%s)"
            % (cfg.optimizer, cfg.base_lr, cfg.base_batch, cfg.lr_scaling, peak_lr,
               cfg.global_batch, rule),
            "  warmup %g epoch(s)%s, then %s decay%s; weight decay %g%s; label smoothing %g"
            % (cfg.warmup_epochs, " from lr %g" % min(start, peak_lr) if cfg.warmup_epochs
               else "", cfg.schedule, " at epochs %s" % ",".join(map(str, cfg.milestones))
               if cfg.milestones else "", cfg.weight_decay,
               "" if cfg.decays_bias_norm() else " (not on biases and norm parameters)",
               cfg.label_smoothing)]
    if cfg.optimizer in ("sgd", "lars", "larc"):
        text[-1] += "; momentum %g" % cfg.momentum
    if cfg.optimizer in ("lars", "larc"):
        trust = cfg.trust_coefficient
        text[-1] += "; trust coefficient %g" % (
            trust if trust is not None else 0.001 if cfg.optimizer == "lars" else 0.02)
    return text + ["  " + note for note in getattr(cfg, "recipe_notes", ())]
