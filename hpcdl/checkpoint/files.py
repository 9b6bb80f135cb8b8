"""files.py - hpcdl's one on-disk checkpoint format: a directory with one
file per rank (or shard) and a manifest, written last.

    DIR/rank-00000-of-00002.pt   rank 0's part (torch.save of a dict)
    DIR/rank-00001-of-00002.pt   rank 1's part
    DIR/manifest.json            format, kind, rank count, the save's id, each
                                 file's name, size and sha256, and the
                                 writer's own fields (ZeRO's layout, ...)

Every file goes through utils/atomic.py (temporary name, fsync, rename).
The manifest is written only after every part is on disk, so a directory
without one is a save that did not finish: read_manifest refuses it, and
latest() skips it. Each part carries its rank, the rank count and the save's
id, so a file moved in from another save is refused too. Every refusal is a
ValueError with one line naming the file and what to do.

This module only reads and writes files; the collectives around it (agreeing
on the save's id, gathering the parts' entries to the rank that writes the
manifest, raising on every rank) are the callers': zero.py and buckets.py
(stages 1-3, one file per rank), root.py (the trainer's replicated state at
--zero 0, every --mode but ZeRO's: one file) and hpcdl/torch/elastic/_store.py
(commits: one file).

Manifests of format 1 (ZeRO's before this module; no kind, no sizes or
checksums) are read as before.
"""
import hashlib
import json
import os
import re
import shutil
import time

import torch

from ..utils.atomic import atomic_open, write_json

FORMAT = 2
READS = (1, 2)  # the manifest formats this code reads
MANIFEST = "manifest.json"


def shard_file(rank, ranks):
    return "rank-%05d-of-%05d.pt" % (rank, ranks)


def new_save_id():
    """A fresh id for one save (the caller agrees on it across ranks)."""
    return os.urandom(8).hex()


# ---------------------------------------------------------------- write
def write_shard(directory, rank, ranks, save, part):
    """part (a dict) with its header as rank's file of the save, atomically.
    Returns the manifest's entry for it. Any failure (a full disk surfaces as
    torch's RuntimeError too) is an OSError with one line."""
    name = shard_file(rank, ranks)
    path = os.path.join(directory, name)
    try:
        os.makedirs(directory, exist_ok=True)
        with atomic_open(path) as f:
            out = _Hashing(f)  # streamed: no second copy of a large shard in memory
            torch.save(dict(part, rank=rank, ranks=ranks, save=save), out)
        return {"file": name, "bytes": out.size, "sha256": out.sha.hexdigest()}
    except Exception as e:  # noqa: BLE001 - every rank must agree on any failure
        raise OSError("could not write %s: %s" % (path, quote(str(e)))) from None


class _Hashing:
    """A write-only file that passes bytes on and keeps their count and sha256."""

    def __init__(self, f):
        self.f, self.size, self.sha = f, 0, hashlib.sha256()

    def write(self, data):
        self.sha.update(data)
        self.size += len(data)
        return self.f.write(data)

    def flush(self):
        self.f.flush()


def _file_sha256(path, chunk=1 << 20):
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            sha.update(block)
    return sha.hexdigest()


def write_manifest(directory, kind, save, entries, **fields):
    """The manifest, last: entries are write_shard's returns in rank order."""
    manifest = dict(fields, format=FORMAT, kind=kind, ranks=len(entries), save=save,
                    files=[e["file"] for e in entries],
                    bytes=[e["bytes"] for e in entries],
                    sha256=[e["sha256"] for e in entries])
    path = os.path.join(directory, MANIFEST)
    try:
        write_json(path, manifest, indent=1)
    except Exception as e:  # noqa: BLE001
        raise OSError("could not write %s: %s" % (path, quote(str(e)))) from None
    return manifest


# ---------------------------------------------------------------- read
def read_manifest(directory, kind=None):
    """The manifest of a complete save, checked: its format, its kind (when
    both it and the caller name one), every file present. A ValueError with
    one line otherwise. (The rank count is the caller's to judge: ZeRO
    reshards to any, the trainer's and elastic's saves are one file.)"""
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path) as f:
            m = json.load(f)
    except FileNotFoundError:
        raise ValueError("%s has no %s: not a sharded checkpoint, or its save did not "
                         "finish; resume from another checkpoint" % (directory, MANIFEST)) \
            from None
    except (OSError, ValueError) as e:
        raise ValueError("%s cannot be read (%s); resume from another checkpoint"
                         % (path, quote(str(e)))) from None
    if not isinstance(m, dict) or m.get("format") not in READS or not isinstance(
            m.get("files"), list) or not isinstance(m.get("ranks"), int):
        raise ValueError("%s is not a sharded checkpoint manifest (format %s; this hpcdl "
                         "reads %s); resume from another checkpoint"
                         % (path, m.get("format") if isinstance(m, dict) else "?",
                            " or ".join(map(str, READS))))
    if kind is not None and m.get("kind") not in (None, kind):
        raise ValueError("%s is a %s checkpoint, not a %s one; give this run a %s checkpoint"
                         % (directory, m["kind"], kind, kind))
    missing = [f for f in m["files"] if not os.path.exists(os.path.join(directory, f))]
    if missing or len(m["files"]) != m["ranks"]:
        raise ValueError("sharded checkpoint %s is missing rank file(s) %s of %d; copy the "
                         "whole directory as it was written (every rank file and %s belong "
                         "together)" % (directory, ", ".join(missing) or "?", m["ranks"],
                                        MANIFEST))
    return m


