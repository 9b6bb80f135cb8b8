"""hpcdl.torch.elastic - Horovod's elastic API (hvd.elastic.run, TorchState,
ObjectState, ElasticSampler; BatchScaling: the batch and lr re-derived for a
new size), restart-based: `hpcdl run --min-np M --max-np N
--max-restarts K` starts the job again on the hosts that remain after a rank
or host fails, and the script resumes from its last state.commit() with the
new world size. docs/horovod.md says how this differs from Horovod's
in-process recovery."""
from .run import run
from .sampler import ElasticSampler
from .scaling import BatchScaling
from .state import ObjectState, State
from .torch_state import TorchState

__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler", "BatchScaling"]
