"""_store.py - where an elastic job's last commit survives a restart.

`hpcdl run --max-restarts K` (cli/elastic_run.py) gives every attempt the
same directory in HPCDL_ELASTIC_DIR (on the shared file system). Rank 0
writes each commit there as a save of hpcdl's one sharded format
(hpcdl/checkpoint/files.py): a fresh directory commit-<time>-<pid> holding rank 0's
payload as its one file and a manifest written last, after which the older
commits are removed. A crash mid-write leaves a directory without manifest,
which load() passes over: the previous commit is read. The next attempt's
rank 0 reads the newest complete commit and State.sync() hands it to every
rank. Without the variable (plain mpirun), commits stay in memory only, as
in Horovod. A state.pt of the earlier one-file format (hpcdl-elastic-1) is
still read when no commit directory exists."""
import os

import torch

from ...checkpoint import files as sharded

PREFIX = "commit"     # the commit directories' names (sharded.new_dir_name)
KIND = "elastic"      # the manifest's kind
LEGACY_FILE = "state.pt"  # before the sharded format: one file
LEGACY_FORMAT = "hpcdl-elastic-1"


def directory():
    return os.environ.get("HPCDL_ELASTIC_DIR") or None


def attempt():
    """0 for the first launch, k for the k-th restart (set by hpcdl run)."""
    try:
        return int(os.environ.get("HPCDL_ELASTIC_ATTEMPT", "0"))
    except ValueError:
        return 0


def save(payload):
    """Writes payload (a dict; rank 0's, the state every rank syncs to) as a
    new commit in the job's directory, then removes the older ones; no-op
    without a directory. Returns the commit's directory."""
    d = directory()
    if d is None:
        return None
    name = sharded.new_dir_name(PREFIX)
    path = os.path.join(d, name)
    sharded.write_single(path, KIND, {"payload": payload}, size=payload.get("size"))
    sharded.prune(d, PREFIX, keep=name)
    legacy = os.path.join(d, LEGACY_FILE)
    if os.path.exists(legacy):  # superseded by this commit
        os.remove(legacy)
    return path


def load():
    """The last commit (a dict) or None. The files are this job's own (written
    by its rank 0 in the directory its launcher made), so they are unpickled
    whole: a state may hold any Python object, as Horovod's does. A commit
    that cannot be read is a RuntimeError with one line."""
    d = directory()
    if d is None:
        return None
    path = sharded.latest(d, PREFIX)
    if path is None:
        return _load_legacy(os.path.join(d, LEGACY_FILE))
    try:
        return sharded.read_single(path, KIND, weights_only=False)["payload"]
    except (ValueError, KeyError) as e:
        raise RuntimeError("elastic: cannot read the last commit %s (%s); delete it to start "
                           "from scratch (each commit removes the ones before it; a legacy "
                           "state.pt, if any, is read then)" % (path, e)) from None


def _load_legacy(path):
    """A commit written before the sharded format (one file), or None."""
    if not os.path.exists(path):
        return None
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same answer
        raise RuntimeError("elastic: cannot read the last commit %s (%s: %s); delete it to "
                           "start from scratch" % (path, type(e).__name__,
                                                   sharded.quote(str(e)))) from None
    if not isinstance(payload, dict) or payload.get("format") != LEGACY_FORMAT:
        raise RuntimeError("elastic: %s is not an hpcdl elastic commit; delete it to start "
                           "from scratch" % path)
    return payload
