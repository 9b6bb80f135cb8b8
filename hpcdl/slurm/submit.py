"""submit.py - hands a rendered script to sbatch and returns the job id.
sbatch's own message is passed on when it refuses a job."""
import os
import shutil
import subprocess

from ..utils.atomic import atomic_open


class SubmitError(RuntimeError):
    """sbatch is missing or refused the job; the message is Slurm's."""


def sbatch(script, save=None, timeout=120):
    """Submits script text through sbatch (on its standard input, or from
    `save`, which is written first, when given). Returns the job id (str)."""
    exe = shutil.which("sbatch")
    if not exe:
        raise SubmitError("sbatch is not on PATH: submit from a Slurm login node, or write "
                          "the script with `hpcdl slurm render ... > job.sbatch` and submit "
                          "it there")
    if save:
        with atomic_open(save, "w", durable=False) as f:
            f.write(script)
        os.chmod(save, 0o755)
        line, stdin = [exe, "--parsable", save], None
    else:
        line, stdin = [exe, "--parsable"], script
    try:
        out = subprocess.run(line, input=stdin, capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SubmitError("sbatch did not answer within %d s (is slurmctld up? try "
                          "`sinfo`)" % timeout)
    if out.returncode != 0:
        message = (out.stderr.strip() or out.stdout.strip() or "no message").splitlines()
        raise SubmitError("sbatch refused the job (exit %d): %s"
                          % (out.returncode, " / ".join(message)))
    # --parsable prints 'jobid' or 'jobid;cluster'
    return out.stdout.strip().splitlines()[-1].split(";")[0]
