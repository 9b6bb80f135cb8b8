"""_store.py - where an elastic job's last commit survives a restart.

`hpcdl run --max-restarts K` (cli/elastic_run.py) gives every attempt the
same directory in HPCDL_ELASTIC_DIR (on the shared file system). Rank 0
writes each commit there as one file (temporary name, fsync, rename: a crash
mid-write leaves the previous commit); the next attempt's rank 0 reads it
and State.sync() hands it to every rank. Without the variable (plain
mpirun), commits stay in memory only, as in Horovod."""
import os

import torch

from ...utils.atomic import atomic_open

FILE = "state.pt"
FORMAT = "hpcdl-elastic-1"


def directory():
    return os.environ.get("HPCDL_ELASTIC_DIR") or None


def attempt():
    """0 for the first launch, k for the k-th restart (set by hpcdl run)."""
    try:
        return int(os.environ.get("HPCDL_ELASTIC_ATTEMPT", "0"))
    except ValueError:
        return 0


def save(payload):
    """Writes payload (a dict) atomically into the job's directory; no-op without one."""
    d = directory()
    if d is None:
        return None
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, FILE)
    with atomic_open(path) as f:
        torch.save(dict(payload, format=FORMAT), f)
    return path


def load():
    """The last commit (a dict) or None. The file is this job's own (written by
    its rank 0 in the directory its launcher made), so it is unpickled whole:
    a state may hold any Python object, as Horovod's does."""
    d = directory()
    path = d and os.path.join(d, FILE)
    if not path or not os.path.exists(path):
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same answer
        raise RuntimeError("elastic: cannot read the last commit %s (%s: %s); delete it to "
                           "start from scratch" % (path, type(e).__name__, e)) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise RuntimeError("elastic: %s is not an hpcdl elastic commit; delete it to start "
                           "from scratch" % path)
    return payload