def read_shard(directory, manifest, rank, weights_only=True):
    """Rank `rank`'s part (a dict, header included), checked against the
    manifest: its size, its rank, rank count and save, its checksum (sizes
    and checksums from format 2 on). weights_only=False only for files the job wrote itself (elastic
    commits hold any Python object)."""
    name = manifest["files"][rank]
    path = os.path.join(directory, name)

    def damaged(why):
        return ValueError("sharded checkpoint %s: %s cannot be read (damaged or cut short? "
                          "%s); copy it again from where it was written, or load another "
                          "checkpoint" % (directory, name, why))
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise damaged("%s: %s" % (type(e).__name__, quote(str(e)))) from None
    if "bytes" in manifest and size != manifest["bytes"][rank]:
        raise damaged("size: %d bytes, the manifest says %d." % (size, manifest["bytes"][rank]))
    try:  # from the file itself: no second copy of a large shard in memory
        part = torch.load(path, map_location="cpu", weights_only=weights_only)
    except Exception as e:  # noqa: BLE001 - torch/zip/pickle errors of a damaged file
        raise damaged("%s: %s" % (type(e).__name__, quote(str(e)))) from None
    part = part if isinstance(part, dict) else {}
    got = (part.get("rank"), part.get("ranks"), part.get("save", manifest.get("save")))
    if got != (rank, manifest["ranks"], manifest.get("save")):
        raise ValueError("sharded checkpoint %s: %s holds rank %s of %s of save %s, the "
                         "manifest expects rank %d of %d of save %s (a file moved, or copied "
                         "from another save); put the right file back or resume from another "
                         "checkpoint" % (directory, name, got[0], got[1], got[2], rank,
                                         manifest["ranks"], manifest.get("save")))
    if "sha256" in manifest and _file_sha256(path) != manifest["sha256"][rank]:
        raise damaged("checksum: its sha256 differs from the manifest's.")
    return part


# ---------------------------------------------------------------- one-file saves
def write_single(directory, kind, part, **fields):
    """A save of one file (rank 0 of 1) and its manifest, by one process:
    the trainer's replicated state (root.py), elastic's commits.
    An OSError with one line on failure."""
    save = new_save_id()
    entry = write_shard(directory, 0, 1, save, part)
    return write_manifest(directory, kind, save, [entry], **fields)


def read_single(directory, kind, weights_only=True):
    """write_single's part, checked as read_manifest and read_shard check."""
    return read_shard(directory, read_manifest(directory, kind=kind), 0, weights_only)


def quote(text, limit=160):
    """text's first line for a one-line message: whole if it fits in limit,
    else cut after its last sentence (or word) that fits, marked '...'."""
    line = text.strip().splitlines()[0] if text.strip() else "truncated?"
    if len(line) <= limit:
        return line
    head = line[:limit]
    cut = head.rfind(". ")
    if cut > 0:
        return head[:cut + 1] + " ..."
    return head[:head.rfind(" ")].rstrip(",;:") + " ..." if " " in head else head + "..."


# ---------------------------------------------------------------- save directories
def new_dir_name(prefix):
    """A fresh directory name for one save; names of one prefix sort by time."""
    return "%s-%d-%d" % (prefix, time.time_ns(), os.getpid())


def _save_dirs(root, prefix):
    """{name: (time, pid)} of root's directories named by new_dir_name(p), p
    any name the regular expression prefix matches (e.g. "zero[123]")."""
    pattern = re.compile(r"(?:%s)-([0-9]+)-([0-9]+)" % prefix)
    found = {}
    for name in os.listdir(root) if os.path.isdir(root) else ():
        m = pattern.fullmatch(name)
        if m:
            found[name] = (int(m.group(1)), int(m.group(2)))
    return found


def latest(root, prefix):
    """The newest complete save (a directory with a manifest) of prefix in
    root, or None: a save cut short has no manifest and is passed over."""
    dirs = _save_dirs(root, prefix)
    for name in sorted(dirs, key=dirs.get, reverse=True):
        if os.path.exists(os.path.join(root, name, MANIFEST)):
            return os.path.join(root, name)
    return None


def prune(root, prefix, keep):
    """Removes root's save directories of prefix other than the name keep."""
    for name in _save_dirs(root, prefix):
        if name != keep:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
