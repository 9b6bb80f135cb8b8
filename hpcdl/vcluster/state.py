"""state.py - the record of one vcluster: a JSON file in the state folder
listing every thing `up` made, appended before each thing is made, so that
`down` can undo exactly those things in reverse order, even when `up` failed
half-way. Also the folder's layout (one folder per host for its scratch)."""
import json
import os

from ..utils.atomic import TMP_MARK, write_json

# one vcluster per machine; the folder must not be under /tmp (hosts get their own)
DEFAULT_DIR = "/run/hpcdl-vcluster"
STATE_FILE = "state.json"
# in the folder when an up made it (down then removes it); the mark, not the
# up that builds, says so: of two ups at once, the one that loses may be the
# one that made the folder
MADE_MARK = ".made-by-up"


def state_dir():
    """The state folder: $HPCDL_VCLUSTER_DIR or /run/hpcdl-vcluster."""
    return os.environ.get("HPCDL_VCLUSTER_DIR") or DEFAULT_DIR


def path(*parts):
    return os.path.join(state_dir(), *parts)


def load():
    """The state dict, or None when no vcluster is up."""
    try:
        with open(path(STATE_FILE)) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def save(st):
    """Writes the state atomically (a reader never sees half a file)."""
    os.makedirs(state_dir(), exist_ok=True)
    write_json(path(STATE_FILE), st, indent=1)


def claim(st):
    """Writes the first state of an `up` only if there is none, atomically
    (a hard link fails when the name exists): of two `up`s started at once,
    one claims the state and builds, the other gets False and makes nothing.
    The state file is the lock: it stays until down."""
    try:
        os.makedirs(state_dir())
        open(path(MADE_MARK), "w").close()
    except FileExistsError:
        pass
    tmp = path("%s.%d.tmp" % (STATE_FILE, os.getpid()))
    with open(tmp, "w") as f:
        json.dump(st, f, indent=1)
    try:
        os.link(tmp, path(STATE_FILE))
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def record(st, kind, **what):
    """Appends one made thing ({'kind': kind, ...}) and saves: called BEFORE
    the thing is made, so a crash in between leaves a record that down can
    try to undo (undoing something that does not exist is not an error)."""
    item = dict(kind=kind, **what)
    st["made"].append(item)
    save(st)
    return item


def _names():
    try:
        return os.listdir(state_dir())
    except FileNotFoundError:
        return []


def remove():
    """Removes the state file (the last step of down), and the folder when
    an up made it (and nothing else is left in it)."""
    left = [n for n in _names() if n.startswith(STATE_FILE + TMP_MARK)]  # a kill mid-save
    for name in [STATE_FILE] + left:
        try:
            os.unlink(path(name))
        except FileNotFoundError:
            pass
    if os.path.exists(path(MADE_MARK)):
        try:
            os.unlink(path(MADE_MARK))
            os.rmdir(state_dir())
        except OSError:
            pass
