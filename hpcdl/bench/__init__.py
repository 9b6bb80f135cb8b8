"""hpcdl.bench - benchmarks that print nccl-tests-shaped tables and check
correctness in the same run. Each benchmark is a module with run(options)
-> exit status, started by `hpcdl bench NAME` (hpcdl/cli/bench.py).

    allreduce   hpcdl's all-reduce algorithms against MPI_Allreduce and gloo
"""


class EveryRankError(ValueError):
    """A setup problem found collectively, so raised on every rank alike (a
    GPU missing on some rank, say): the CLI prints it as one line and exits 2
    instead of aborting the job."""
