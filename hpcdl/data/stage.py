"""stage.py - the node-local level of the data cache: copy a shard directory
(the splits asked for) from the parallel file system to node-local storage
($TMPDIR, /dev/shm, a local SSD) once per node, then read it from there.

    staged = stage_shards("/lustre/me/shards", os.environ["TMPDIR"], comm=MPI.COMM_WORLD)
    ds = H5ShardDataset(staged)      # or H5ShardDataset(dir, stage_to=$TMPDIR)

Collective over comm (default: the job's ranks; a plain process alone). The
ranks of one node (an MPI shared-memory split) share the work: local rank j
copies files j, j + L, ... (L ranks on the node), each to a temporary name
renamed into place when complete, so a reader never sees half a file. One
agreement over all ranks ends the call: every rank returns once every node
has its copy, or every rank raises the first error (disk full, missing file).
A file already staged with the source's size and modification time (and the
same manifest) is kept: a second call in the job copies nothing.
Copies land in DEST/hpcdl-stage-<name>-<hash of the source path>/.
"""
import hashlib
import os
import shutil
import time
import sys

from ..utils.atomic import copy_file
from . import _mpi
from .manifest import MANIFEST, DataError, Manifest


def staged_dir(directory, dest):
    src = os.path.abspath(directory)
    tag = hashlib.blake2b(src.encode(), digest_size=4).hexdigest()
    return os.path.join(dest, "hpcdl-stage-%s-%s" % (os.path.basename(src), tag))


def stage_shards(directory, dest, splits=None, comm=None):
    """Copies the shards of `splits` (default: all) and the manifest of
    directory into node-local dest; returns the staged directory (collective)."""
    comm = comm if comm is not None else _mpi.job_comm()
    node = _mpi.node_comm(comm) if comm is not None and comm.size > 1 else None
    local_rank, local_size = _mpi.rank_and_size(node)
    target, error, stats = staged_dir(directory, dest), None, (0, 0)
    t0 = time.perf_counter()
    try:
        m = Manifest(directory)
        names = splits or sorted(m.splits)
        files = [s["file"] for name in names for s in m.split(name)["shards"]]
        todo = _stale(m, files, target)
        _check_space(target if os.path.isdir(target) else dest, m, todo)
        mine = todo[local_rank::local_size]
        for f in mine:
            _copy(os.path.join(m.directory, f), os.path.join(target, f))
        stats = (len(mine), sum(os.path.getsize(os.path.join(target, f)) for f in mine))
    except (DataError, OSError) as e:
        error = e if isinstance(e, DataError) else DataError(
            "staging %s to %s: %s" % (directory, dest, e))
    _mpi.agree(comm, error)
    copied = stats
    if node is not None:  # also the node's barrier: its copies are all done
        copied = node.allreduce(stats[0]), node.allreduce(stats[1])
        node.Free()
    # the manifest last (by local rank 0): its presence means the copy is whole
    if local_rank == 0:
        try:
            _copy(m.path, os.path.join(target, MANIFEST))
        except OSError as e:
            error = DataError("staging %s to %s: %s" % (m.path, target, e))
    _mpi.agree(comm, error)
    if (comm.rank if comm is not None else 0) == 0:
        _say(directory, target, copied, len(files), time.perf_counter() - t0)
    return target


def _stale(m, files, target):
    """The files (and whether the manifest) that need copying into target."""
    staged = os.path.join(target, MANIFEST)
    with open(m.path, "rb") as a:
        same_manifest = os.path.exists(staged) and open(staged, "rb").read() == a.read()
    todo = []
    for f in files:
        src, dst = os.path.join(m.directory, f), os.path.join(target, f)
        if not os.path.exists(src):
            raise DataError("%s: missing (listed in %s); restore it or shard again"
                            % (src, m.path))
        if not (same_manifest and os.path.exists(dst) and _same_file(src, dst)):
            todo.append(f)
    return todo


def _same_file(src, dst):
    a, b = os.stat(src), os.stat(dst)
    return a.st_size == b.st_size and a.st_mtime_ns == b.st_mtime_ns


def _check_space(where, m, todo):
    os.makedirs(where, exist_ok=True)
    need = sum(os.path.getsize(os.path.join(m.directory, f)) for f in todo)
    free = shutil.disk_usage(where).free
    if need > free:
        raise DataError("staging needs %.1f MiB in %s, only %.1f MiB are free; pick another "
                        "--stage-to or free space" % (need / 2**20, where, free / 2**20))


def _copy(src, dst):
    """src to dst through a temporary name; the data, then size and mtime."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    copy_file(src, dst)  # with the mtime that tells a later call it is current


def _say(directory, target, copied, total, seconds):
    files, nbytes = copied
    what = ("copied %d of %d file(s), %.1f MiB, in %.2f s" % (files, total, nbytes / 2**20,
                                                              seconds)
            if files else "all %d file(s) were there already" % total)
    sys.stderr.write("hpcdl data: staged %s -> %s (node of rank 0): %s\n"
                     % (directory, target, what))
