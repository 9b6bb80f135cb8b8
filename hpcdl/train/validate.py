"""validate.py - the paths a training run will use, checked before any MPI
work: `hpcdl train` runs problems(cfg) in the launching shell (one line per
problem, status 2, before mpirun starts anything) and again on every rank
before the first collective (a rank on another node may see other files).

Pure functions over a TrainConfig: they read the file system and leave it as
they found it (a writable directory is proven by creating and removing an
empty temporary directory in it). No torch, no MPI.

    flag               must be
    --out DIR          a directory that exists or can be created, writable
    --checkpoint-dir   the same
    --resume PATH      a readable file torch.save wrote (a zip archive)
    --resume (auto)    --checkpoint-dir/checkpoint.pt, when it exists, the same
    --data DIR         a directory `hpcdl data shard` finished (manifest.json
                       with a train and a val split)
    --stage-to DIR     a writable directory, as --out
"""
import os
import tempfile

CHECKPOINT_FILE = "checkpoint.pt"  # checkpoint.FILENAME (that module loads torch)
ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since torch 1.6


def problems(cfg):
    """Every problem with cfg's paths, one sentence each (empty list: none)."""
    out = []
    for flag, path in (("--out", cfg.out), ("--checkpoint-dir", cfg.checkpoint_dir),
                       ("--stage-to", cfg.stage_to)):
        if path:
            out.append(writable_dir(flag, path))
    out.append(resume_file(cfg))
    out.append(shard_dir(cfg.data))
    return [p for p in out if p]


def writable_dir(flag, path):
    """None if path is (or can be made) a directory hpcdl may write in, else
    the sentence saying why not."""
    if os.path.exists(path) and not os.path.isdir(path):
        return "%s %s is a file; give a directory (it is created if missing)" % (flag, path)
    parent = os.path.abspath(path)
    while not os.path.exists(parent):  # the nearest part of the path that exists
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return "%s %s: %s is a file, so the directory cannot be created" % (flag, path,
                                                                             parent)
    try:  # proves what os.access cannot (root on a read-only or virtual file system)
        os.rmdir(tempfile.mkdtemp(prefix=".hpcdl-probe-", dir=parent))
    except OSError as e:
        return "%s %s: cannot create a directory in %s (%s)" % (
            flag, path, parent, e.strerror or e)
    return None


def resume_file(cfg):
    """None if the checkpoint --resume will read is fine (or there is none yet)."""
    if cfg.resume is None:
        return None
    if cfg.resume == "auto":
        if not cfg.checkpoint_dir:
            return None  # TrainConfig.check says --resume needs --checkpoint-dir
        path = os.path.join(cfg.checkpoint_dir, CHECKPOINT_FILE)
        if not os.path.exists(path):
            return None  # a fresh start, as documented
    else:
        path = cfg.resume
    if not os.path.exists(path):
        return "--resume %s: no such checkpoint file" % path
    if os.path.isdir(path):
        return ("--resume %s is a directory; give its checkpoint file (%s) or use "
                "--checkpoint-dir %s --resume" % (path, os.path.join(path, CHECKPOINT_FILE),
                                                  path))
    try:
        with open(path, "rb") as f:
            head = f.read(len(ZIP_MAGIC))
    except OSError as e:
        return "--resume %s cannot be read (%s)" % (path, e.strerror or e)
    if head != ZIP_MAGIC:
        return ("--resume %s is not a checkpoint (not a file torch.save wrote); give the "
                "checkpoint.pt of a --checkpoint-dir" % path)
    return None


def shard_dir(spec):
    """None unless spec is an existing directory that is not a finished shard
    directory (names and other paths are TrainConfig.check's to judge)."""
    if not spec or not os.path.isdir(spec):
        return None
    from ..data.manifest import MANIFEST, DataError, Manifest  # on use: loads numpy
    if not os.path.exists(os.path.join(spec, MANIFEST)):
        return ("--data %s has no %s: not a directory `hpcdl data shard` finished writing "
                "(make one with `hpcdl data shard SOURCE --out %s --val-fraction 0.2`)"
                % (spec, MANIFEST, spec))
    try:
        manifest = Manifest(spec)
        for split in ("train", "val"):
            manifest.split(split)
    except (DataError, OSError, ValueError) as e:
        return "--data %s: %s" % (spec, e)
    return None
