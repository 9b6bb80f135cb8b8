"""atomic.py - the one way hpcdl writes a file that a reader, a restarted job
or a resuming run may read: under a temporary name of this process's own in
the same directory, flushed to disk, then renamed over the target. POSIX
rename is atomic, so whoever opens the name sees the old file or the new one,
never half; a kill during the write leaves the old file whole, and a failed
write removes its temporary file and raises."""
import contextlib
import json
import os
import shutil
import time

TMP_MARK = ".tmp-"  # in every temporary name: what a clean-up may look for


def temp_name(path):
    """A name beside path no other process or call uses at the same time."""
    return "%s%s%d-%d" % (path, TMP_MARK, os.getpid(), time.monotonic_ns())


@contextlib.contextmanager
def atomic_open(path, mode="wb", durable=True):
    """with atomic_open(path) as f: write to f; path appears whole when the
    block ends without error. durable: fsync before the rename (checkpoints,
    data); off for files only a person reads, such as a trace."""
    tmp = temp_name(path)
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(path, obj, durable=True, **dump_options):
    """obj as JSON at path, atomically, ending with a newline."""
    with atomic_open(path, "w", durable=durable) as f:
        json.dump(obj, f, **dump_options)
        f.write("\n")
    return path


def copy_file(src, dst):
    """src to dst atomically, with src's mode and times (a later copy can tell
    by size and mtime that dst is current)."""
    tmp = temp_name(dst)
    try:
        shutil.copyfile(src, tmp)
        shutil.copystat(src, tmp)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return dst
