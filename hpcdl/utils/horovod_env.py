"""horovod_env.py - Horovod's environment variables in an hpcdl job.

A job script written for Horovod sets HOROVOD_* variables. Those with an hpcdl
counterpart are honoured (copied to the HPCDL_* name when that one is unset);
every other HOROVOD_* variable that is set is named, with the reason hpcdl
has nothing to apply it to, in ONE warning on rank 0, rather than silently
ignored. hpcdl.comm.init() calls apply() before MPI and hpcdl's core start
(the core reads the stall settings when it starts).

    HOROVOD_TIMELINE=path                  HPCDL_TIMELINE (rank 0 writes path, rank r
                                           path.rank<r>.json; DYNAMIC: use start_timeline)
    HOROVOD_FUSION_THRESHOLD=bytes         HPCDL_FUSION_THRESHOLD
    HOROVOD_STALL_CHECK_TIME_SECONDS       HPCDL_STALL_CHECK_TIME_SECONDS
    HOROVOD_STALL_SHUTDOWN_TIME_SECONDS    HPCDL_STALL_SHUTDOWN_TIME_SECONDS
    HOROVOD_STALL_CHECK_DISABLE            HPCDL_STALL_CHECK_DISABLE
    HOROVOD_LOG_LEVEL=trace|...|fatal      HPCDL_LOG_LEVEL (trace -> DEBUG, fatal -> CRITICAL)
"""
import os

# Horovod's name -> (hpcdl's name, value translation or None)
LOG_LEVELS = {"trace": "DEBUG", "debug": "DEBUG", "info": "INFO", "warning": "WARNING",
              "error": "ERROR", "fatal": "CRITICAL"}
HONOURED = {
    "HOROVOD_TIMELINE": ("HPCDL_TIMELINE", lambda v: None if v == "DYNAMIC" else v),
    "HOROVOD_FUSION_THRESHOLD": ("HPCDL_FUSION_THRESHOLD", None),
    "HOROVOD_STALL_CHECK_TIME_SECONDS": ("HPCDL_STALL_CHECK_TIME_SECONDS", None),
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": ("HPCDL_STALL_SHUTDOWN_TIME_SECONDS", None),
    "HOROVOD_STALL_CHECK_DISABLE": ("HPCDL_STALL_CHECK_DISABLE", None),
    "HOROVOD_LOG_LEVEL": ("HPCDL_LOG_LEVEL", lambda v: LOG_LEVELS.get(v.lower(), v)),
}

# why the best-known others mean nothing here (any other HOROVOD_* is named too)
REASONS = {
    "HOROVOD_CYCLE_TIME": "no negotiation cycle: a fusion bucket is all-reduced as soon "
                          "as its gradients are ready",
    "HOROVOD_CACHE_CAPACITY": "no coordinator, so no response cache",
    "HOROVOD_HIERARCHICAL_ALLREDUCE": "algorithm='auto' already picks the shared-memory "
                                      "hierarchy across nodes",
    "HOROVOD_HIERARCHICAL_ALLGATHER": "all-gather runs as MPI's own",
    "HOROVOD_AUTOTUNE": "no autotuner; set HPCDL_FUSION_THRESHOLD",
    "HOROVOD_TIMELINE_MARK_CYCLES": "no cycles to mark",
    "HOROVOD_MPI_THREADS_DISABLE": "hpcdl's engine thread needs MPI_THREAD_MULTIPLE",
}

_applied = False


def apply(env=None, say=None):
    """Copies the honoured HOROVOD_* values to their HPCDL_* names in env
    (default os.environ) where those are unset; returns the one warning line
    naming the variables that are set but have no effect (None if none), and
    hands it to say() when given. Once per process."""
    global _applied
    env = os.environ if env is None else env
    honoured, ignored = [], []
    for name in sorted(k for k in env if k.startswith("HOROVOD_")):
        if name in HONOURED:
            target, translate = HONOURED[name]
            value = translate(env[name]) if translate else env[name]
            if value is not None and target not in env:
                env[target] = value
                honoured.append(name)
            elif value is not None and env[target] != value:
                ignored.append("%s (%s=%s is set and wins)" % (name, target, env[target]))
        else:
            reason = REASONS.get(name)
            ignored.append("%s (%s)" % (name, reason) if reason else name)
    if not ignored:
        return None
    line = ("Horovod variables with no effect in hpcdl: %s%s" % (
        ", ".join(ignored),
        "; honoured: " + ", ".join(honoured) if honoured else ""))
    if say is not None and not _applied:
        say(line)
    _applied = True
    return line
