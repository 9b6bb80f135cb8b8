"""_join.py - hvd.join() with Horovod's semantics, over the descriptor
round that every hpcdl.torch collective already opens with (_shapes.py).

A rank that calls join() stops making collectives of its own and answers
the other ranks' instead, until every rank has joined:

    joined rank:  round(JOINED row) -> others' rows -> answer their data items
    other ranks:  round(their row)  -> data items    -> check(rows)

  allreduce (and grouped_allreduce): the joined rank all-reduces zeros of
      each data item's count and dtype with the same op, so Sum gets nothing
      from it and Average still divides by the set's size (Horovod: the
      result of size - 1 ranks averaging x is x * (size - 1) / size);
  broadcast, reducescatter: it takes part with zeros, and every other rank
      raises "Broadcast is not supported with Join at this time" (Horovod's
      words and rule);
  allgather: no rank sends data (its counts come from the round), and the
      others raise the same way;

  DistributedOptimizer (zero_stage=0, global set): its step's round names
      the optimizer; the joined rank all-reduces every bucket of its own
      copy, zeroed, in bucket order (reducer.py join_answer), so the
      others average their gradients with its zeros, as in Horovod.

join() returns the rank that joined last: every rank learns it from the
round in which all rows are JOINED (a row says whether its rank joined in
that very round; of several, the highest rank). Ranks then go on as usual.

alltoall and Adasum open with a round too (blocking): with a joined rank
they raise "Alltoall / Adasum is not supported with Join" on every rank
that called them, before any data moves.

What join() cannot answer: hvd.barrier (MPI_Barrier through mpi4py: a rank
may queue an allgather_async while the others wait in it, so it cannot go
through the engine's rounds), DistributedOptimizer with zero_stage 1 or 2
(reduce-scatters), direct hpcdl.comm calls, and collectives on a process
set other than the global one. Do not call those while a rank may have
joined.
"""
import weakref

import torch

from . import _handles
from .exceptions import HorovodInternalError
from ._shapes import (ITEMS, JOINED, KIND, KINDS, NITEMS, OP, ROOT, ROW_ELEMS, SLOTS,
                      descriptor, dtype_of, joined_row, start_round)

# join number -> Reducer whose steps join() can answer (reducer.py registers
# them here, so that imports run one way: reducer -> _join)
joinable = weakref.WeakValueDictionary()


def join(device=-1):
    """Collective over every rank: this rank has no more data. Until every
    rank has joined, it answers the others' allreduces with zeros (and their
    broadcasts, reducescatters and allgathers so that they fail at once
    instead of waiting). Returns the rank that joined last, on every rank.
    device: a CUDA device for the zero tensors (-1: the CPU), as in Horovod."""
    on = _handles.world()
    _handles.flush(on)
    where = torch.device("cuda", device) if device >= 0 and torch.cuda.is_available() \
        else torch.device("cpu")
    newly = True
    while True:
        handle, rows = start_round(on, joined_row(newly), "join")
        newly = False
        try:
            handle.wait()
        except RuntimeError as e:  # e.g. the core's agreement check: another kind of call
            raise HorovodInternalError(
                "hvd.join(): another rank made a collective that a joined rank cannot "
                "answer (only hvd.* collectives and DistributedOptimizer steps with "
                "zero_stage=0 on the global process set; see docs/horovod.md): %s" % e) from e
        rows = rows.tolist()
        live = [r for r in rows if r[KIND] != JOINED]
        if not live:
            return max(i for i, r in enumerate(rows) if r[OP])
        _answer(on, live[0], where)


def _answer(on, row, where):
    """Takes part in the data items that row (another rank's descriptor) announced."""
    kind = KINDS[row[KIND]]
    items = [(row[ITEMS + 2 * i], dtype_of(row[ITEMS + 2 * i + 1]))
             for i in range(min(row[NITEMS], SLOTS))]
    handles = []
    if kind == "allreduce":
        for count, dtype in items:
            handles.append(on.allreduce_async(torch.zeros(count, dtype=dtype, device=where),
                                              op=row[OP], name="join.zeros"))
        handles += [_invalid(on) for _ in range(row[NITEMS] - SLOTS)]
    elif kind == "optimizer":
        reducer = joinable.get(row[ROOT])
        if reducer is None or len(reducer.buckets) != row[NITEMS]:
            handles += [_invalid(on) for _ in range(row[NITEMS])]
        else:
            handles += reducer.join_answer(row[OP])
    elif kind == "broadcast":
        count, dtype = items[0]
        handles.append(_handles.start("broadcast", torch.zeros(count, dtype=dtype),
                                      root=row[ROOT], name="join.broadcast", on=on))
    elif kind == "reducescatter":
        count, dtype = items[0]
        row_elems = row[ROW_ELEMS]
        q, extra = divmod(count // row_elems if row_elems else 0, on.size)
        counts = [(q + (1 if r < extra else 0)) * row_elems for r in range(on.size)]
        handles.append(_handles.start("reduce_scatter", torch.zeros(count, dtype=dtype),
                                      torch.empty(counts[on.rank], dtype=dtype),
                                      counts=counts, op=row[OP], name="join.reducescatter",
                                      on=on))
    for h in handles:
        try:
            h.wait()
        except Exception:  # noqa: BLE001 - the others' error: they report it
            pass


def start_step_round(on, number, op, items):
    """Queues the round that opens a Reducer's step (its join number, op and
    buckets' (size, dtype)); returns its comm handle (wait before the next)."""
    row = descriptor("optimizer", [], op=op, root=number, items=items)
    handle, _ = start_round(on, row, "optimizer")
    return handle


class _Failed:
    def wait(self):
        return None


def _invalid(on):
    """Joins a data item that cannot be answered as an invalid buffer, so
    that the ranks that sent it fail (the core's agreement check)."""
    try:
        on.allreduce_async(None, name="join.invalid")
    except (TypeError, ValueError):
        pass
    return _Failed()
