"""config.py - the settings of a parameter-server run and their checks.

Pure functions of the job size and the settings, so every rank reaches the
same verdict without talking to the others (a bad setting is an error on every
rank, never a hang), and the CLI can check before it launches ranks.
"""
import operator
from dataclasses import dataclass

MODES = ("bsp", "asp", "ssp")
OPTIMIZERS = ("sgd",)  # the servers' update rule; see rules.py


class PSConfigError(ValueError):
    """A parameter-server setting that cannot work; the message says what to change."""


def check(size, mode, staleness, ps_ranks):
    """Returns the staleness bound to use (0 for bsp, None for asp); raises
    PSConfigError, naming the flag, if the settings cannot run on size ranks."""
    if mode not in MODES:
        raise PSConfigError("unknown parameter-server mode %r; use one of: %s (--mode ps-bsp, "
                            "ps-asp or ps-ssp)" % (mode, ", ".join(MODES)))
    k, s = _integer(ps_ranks), _integer(staleness)
    if k is None or k < 1:
        raise PSConfigError("--ps-ranks is %r; give 1 or more server ranks" % (ps_ranks,))
    if size < 2:
        raise PSConfigError("parameter-server training needs at least 2 ranks (a server and a "
                            "worker); the job has %d; start it with -n 2 or more" % size)
    if k >= size:
        raise PSConfigError(
            "--ps-ranks %d leaves no worker: the job has %d rank(s) and needs at least one "
            "rank more than it has servers; use --ps-ranks %d or fewer, or start more ranks"
            % (k, size, max(size - 1, 0)))
    if s is not None and s < 0:
        raise PSConfigError("--staleness is %r; the SSP bound counts steps, give 0 or more "
                            "(0 is BSP)" % (staleness,))
    if mode == "ssp":
        if s is None:
            raise PSConfigError("ps-ssp needs --staleness S: how many steps a worker may "
                                "run ahead of the slowest one (0 is BSP)")
        return s
    if s:
        raise PSConfigError("--staleness %d only applies to ps-ssp (ps-%s %s); drop it or "
                            "use --mode ps-ssp" % (s, mode, "never waits"
                                                   if mode == "asp" else "always waits"))
    return 0 if mode == "bsp" else None


@dataclass(frozen=True)
class Layout:
    """Who does what in a parameter-server job and the rule it trains by; the
    same on every rank. Ranks 0..num_servers-1 serve, the next num_workers
    ranks are workers (worker w is rank num_servers + w)."""
    num_servers: int
    num_workers: int
    mode: str                  # bsp | asp | ssp
    staleness: int = None      # ssp's bound; 0 for bsp, None for asp
    momentum: float = 0.0      # the servers' SGD
    weight_decay: float = 0.0
    record: bool = False       # servers log every push and answer (clock.replay)

    @classmethod
    def of(cls, size, mode="bsp", staleness=None, ps_ranks=1, momentum=0.0,
           weight_decay=0.0, record=False):
        """The layout of a job of size ranks; PSConfigError (check()) if the
        settings cannot run there."""
        bound = check(size, mode, staleness, ps_ranks)
        return cls(ps_ranks, num_workers(size, ps_ranks), mode, bound, momentum, weight_decay,
                   record)


def _integer(value):
    """value as an int; None stays None; anything else becomes -1 (an error)."""
    if value is None:
        return None
    try:
        return operator.index(value)
    except TypeError:
        return -1


def num_workers(size, ps_ranks):
    """Workers in a job of size ranks whose first ps_ranks ranks are servers."""
    return size - ps_ranks


def check_optimizer(name, nesterov=False):
    if name not in OPTIMIZERS or nesterov:
        raise PSConfigError("the parameter servers apply SGD with momentum and weight decay "
                            "only; got optimizer %r%s; use --optimizer sgd or --mode allreduce"
                            % (name, " with nesterov" if nesterov else ""))
