"""_rendezvous.py - MPI as torch.distributed's rendezvous: no MASTER_ADDR/PORT.

init_process_group(backend) without a store always goes through torch's
env:// rendezvous, which needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
and builds a TCPStore on them. Under mpirun / srun / hpcdl run the ranks
have already found each other through MPI, so hpcdl wraps that one handler
(the only place hpcdl reaches into torch's rendezvous table; torch offers no
other hook for the default init_method):

- MASTER_ADDR and MASTER_PORT both set: torch's own handler, unchanged (a
  TCPStore; gloo users under hpcdl run get this).
- otherwise: hpcdl.comm.init() starts MPI; rank and world size come from
  MPI, and the store is a LocalStore, this process's own key-value table.

The hpcdl backend needs no store at all (MPI carries everything). A backend
that exchanges addresses through the store (gloo) cannot work on a LocalStore:
its first read of another rank's key raises an error that says to set
MASTER_ADDR/MASTER_PORT, instead of waiting out torch's 30-minute timeout.
TORCH_DIST_INIT_BARRIER=1 (a store-based barrier) needs them too.
"""
import datetime
import importlib
import os

import torch.distributed as dist

# the module (torch.distributed.rendezvous is also the name of a function there)
_torch_rdzv = importlib.import_module("torch.distributed.rendezvous")

_ORIGINAL_ENV = None  # torch's env:// handler, kept for MASTER_ADDR/PORT users


class LocalStore(dist.Store):
    """A store that lives in this process only (no TCP): keys set here are
    seen here. Reading a key that is not here cannot succeed later (no other
    rank writes to it), so it raises at once, naming the fix."""

    def __init__(self, rank):
        super().__init__()
        self._rank = rank
        self._data = {}

    def _missing(self, key):
        return RuntimeError(
            "[rank %d] torch.distributed store key %r was never set on this rank: without "
            "MASTER_ADDR/MASTER_PORT the store comes from hpcdl's MPI rendezvous and is local "
            "to each process, which the hpcdl backend needs but backends that exchange "
            "addresses through the store (gloo, nccl) cannot use. Fix: use backend='hpcdl', or "
            "export MASTER_ADDR and MASTER_PORT (hpcdl run sets them)" % (self._rank, key))

    @staticmethod
    def _bytes(value):
        if isinstance(value, str):
            return value.encode()
        return bytes(value)

    def set(self, key, value):
        self._data[key] = self._bytes(value)

    def get(self, key):
        if key not in self._data:
            raise self._missing(key)
        return self._data[key]

    def add(self, key, amount):
        value = int(self._data.get(key, b"0")) + int(amount)
        self._data[key] = str(value).encode()
        return value

    def compare_set(self, key, expected, desired):
        current = self._data.get(key)
        if (current is None and not self._bytes(expected)) or current == self._bytes(expected):
            self._data[key] = self._bytes(desired)
        return self._data.get(key, self._bytes(expected))

    def check(self, keys):
        return all(k in self._data for k in keys)

    def wait(self, keys, timeout=None):
        for k in keys:
            if k not in self._data:
                raise self._missing(k)

    def delete_key(self, key):
        return self._data.pop(key, None) is not None

    def num_keys(self):
        return len(self._data)

    def set_timeout(self, timeout):
        pass


def _mpi_rendezvous(url, timeout=None, **kwargs):
    """A torch rendezvous handler: yields (store, rank, world_size) from MPI."""
    from ... import comm  # MPI starts here, at init_process_group, not at import
    world = comm.init()
    yield LocalStore(world.rank), world.rank, world.size
    raise RuntimeError("hpcdl's MPI rendezvous cannot re-rendezvous (restart the job)")


def _env_or_mpi(url, timeout=datetime.timedelta(minutes=30), **kwargs):
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        return _ORIGINAL_ENV(url, timeout=timeout, **kwargs)
    return _mpi_rendezvous(url, timeout=timeout, **kwargs)


def install():
    """Wraps torch's env:// handler (idempotent; starts nothing)."""
    global _ORIGINAL_ENV
    handlers = _torch_rdzv._rendezvous_handlers
    if _ORIGINAL_ENV is None and handlers.get("env") is not _env_or_mpi:
        _ORIGINAL_ENV = handlers["env"]
        handlers["env"] = _env_or_mpi
    if "mpi" not in handlers:  # init_method="mpi://": MPI even when MASTER_ADDR is set
        handlers["mpi"] = _mpi_rendezvous
