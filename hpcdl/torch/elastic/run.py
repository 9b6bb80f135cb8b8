"""run.py - hvd.elastic.run: the decorator around an elastic training
function, restart-based.

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

At entry: rank 0 loads the last commit when this launch is a restart
(`hpcdl run --max-restarts`, which keeps it in HPCDL_ELASTIC_DIR), every rank
takes rank 0's state (state.sync()), and after a restart the reset
callbacks run (the world size may have changed). Then func runs once. A lost
rank cannot be survived inside one MPI job (Horovod's in-process recovery
needs its Gloo controller): the job ends on every rank, and hpcdl run starts
it again on the hosts that remain, up to --max-restarts times."""
import functools
import sys

from .. import functions, mpi_ops
from . import _store


def run(func):
    """Wraps func(state, *args, **kwargs) as described above."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not mpi_ops.is_initialized():
            mpi_ops.init()
        resumed = _resume(state)
        state.sync()
        if resumed:
            state.on_reset()
        return func(state, *args, **kwargs)
    return wrapper


def _resume(state):
    """True on every rank when rank 0 restored a commit from disk. A commit
    that cannot be read fails on every rank (the error travels with the flag)."""
    payload, problem = None, None
    if mpi_ops.rank() == 0:
        try:
            payload = _store.load()
            if payload is not None:
                state.load_commit(payload)
        except RuntimeError as e:
            problem = str(e)
    seen = functions.broadcast_object((payload is not None, problem,
                                       payload and payload.get("size")), 0,
                                      name="elastic.resume")
    restored, problem, old_size = seen
    if problem:
        raise RuntimeError(problem)
    if restored and mpi_ops.rank() == 0:
        print("hpcdl elastic: attempt %d resumes from the last commit (%d ranks then, %d "
              "now)" % (_store.attempt(), old_size, mpi_ops.size()), file=sys.stderr,
              flush=True)
    return restored
