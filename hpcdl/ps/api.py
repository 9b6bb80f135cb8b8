"""api.py - PSTrainer: the parameter server as a training loop sees it.

Every rank builds the same model and a PSTrainer around it with
PSTrainer.create(model, ...) (collective: it broadcasts rank 0's weights and
duplicates the communicator for the servers' point-to-point messages).
Ranks 0..K-1 become servers and call serve(); the others are workers and call
step() once per local batch, then end_round(). After each round (an epoch, or
any number of steps that is the same on every worker) sync_model() gives every
rank the servers' parameters, so the usual collective evaluation, reporting and
checkpointing run as in synchronous training.
"""
import time

import numpy as np
import torch

from .. import comm as hcomm
from . import config, protocol
from .server import Server
from .worker import Worker


class PSTrainer:
    """Parameter-server SGD for model on the job's ranks (see hpcdl.ps).
    Made by PSTrainer.create(...), which does the communication; the
    constructor only wires this rank's role from what create() made."""

    @classmethod
    def create(cls, model, mode="bsp", staleness=None, ps_ranks=1, momentum=0.0,
               weight_decay=0.0, comm=None, record=False):
        """Collective over comm (an hpcdl Communicator, default the world):
        checks the settings (the same PSConfigError on every rank), makes every
        rank's model rank 0's, and gives servers and workers a communicator of
        their own. Returns this rank's PSTrainer."""
        comm = comm if comm is not None else hcomm.world()
        layout = config.Layout.of(comm.size, mode, staleness, ps_ranks, momentum,
                                  weight_decay, record)
        tensors = list(model.parameters())
        bad = sorted({str(t.dtype) for t in tensors} - {"torch.float32"})
        if bad:
            raise config.PSConfigError("the parameter servers hold float32 parameters; the "
                                       "model has %s ones (build it in float32)" % bad)
        params = np.zeros(sum(t.numel() for t in tensors), np.float32)
        _flatten(tensors, params)
        comm.broadcast(params, root=0)  # rank 0's initial weights everywhere
        _unflatten(params, tensors)
        # The one place hpcdl.ps takes MPI into its own hands. Servers and
        # workers talk point-to-point (tagged Isend / Irecv, answered in whatever
        # order pushes arrive), which hpcdl.comm's collectives do not offer; a
        # duplicate of the job's communicator gives them private tags, so no
        # other message can match theirs. Everything collective stays on comm.
        p2p = comm.mpi.Dup()
        return cls(model, layout, comm, p2p, params)

    def __init__(self, model, layout, comm, p2p, params):
        """This rank's role in layout (config.Layout) on comm; p2p: the private
        communicator; params: the flat float32 parameters, already agreed."""
        self.model, self.layout, self.comm, self.mpi = model, layout, comm, p2p
        self.mode, self.staleness = layout.mode, layout.staleness
        self.num_servers, self.num_workers = layout.num_servers, layout.num_workers
        self.tensors = list(model.parameters())
        self.params = params
        self.bounds = protocol.shard_bounds(len(params), layout.num_servers)
        rank = comm.rank
        self.is_server = rank < layout.num_servers
        self.server = self.worker = None
        self.worker_rank = None if self.is_server else rank - layout.num_servers
        if self.is_server:
            lo, hi = self.bounds[rank]
            self.server = Server(p2p, rank, params[lo:hi].copy(), layout)
        else:
            self.grads = np.zeros_like(params)
            self.worker = Worker(p2p, self.worker_rank, params, self.grads, self.bounds)
        self.step_s = 0.0

    # ----------------------------------------------------------------- servers
    def serve(self):
        """Server ranks: answer the workers until each has called end_round()."""
        self._need(self.server, "serve()", "is a worker; call step() and end_round()")
        self.server.serve_round()

    # ----------------------------------------------------------------- workers
    def step(self, closure, lr):
        """Worker ranks: one step. Zeroes the gradients, calls closure() (which
        computes the loss on this worker's batch and calls backward()), pushes
        the gradients with learning rate lr, pulls the parameters for the next
        step into the model (waiting as the mode requires). Returns closure()'s
        result."""
        self._need(self.worker, "step()", "is a parameter server; call serve()")
        t0 = time.perf_counter()
        self.model.zero_grad()
        out = closure()
        self.push(lr)
        self.pull()
        self.step_s += time.perf_counter() - t0
        return out

    def push(self, lr):
        """Worker: sends the model's current gradients (None counts as zero)."""
        self._need(self.worker, "push()", "is a parameter server; call serve()")
        _flatten([t.grad for t in self.tensors], self.grads, like=self.tensors)
        self.worker.push(float(lr))

    def pull(self):
        """Worker: loads the servers' parameters into the model. Returns the
        fewest steps any worker had pushed when they were sent."""
        self._need(self.worker, "pull()", "is a parameter server; call serve()")
        min_clock = self.worker.pull()
        _unflatten(self.params, self.tensors)
        return min_clock

    def end_round(self):
        """Worker: this worker's steps of the round are done."""
        self._need(self.worker, "end_round()", "is a parameter server; call serve()")
        self.worker.end_round()

    # ------------------------------------------------------------ every rank
    def sync_model(self):
        """Collective: every rank's model gets the servers' parameters; float
        buffers (batch-norm statistics) come from worker 0."""
        self.params[:] = self._gather(lambda s: s.shard)
        _unflatten(self.params, self.tensors)
        buffers = [b for b in self.model.buffers() if b.is_floating_point()]
        for b in buffers:
            self.comm.broadcast(b.data, root=self.num_servers)

    def _gather(self, part_of):
        """Concatenates part_of(server) of every server, in shard order, on every rank."""
        counts = [hi - lo for lo, hi in self.bounds] + [0] * self.num_workers
        mine = part_of(self.server) if self.is_server else np.zeros(0, np.float32)
        return self.comm.allgather(np.ascontiguousarray(mine, np.float32),
                                   np.empty(len(self.params), np.float32), counts=counts)

    def stats(self):
        """This rank's counters: a worker's clock, wait time and staleness
        (clock - min_clock at each pull), a server's pushes and held pulls."""
        if self.is_server:
            return self.server.stats()
        return dict(self.worker.stats(), step_s=self.step_s)

    def gather_stats(self):
        """Collective: every rank's stats(), in rank order, on every rank."""
        return self.comm.allgather_object(dict(self.stats(), rank=self.comm.rank))

    def close(self):
        """Collective: frees the private communicator."""
        if self.mpi is not None:
            self.mpi.Free()
            self.mpi = None

    def _need(self, part, call, otherwise):
        if part is None:
            raise RuntimeError("%s on rank %d: this rank %s" % (call, self.comm.rank, otherwise))

    # ------------------------------------------------------------ checkpoints
    def state_dict(self):
        """Collective, between rounds: everything the next round depends on -
        parameters, momentum, update and push counters, worker clocks - the
        same dict on every rank."""
        counters = self.comm.allgather_object(
            (self.server.rule.updates, list(self.server.clock.pushes)) if self.is_server
            else self.worker.clock)
        return dict(format="hpcdl.ps/1", mode=self.mode, ps_ranks=self.num_servers,
                    num_workers=self.num_workers,
                    params=torch.from_numpy(self._gather(lambda s: s.shard)),
                    momentum=torch.from_numpy(self._gather(lambda s: s.rule.buf.numpy())),
                    updates=[c[0] for c in counters[:self.num_servers]],
                    pushes=[c[1] for c in counters[:self.num_servers]],
                    clocks=counters[self.num_servers:])

    def load_state_dict(self, state):
        """Collective: continue from state_dict()'s result (the same on every rank)."""
        want = (self.mode, self.num_servers, self.num_workers)
        got = (state.get("mode"), state.get("ps_ranks"), state.get("num_workers"))
        if state.get("format") != "hpcdl.ps/1" or got != want:
            raise config.PSConfigError(
                "this parameter-server state was saved with (mode, servers, workers) = %s but "
                "this job has %s; resume with the same --mode, -n and --ps-ranks" % (got, want))
        self.params[:] = state["params"].numpy()
        _unflatten(self.params, self.tensors)
        if self.is_server:
            j, s = self.comm.rank, self.server
            lo, hi = self.bounds[j]
            s.shard[:] = self.params[lo:hi]
            s.rule.buf.copy_(state["momentum"][lo:hi])
            s.rule.updates, s.clock.pushes = state["updates"][j], list(state["pushes"][j])
        else:
            self.worker.clock = state["clocks"][self.worker_rank]


def _flatten(tensors, flat, like=None):
    """Copies tensors (any device; None = zeros shaped like like[i]) into flat."""
    out, offset = torch.from_numpy(flat), 0
    for i, t in enumerate(tensors):
        n = (like[i] if t is None else t).numel()
        if t is None:
            out[offset:offset + n].zero_()
        else:
            out[offset:offset + n].copy_(t.detach().reshape(-1))
        offset += n


@torch.no_grad()
def _unflatten(flat, tensors):
    src, offset = torch.from_numpy(flat), 0
    for t in tensors:
        t.copy_(src[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
