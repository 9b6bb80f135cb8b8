"""torch_state.py - TorchState: a model, an optimizer, ElasticSamplers and
plain attributes kept together at each commit (Horovod's TorchState).

Each keyword whose value is a torch.nn.Module, a torch.optim.Optimizer (a
DistributedOptimizer included) or an ElasticSampler gets a handler that
copies its state_dict at save(), loads it at restore() and gives every rank
rank 0's at sync(); so does a BatchScaling (scaling.py), whose on_reset()
re-derives the batch and lr for the new size before the reset callbacks run;
every other keyword is an ObjectState attribute.
Assigning state.model = other_model later re-points the handler."""
import copy

import torch

from .. import functions
from .sampler import ElasticSampler
from .scaling import BatchScaling
from .state import ObjectState


class _Handler:
    def __init__(self, value):
        self.value = value
        self.saved = None
        self.save()

    def save(self):
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(copy.deepcopy(self.saved))


class _ModelHandler(_Handler):
    def sync(self):
        functions.broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def sync(self):
        functions.broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_Handler):
    def sync(self):
        state = functions.broadcast_object(self.value.state_dict(), 0,
                                           name="elastic.sampler")
        self.value.load_state_dict(state)


class _ScalingHandler(_SamplerHandler):
    def reset(self):
        self.value.on_reset()


def _handler_for(value):
    if isinstance(value, BatchScaling):
        return _ScalingHandler(value)
    if isinstance(value, torch.nn.Module):
        return _ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer) or (
            hasattr(value, "state_dict") and hasattr(value, "param_groups")):
        return _OptimizerHandler(value)
    if isinstance(value, ElasticSampler):
        return _SamplerHandler(value)
    return None


class TorchState(ObjectState):
    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers = {k: _handler_for(v) for k, v in kwargs.items()}
        object.__setattr__(self, "_handlers", {k: h for k, h in handlers.items() if h})
        for name, handler in self._handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(**{k: v for k, v in kwargs.items() if k not in self._handlers})

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].value = value
        object.__setattr__(self, name, value)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def on_reset(self):
        """BatchScaling's rule for the new size first, then the reset callbacks."""
        for handler in self._handlers.values():
            if isinstance(handler, _ScalingHandler):
                handler.reset()
        super().on_reset()

    def _saved_payload(self):
        return dict(super()._saved_payload(),
                    handlers={k: h.saved for k, h in self._handlers.items()})

    def _install_payload(self, saved):
        super()._install_payload(saved)
        missing = sorted(set(self._handlers) - set(saved.get("handlers", {})))
        if missing:
            raise RuntimeError("elastic: the last commit has no %s; it was written by "
                               "another script or state (delete HPCDL_ELASTIC_DIR's "
                               "commits to start from scratch)" % ", ".join(missing))
        for name, handler in self._handlers.items():
            handler.saved = saved["handlers"][name]
