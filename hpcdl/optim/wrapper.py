"""wrapper.py - OptimizerWrapper, the base of optimizers that wrap another
(LARC here, hpcdl.torch.DistributedOptimizer): param_groups and state are the
wrapped optimizer's own objects, so LR schedulers, state_dict() and
checkpoints see one optimizer, and wrappers nest (DistributedOptimizer(LARC(
SGD))). A plain wrapper, not a dynamically made subclass."""
import torch


class OptimizerWrapper(torch.optim.Optimizer):
    """Subclasses call super().__init__(optimizer) and override step()."""

    def __init__(self, optimizer, params=None):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError("%s wraps a torch.optim.Optimizer, got %s"
                            % (type(self).__name__, type(optimizer).__name__))
        if params is None:
            params = [p for g in optimizer.param_groups for p in g["params"]]
        super().__init__(params, dict(optimizer.defaults))
        self.param_groups, self.state = optimizer.param_groups, optimizer.state
        self._opt = optimizer

    @property
    def optimizer(self):
        """The wrapped optimizer."""
        return self._opt

    def state_dict(self):
        return self._opt.state_dict()

    def load_state_dict(self, state_dict):
        self._opt.load_state_dict(state_dict)  # it replaces its groups and state
        self.param_groups, self.state = self._opt.param_groups, self._opt.state

    def add_param_group(self, param_group):
        if not hasattr(self, "_opt"):  # torch.optim.Optimizer.__init__ building groups
            return super().add_param_group(param_group)
        return self._opt.add_param_group(param_group)
