"""torch_autograd_check.py - run under mpirun: gradients through
hpcdl.torch's collectives against one process that holds every rank's
input and computes the same function with plain torch.

Rank r's loss is sum(w_r * y_r) with rank-dependent weights w_r. Horovod's
conventions, which hpcdl follows: allreduce and alltoall differentiate the
sum of the ranks' losses; allgather and broadcast the average of them
(Horovod >= 0.22 all-reduces their gradient with Average); reducescatter N
times their sum (Horovod all-gathers the gradient and scales it by the set
size for Sum, not at all for Average: horovod/torch/mpi_ops.py).
Prints 'CHECKS n FAILED k'."""
import torch

from torch_common import N, R, close, hvd, run, values


def inputs(shapes):
    """Every rank's input, float64, non-integer, rank- and position-dependent."""
    return [values(k, s) * 0.25 + 0.1 * (k + 1) for k, s in enumerate(shapes)]


def weights(k, shape):
    return values(k + 5, shape) * 0.5 + 1.0


def compare(what, shapes, dist_fn, ref_fn, mean_loss=False, times=1):
    """dist_fn(x) -> y on this rank; ref_fn(xs) -> [y_k for every rank k]."""
    xs = inputs(shapes)
    x = xs[R].clone().requires_grad_()
    y = dist_fn(x)
    (weights(R, y.shape) * y).sum().backward()
    ref = [t.clone().requires_grad_() for t in xs]
    ys = ref_fn(ref)
    close(y.detach(), ys[R].detach(), what + " forward")
    loss = sum((weights(k, yk.shape) * yk).sum() for k, yk in enumerate(ys))
    (times * (loss / N if mean_loss else loss)).backward()
    want = ref[R].grad if ref[R].grad is not None else torch.zeros_like(ref[R])
    close(x.grad, want, what + " gradient")


def allreduce_grads():
    for op, reduce in ((hvd.Sum, lambda s: s.sum(0)), (hvd.Average, lambda s: s.mean(0))):
        name = "Sum" if op == hvd.Sum else "Average"
        compare("allreduce %s" % name, [(3, 4)] * N,
                lambda x: hvd.allreduce(x, op=op, prescale_factor=0.5, postscale_factor=3.0),
                lambda xs: [3.0 * reduce(torch.stack([0.5 * x for x in xs]))] * N)

        def dist(x, op=op):
            a, b = x[:12].view(3, 4), x[12:]
            ya, yb = hvd.grouped_allreduce([a, b], op=op)
            return torch.cat([ya.reshape(-1), yb])

        def ref(xs, reduce=reduce):
            return [reduce(torch.stack(xs))] * N
        compare("grouped_allreduce %s" % name, [(17,)] * N, dist, ref)


def allgather_and_broadcast_grads():
    rows = [k + 1 for k in range(N)]
    compare("allgather uneven rows", [(n, 3) for n in rows], hvd.allgather,
            lambda xs: [torch.cat(xs)] * N, mean_loss=True)

    def grouped(x):  # two tensors from one input: rows split 1 | rest, second one doubled
        a, b = hvd.grouped_allgather([x[:1], 2.0 * x[1:]])
        return torch.cat([a.reshape(-1), b.reshape(-1)])

    def grouped_ref(xs):
        a, b = torch.cat([x[:1] for x in xs]), torch.cat([2.0 * x[1:] for x in xs])
        return [torch.cat([a.reshape(-1), b.reshape(-1)])] * N
    compare("grouped_allgather", [(n + 1, 3) for n in rows], grouped, grouped_ref,
            mean_loss=True)
    root = 1 % N
    compare("broadcast root %d" % root, [(4, 2)] * N, lambda x: hvd.broadcast(x, root),
            lambda xs: [xs[root] * 1.0] * N, mean_loss=True)


def reducescatter_grads():
    rows = 2 * N + 1
    q, extra = divmod(rows, N)
    cuts = [q + (1 if k < extra else 0) for k in range(N)]
    for op, reduce in ((hvd.Sum, lambda s: s.sum(0)), (hvd.Average, lambda s: s.mean(0))):
        def ref(xs, reduce=reduce):
            full = 2.0 * reduce(torch.stack([0.5 * x for x in xs]))
            return list(torch.split(full, cuts))
        compare("reducescatter %s" % ("Sum" if op == hvd.Sum else "Average"), [(rows, 3)] * N,
                lambda x, op=op: hvd.reducescatter(x, op=op, prescale_factor=0.5,
                                                   postscale_factor=2.0), ref, times=N)

        def grouped(x, op=op):  # the same rows twice: as they are and tripled
            a, b = hvd.grouped_reducescatter([x, 3.0 * x], op=op, prescale_factor=0.5,
                                             postscale_factor=2.0)
            return torch.cat([a, b])

        def grouped_ref(xs, ref=ref):
            return [torch.cat([a, 3.0 * a]) for a in ref(xs)]
        compare("grouped_reducescatter %s" % ("Sum" if op == hvd.Sum else "Average"),
                [(rows, 3)] * N, grouped, grouped_ref, times=N)


def alltoall_grads():
    split = [[(src + 2 * dst) % 3 for dst in range(N)] for src in range(N)]
    shapes = [(sum(split[k]), 2) for k in range(N)]

    def ref(xs):
        blocks = [torch.split(x, split[k]) for k, x in enumerate(xs)]
        return [torch.cat([blocks[src][dst] for src in range(N)]) for dst in range(N)]
    compare("alltoall uneven", shapes, lambda x: hvd.alltoall(x, splits=split[R])[0], ref)


if __name__ == "__main__":
    run(allreduce_grads, allgather_and_broadcast_grads, reducescatter_grads, alltoall_grads)
