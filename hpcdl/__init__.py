"""hpcdl - MPI-based data-parallel deep learning for HPC clusters.

Layers: hpcdl.comm (collectives over MPI, C core), hpcdl.torch (Horovod-
compatible PyTorch API), hpcdl.train (the built-in trainer), hpcdl.cli (the
`hpcdl` command). Importing hpcdl does not start MPI; hpcdl.comm.init() does.
"""
from ._version import __version__

__all__ = ["__version__"]
