"""sync_batch_norm.py - SyncBatchNorm: batch normalisation whose training
statistics come from the whole global batch (every rank's samples), for
when each rank holds only a few samples. CPU and CUDA.

Shapes: x is (B, C, *) on each rank; n_r = B * prod(*) values per channel.
Forward (one all-gather of [n_r, mean_r, var_r] per rank, combined in
float64 the stable way rather than from sums of squares):
    N = sum n_r,  mean = sum n_r mean_r / N,
    var = sum n_r (var_r + (mean_r - mean)^2) / N          (biased)
    y = (x - mean) / sqrt(var + eps) * weight + bias
Backward (one all-reduce of [sum dy, sum dy (x - mean)] over ranks):
    dx = weight * invstd * (dy - mean_dy - (x - mean) * invstd^2 * mean_dy_xmu)
grad_weight and grad_bias stay local, as in Horovod and torch: the
DistributedOptimizer all-reduces them with every other gradient.
Eval mode with running statistics uses them (no communication), as does a
single rank; eval without running statistics syncs batch statistics, as in
Horovod.
"""
import torch
import torch.nn.functional as F
# _BatchNorm is torch-internal but stable since 1.0: it owns the parameters,
# buffers, reset and state_dict layout that BatchNorm1d/2d/3d share.
from torch.nn.modules.batchnorm import _BatchNorm

from .allreduce_ops import allreduce
from .gather_ops import allgather
from .mpi_ops import Sum, size


class SyncBatchNorm(_BatchNorm):
    """Batch norm over the global batch; drop-in for nn.BatchNorm1d/2d/3d.
    Arguments as nn.BatchNorm2d (momentum=None: cumulative average)."""

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("SyncBatchNorm expects at least 2-D input (B, C, ...), got "
                             "%d-D" % input.dim())

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        batch_stats = self.training or not self.track_running_stats
        if not batch_stats or size() == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, batch_stats, factor, self.eps)
        update = self.training and self.track_running_stats
        return _SyncBatchNormFn.apply(input, self.weight, self.bias,
                                      self.running_mean if update else None,
                                      self.running_var if update else None,
                                      self.eps, factor)

    @classmethod
    def convert_sync_batchnorm(cls, module):
        """module with every BatchNorm*d replaced by a SyncBatchNorm (same state)."""
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum, module.affine,
                      module.track_running_stats)
            state = module.state_dict()
            like = next((t for t in state.values() if t.is_floating_point()), None)
            if like is not None:  # same device and precision as the module it replaces
                out = out.to(device=like.device, dtype=like.dtype)
            out.load_state_dict(state)
            out.train(module.training)
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child))
        return out


def _view(v, x):
    """A per-channel vector shaped to broadcast against x (B, C, *)."""
    return v.view((1, -1) + (1,) * (x.dim() - 2))


def _compute_dtype(x):
    """float32 for half-precision inputs, else x's dtype (as torch's batch norm)."""
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def _global_stats(x):
    """(mean, var, N) per channel over every rank's batch; x in its compute dtype."""
    dims, channels = [0] + list(range(2, x.dim())), x.shape[1]
    n = x.numel() // channels
    if n:
        var, mean = torch.var_mean(x.detach(), dims, unbiased=False)
    else:  # an empty local batch contributes nothing
        var = mean = x.new_zeros(channels)
    mine = torch.cat([x.new_tensor([n]), mean, var]).to(torch.float64).unsqueeze(0)
    every = allgather(mine, name="sync_batch_norm.stats")
    counts, means, variances = every[:, :1], every[:, 1:1 + channels], every[:, 1 + channels:]
    total = counts.sum().item()
    if total == 0:
        raise ValueError("SyncBatchNorm: the global batch is empty on every rank")
    g_mean = (counts * means).sum(0) / total
    g_var = (counts * (variances + (means - g_mean) ** 2)).sum(0) / total
    return g_mean.to(x.dtype), g_var.to(x.dtype), total


class _SyncBatchNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum):
        xc = x.contiguous().to(_compute_dtype(x))
        mean, var, total = _global_stats(xc)
        if running_mean is not None:
            unbiased = var * (total / max(total - 1, 1))
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        invstd = torch.rsqrt(var + eps)
        scale = invstd if weight is None else invstd * weight.detach().to(xc.dtype)
        shift = -mean * scale
        if bias is not None:
            shift = shift + bias.detach().to(xc.dtype)
        ctx.save_for_backward(xc, weight, mean, invstd)
        ctx.total, ctx.in_dtype = total, x.dtype
        return (xc * _view(scale, xc) + _view(shift, xc)).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        xc, weight, mean, invstd = ctx.saved_tensors
        dims = [0] + list(range(2, xc.dim()))
        dy = dy.to(xc.dtype)
        xmu = xc - _view(mean, xc)
        sum_dy, sum_dy_xmu = dy.sum(dims), (dy * xmu).sum(dims)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            sums = allreduce(torch.cat([sum_dy, sum_dy_xmu]), op=Sum,
                             name="sync_batch_norm.grad_sums") / ctx.total
            mean_dy, mean_dy_xmu = sums.chunk(2)
            g = invstd if weight is None else invstd * weight.to(xc.dtype)
            dx = dy - _view(mean_dy, xc) - xmu * _view(invstd * invstd * mean_dy_xmu, xc)
            dx = (dx * _view(g, xc)).to(ctx.in_dtype)
        if weight is not None and ctx.needs_input_grad[1]:
            dw = (sum_dy_xmu * invstd).to(weight.dtype)
        if ctx.needs_input_grad[2]:
            db = sum_dy.to(ctx.in_dtype if weight is None else weight.dtype)
        return dx, dw, db, None, None, None, None
