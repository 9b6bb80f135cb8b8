"""process_sets.py - Horovod's process sets: collectives over a subset of the
ranks, each set on its own hpcdl Communicator (Communicator.split), so its
collectives run hpcdl's ring / hierarchical algorithms among its ranks only.

    even = hvd.add_process_set([0, 2])            # collective: every rank calls it
    if even.included():
        y = hvd.allreduce(x, process_set=even)    # only ranks 0 and 2 take part
    hvd.remove_process_set(even)                  # collective again

    hvd.init(process_sets=[hvd.ProcessSet([0, 1]), hvd.ProcessSet([2, 3])])

Ranks are hvd.rank() numbers (of the world hvd.init made); root_rank of a
broadcast is also such a global rank, as in Horovod. Sets are always dynamic
(Horovod's HOROVOD_DYNAMIC_PROCESS_SETS=1): add and remove at any time, on
every rank in the same order. Sets may overlap; two sets with the same ranks
may not exist at once. A rank outside a set that calls one of its
collectives gets a ValueError saying so.
"""
from . import _handles


class ProcessSet:
    """A set of ranks (hvd.rank() numbers) that run collectives together.
    Registered by hvd.init(process_sets=[...]) or hvd.add_process_set()."""
    process_set_id = None   # set while registered; 0 is the global set
    ranks = None            # sorted list of global ranks
    mpi_comm = None         # Horovod builds sets from mpi4py communicators too

    def __init__(self, ranks_or_comm):
        try:
            ranks = list(ranks_or_comm)
        except TypeError:
            raise TypeError("ProcessSet takes a list of ranks (hvd.rank() numbers); hpcdl "
                            "does not build process sets from MPI communicators") from None
        if any(not isinstance(r, int) for r in ranks):
            raise ValueError("ProcessSet should be initialized with a list of process ranks, "
                             "got %r" % (ranks_or_comm,))
        self.ranks = sorted(ranks)
        self._comm = None   # the hpcdl Communicator on member ranks, while registered

    def _invalidate(self):
        self.process_set_id, self._comm = None, None

    def size(self):
        """Number of ranks in the set (None while not registered)."""
        if self.process_set_id is None:
            return None
        return len(self.ranks)

    def rank(self):
        """This rank's position in the set (None while not registered, -1 on
        a rank outside it)."""
        if self.process_set_id is None:
            return None
        me = _handles.world().rank
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self):
        """Whether this rank is in the set (None before ranks are known)."""
        if self.ranks is None:
            return None
        return _handles.world().rank in self.ranks

    def __str__(self):
        return "ProcessSet(process_set_id=%s, ranks=%s)" % (self.process_set_id, self.ranks)

    __repr__ = __str__


class _GlobalProcessSet(ProcessSet):
    """Every rank: its Communicator is the world's, whatever init made."""

    def __init__(self):
        self.ranks, self._comm, self.process_set_id = [], None, 0


global_process_set = _GlobalProcessSet()
_sets = {}          # id -> registered ProcessSet (not the global one)
_next_id = [1]


def setup_after_init():
    """Called by hvd.init: the global set's ranks; earlier sets are gone."""
    global_process_set.ranks = list(range(_handles.world().size))
    for ps in list(_sets.values()):
        ps._invalidate()
    _sets.clear()


def clear():
    """Called by hvd.shutdown: sets die with their parent communicator."""
    for ps in list(_sets.values()):
        if ps._comm is not None:
            ps._comm.free()
        ps._invalidate()
    _sets.clear()


def add_process_set(process_set):
    """Collective over every rank (all in the same order, with the same
    ranks): registers process_set (a ProcessSet or a list of ranks) and
    returns it. ValueError on every rank for an empty set, a repeated or
    unknown rank, a set whose ranks another registered set already has, or
    ranks that disagree."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set is global_process_set or process_set.process_set_id is not None:
        raise ValueError("%s is already registered" % process_set)
    w = _handles.world()
    try:  # first: every rank learns every rank's list (different lists fail everywhere)
        comm = w.split(process_set.ranks)
    except ValueError as e:
        raise ValueError("add_process_set(%s): %s" % (process_set.ranks, e)) from None
    # the lists agree and every rank holds the same registry: the same verdict everywhere
    same = [o for o in list(_sets.values()) + [global_process_set] if o.ranks == process_set.ranks]
    if same:
        if comm is not None:
            comm.free()
        raise ValueError("Attempted to add a duplicate process set: %s has the same ranks as "
                         "%s" % (process_set, same[0]))
    process_set.process_set_id = _next_id[0]
    process_set._comm = comm
    _next_id[0] += 1
    _sets[process_set.process_set_id] = process_set
    return process_set


def remove_process_set(process_set):
    """Collective over every rank: unregisters process_set and frees its
    communicator. Returns False for a set that is not registered;
    ValueError for the global set (on every rank)."""
    if process_set is global_process_set or process_set.process_set_id == 0:
        raise ValueError("remove_process_set: the global process set cannot be removed")
    if process_set.process_set_id not in _sets:
        return False
    del _sets[process_set.process_set_id]
    if process_set._comm is not None:
        process_set._comm.free()
    process_set._invalidate()
    _handles.world().barrier()  # every rank leaves the set's collectives together
    return True


def comm_of(process_set, call="collective"):
    """The Communicator for process_set's collectives on this rank."""
    if process_set is None or process_set.process_set_id == 0:
        return _handles.world()
    if process_set.process_set_id is None or process_set.process_set_id not in _sets:
        raise ValueError("%s: %s is not registered; add it with hvd.add_process_set() (or "
                         "hvd.init(process_sets=...)) on every rank first" % (call, process_set))
    if process_set._comm is None:
        raise ValueError("%s: rank %d is not in %s; only its ranks may call its "
                         "collectives (check process_set.included())"
                         % (call, _handles.world().rank, process_set))
    return process_set._comm


def set_root(process_set, root_rank, call):
    """A broadcast's root_rank (a global rank, as in Horovod) as a rank of the set."""
    if process_set is None or process_set.process_set_id == 0:
        return int(root_rank)
    if int(root_rank) not in process_set.ranks:
        raise ValueError("%s: root_rank %d is not in %s" % (call, root_rank, process_set))
    return process_set.ranks.index(int(root_rank))
