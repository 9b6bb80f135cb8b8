"""state.py - what an elastic job keeps at each commit (Horovod's
hvd.elastic.State, ObjectState and TorchState).

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    state.commit()      # save(): a copy in memory; rank 0 also writes it to the
                        # job's elastic directory when hpcdl run made one
    state.restore()     # back to the last save()
    state.sync()        # rank 0's values on every rank

hpcdl's elastic is restart-based (docs/horovod.md): a lost rank ends the
MPI job, `hpcdl run --max-restarts` starts it again on the hosts that
remain, and run() (run.py) loads the last commit on rank 0 and syncs it.
So the objects a state holds must be picklable, as Horovod's are."""
import abc
import copy

from .. import functions, mpi_ops
from . import _store


class State(abc.ABC):
    """Reset callbacks and commit(); subclasses say what save/restore/sync mean
    (the abstract methods below: ObjectState and TorchState implement them)."""

    def __init__(self):
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions called (no arguments) after the job came back from a
        restart, so that e.g. the learning rate can follow the new size()."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """A point the job can come back to: save() here, and on disk (rank 0)."""
        self.save()
        if _store.directory() is not None and mpi_ops.rank() == 0:
            _store.save({"size": mpi_ops.size(), "saved": self._saved_payload()})
        self.check_host_updates()

    def check_host_updates(self):
        """Horovod raises HostsUpdatedInterrupt here when hosts changed; hpcdl
        learns of new hosts only at a restart, so there is nothing to do."""

    def load_commit(self, payload):
        """Installs a commit read from disk as the last save() and restores it."""
        self._install_payload(payload["saved"])
        self.restore()

    @abc.abstractmethod
    def save(self):
        """Keep a copy of the current values (in memory)."""

    @abc.abstractmethod
    def restore(self):
        """Go back to the last save()."""

    @abc.abstractmethod
    def sync(self):
        """Give every rank rank 0's values."""

    @abc.abstractmethod
    def _saved_payload(self):
        """The last save() as a picklable dict, for the commit file."""

    @abc.abstractmethod
    def _install_payload(self, saved):
        """Make a commit file's dict the last save()."""


class ObjectState(State):
    """Plain attributes (numbers, lists, any picklable object) given as
    keyword arguments; sync() broadcasts rank 0's. bcast_object and get_rank
    are accepted for Horovod's signature and default to hpcdl's."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        self._bcast_object = bcast_object or functions.broadcast_object
        self._get_rank = get_rank or mpi_ops.rank
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__()

    def save(self):
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state, 0,
                                                   name="elastic.attributes")
            self._set_attrs()

    def _set_attrs(self):
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))

    def _saved_payload(self):
        return {"attrs": self._saved_state}

    def _install_payload(self, saved):
        self._saved_state = saved["attrs"]
