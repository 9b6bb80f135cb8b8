"""launch.py - launch facts: are we inside an MPI job or a Slurm step, inside a
Slurm allocation's shell, how many tasks it has. The bottom of the import graph
(standard library only), so that cli/, data/ and vcluster/ all ask the same
questions the same way and nothing below the CLI has to import it.
"""
import os

# set by mpirun/mpiexec (Open MPI, MPICH's hydra, PMIx launchers) in every rank
MPI_ENV_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


def inside_parallel_job():
    """True inside ranks started by mpirun/mpiexec or by srun (a Slurm step):
    then hpcdl must not start a second layer of ranks."""
    if any(v in os.environ for v in MPI_ENV_VARS):
        return True
    # srun sets SLURM_STEP_ID for every task; a plain batch script has none
    return "SLURM_STEP_ID" in os.environ and "SLURM_PROCID" in os.environ


def inside_slurm_allocation():
    """True in the shell of a Slurm job (sbatch script, salloc) that is not one
    of the job's ranks: ranks are started there with srun."""
    return "SLURM_JOB_ID" in os.environ and not inside_parallel_job()


def allocation_tasks():
    """Tasks of this Slurm allocation (SLURM_NTASKS), None if Slurm does not say."""
    value = os.environ.get("SLURM_NTASKS", "")
    return int(value) if value.isdigit() else None


def env_rank():
    """Best guess at this process's rank before MPI is up (launcher env vars);
    only for choosing who prints, never for topology."""
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0
