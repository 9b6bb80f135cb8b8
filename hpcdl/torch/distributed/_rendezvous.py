"""_rendezvous.py - MPI as torch.distributed's rendezvous: no MASTER_ADDR/PORT.

init_process_group(backend) without a store always goes through torch's
env:// rendezvous, which needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
and builds a TCPStore on them. Under mpirun / srun / hpcdl run the ranks
have already found each other through MPI, so hpcdl wraps that one handler
(the only place hpcdl reaches into torch's rendezvous table; torch offers no
other hook for the default init_method):

- MASTER_ADDR and MASTER_PORT both set (hpcdl run sets them for gloo
  users): rank and world size as torch reads them (the URL's query, else
  RANK / WORLD_SIZE), and a DeferredStore: the TCPStore torch's handler
  would build, built at the store's first use. gloo uses it at once; the
  hpcdl backend never does, so under hpcdl run it opens no TCP port either.
  Without RANK / WORLD_SIZE: torch's own handler and its error.
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
from urllib.parse import urlparse

import torch.distributed as dist

from ... import comm

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

    # the extended API (gloo calls it; a Python store must name each method)
    def has_extended_api(self):
        return True

    def append(self, key, value):
        self._data[key] = self._data.get(key, b"") + self._bytes(value)

    def multi_get(self, keys):
        return [self.get(k) for k in keys]

    def multi_set(self, keys, values):
        for k, v in zip(keys, values):
            self.set(k, v)

    def list_keys(self):
        return list(self._data)

    def queue_push(self, key, value):
        self._data.setdefault(key, []).append(self._bytes(value))

    def queue_pop(self, key, block=True):
        if not self._data.get(key):
            raise self._missing(key)
        return self._data[key].pop(0)

    def queue_len(self, key):
        return len(self._data.get(key, ()))


class DeferredStore(dist.Store):
    """Builds its real store (make()) at the first call that needs it and
    passes every call on to it."""

    def __init__(self, make):
        super().__init__()
        self._make, self._store, self._timeout = make, None, None

    @property
    def built(self):
        return self._store is not None

    def _real(self):
        if self._store is None:
            self._store = self._make()
            if self._timeout is not None:
                self._store.set_timeout(self._timeout)
        return self._store

    def set(self, key, value):
        self._real().set(key, value)

    def get(self, key):
        return self._real().get(key)

    def add(self, key, amount):
        return self._real().add(key, amount)

    def compare_set(self, key, expected, desired):
        return self._real().compare_set(key, expected, desired)

    def check(self, keys):
        return self._real().check(keys)

    def wait(self, keys, timeout=None):
        if timeout is None:
            return self._real().wait(keys)
        return self._real().wait(keys, timeout)

    def delete_key(self, key):
        return self._real().delete_key(key)

    def num_keys(self):
        return self._real().num_keys()

    def set_timeout(self, timeout):
        self._timeout = timeout
        if self._store is not None:
            self._store.set_timeout(timeout)

    # the extended API (gloo calls it; a Python store must name each method)
    def has_extended_api(self):
        return self._real().has_extended_api()

    def append(self, key, value):
        self._real().append(key, value)

    def multi_get(self, keys):
        return self._real().multi_get(keys)

    def multi_set(self, keys, values):
        self._real().multi_set(keys, values)

    def list_keys(self):
        return self._real().list_keys()

    def queue_push(self, key, value):
        self._real().queue_push(key, value)

    def queue_pop(self, key, block=True):
        return self._real().queue_pop(key, block)

    def queue_len(self, key):
        return self._real().queue_len(key)

    def clone(self):
        return self._real().clone()


def _env_rank_size(url):
    """(rank, world_size) where torch's env:// handler reads them, or None."""
    query = dict(pair.split("=", 1) for pair in urlparse(url).query.split("&") if "=" in pair)
    rank = query.get("rank", os.environ.get("RANK", ""))
    size = query.get("world_size", os.environ.get("WORLD_SIZE", ""))
    if not (rank.isdigit() and size.isdigit()):
        return None
    return int(rank), int(size)


LAST_DEFERRED = None  # the latest DeferredStore (tests ask whether it was built)
# Every store handed to torch stays referenced here: torch keeps only the C++
# half (inside a PrefixStore); once the Python object is collected, calls no
# longer reach its methods (torch then raises 'Not implemented').
_STORES = []


def _deferred_tcp(url, rank, size, timeout, kwargs):
    global LAST_DEFERRED

    def make():
        return next(_ORIGINAL_ENV(url, timeout=timeout, **kwargs))[0]
    LAST_DEFERRED = DeferredStore(make)
    _STORES.append(LAST_DEFERRED)
    yield LAST_DEFERRED, rank, size
    raise RuntimeError("hpcdl's env:// rendezvous cannot re-rendezvous (restart the job)")


def _mpi_rendezvous(url, timeout=None, **kwargs):
    """A torch rendezvous handler: yields (store, rank, world_size) from MPI."""
    world = comm.init()  # MPI starts here, at init_process_group
    _STORES.append(LocalStore(world.rank))
    yield _STORES[-1], world.rank, world.size
    raise RuntimeError("hpcdl's MPI rendezvous cannot re-rendezvous (restart the job)")


def _env_or_mpi(url, timeout=datetime.timedelta(minutes=30), **kwargs):
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        where = _env_rank_size(url)
        if where is None:
            return _ORIGINAL_ENV(url, timeout=timeout, **kwargs)
        return _deferred_tcp(url, where[0], where[1], timeout, kwargs)
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
