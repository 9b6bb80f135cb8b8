"""setup.py - builds the C core (src_c/) into the extension hpcdl._core.

The MPI compiler wrapper ($MPICC, else mpicc on PATH) compiles and links, so
the core uses whatever MPI the cluster provides. CUDA parts are built when
nvcc is found, unless HPCDL_WITH_CUDA=0; HPCDL_WITH_CUDA=1 makes a missing
nvcc an error. Everything the build found is printed.
"""
import glob
import os
import shutil
import subprocess
import sys

if sys.version_info < (3, 10):
    sys.exit("hpcdl needs Python >= 3.10 (this is %d.%d). Hint: load a newer Python "
             "module or create the venv with python3.11." % sys.version_info[:2])

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
CORE_SOURCES = ["error.c", "reduce.c", "ring.c", "shm.c", "hierarchical.c", "context.c",
                "engine.c", "stall.c", "cuda_support.c", "shared.c", "python/core_module.c"]


def say(msg):
    print("hpcdl build: " + msg, flush=True)


def find_mpicc():
    mpicc = os.environ.get("MPICC") or shutil.which("mpicc")
    if not mpicc or not shutil.which(mpicc):
        sys.exit(
            "hpcdl build: no MPI C compiler wrapper found (looked at $MPICC and mpicc on "
            "PATH).\n  Debian/Ubuntu: apt-get install openmpi-bin libopenmpi-dev\n"
            "  Clusters: module load openmpi (or your site's MPI), then rebuild.\n"
            "  Or point MPICC at the wrapper: MPICC=/path/to/mpicc pip install .")
    return shutil.which(mpicc)


def mpi_description(mpicc):
    for args in (["--showme:version"], ["-v"]):
        try:
            out = subprocess.run([mpicc] + args, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        text = (out.stdout + out.stderr).strip().splitlines()
        if out.returncode == 0 and text:
            return text[0]
    return "unknown MPI"


def find_cuda():
    """(nvcc, cuda_home) or None, honouring HPCDL_WITH_CUDA=0/1."""
    want = os.environ.get("HPCDL_WITH_CUDA", "")
    if want == "0":
        say("CUDA: off (HPCDL_WITH_CUDA=0)")
        return None
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    if not nvcc:
        if want == "1":
            sys.exit("hpcdl build: HPCDL_WITH_CUDA=1 but nvcc is not on PATH. Hint: module "
                     "load cuda, or set NVCC=/path/to/nvcc.")
        say("CUDA: no (nvcc not found; set HPCDL_WITH_CUDA=1 to require it)")
        return None
    # nvcc reports its install root; wrapper scripts on PATH are common
    out = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull],
                         capture_output=True, text=True)
    home = next((ln.split("=", 1)[1] for ln in (out.stdout + out.stderr).splitlines()
                 if ln.startswith("#$ TOP=")), os.path.dirname(os.path.dirname(nvcc)))
    home = os.path.normpath(home)
    say("CUDA: yes (%s, %s)" % (nvcc, home))
    return nvcc, home


class BuildCore(build_ext):
    def build_extensions(self):
        mpicc = find_mpicc()
        say("MPI: %s (%s)" % (mpicc, mpi_description(mpicc)))
        # compile and link through the MPI wrapper: it knows the include and
        # library paths of the cluster's MPI
        for attr in ("compiler_so", "compiler", "linker_so"):
            cmd = list(getattr(self.compiler, attr))
            setattr(self.compiler, attr, [mpicc] + cmd[1:])
        self.compiler.set_executable("compiler_cxx", [mpicc])
        ext = self.extensions[0]
        cuda = find_cuda()
        if cuda:
            ext.define_macros.append(("HPCDL_WITH_CUDA", "1"))
            ext.include_dirs.append(os.path.join(cuda[1], "include"))
            ext.extra_objects.extend(self.build_cuda(cuda[0], mpicc))
            ext.library_dirs.append(os.path.join(cuda[1], "lib64"))
            ext.libraries.extend(["cudart_static", "dl", "rt"])
        build_ext.build_extensions(self)

    def build_cuda(self, nvcc, mpicc):
        """nvcc-compiles src_c/cuda/*.cu; returns the object files."""
        sources = sorted(glob.glob(os.path.join(HERE, "src_c", "cuda", "*.cu")))
        mpi_flags = subprocess.run([mpicc, "--showme:compile"], capture_output=True,
                                   text=True).stdout.split()
        objs = []
        os.makedirs(self.build_temp, exist_ok=True)
        # sm_80 = A100, sm_90 = H100/H200; PTX of the newest lets later GPUs JIT it
        archs = os.environ.get("HPCDL_CUDA_ARCHS", "80;90").split(";")
        gencode = []
        for a in archs:
            gencode += ["-gencode", "arch=compute_%s,code=sm_%s" % (a, a)]
        gencode += ["-gencode", "arch=compute_%s,code=compute_%s" % (archs[-1], archs[-1])]
        # nvcc's host code needs the C++ runtime (guards of its launch stubs' statics)
        self.extensions[0].libraries.append("stdc++")
        for src in sources:
            obj = os.path.join(self.build_temp, os.path.basename(src) + ".o")
            cmd = [nvcc, "-O3", "-Xcompiler", "-fPIC", *gencode,
                   "-I" + os.path.join(HERE, "src_c", "include"),
                   "-I" + os.path.join(HERE, "src_c"), *mpi_flags, "-c", src, "-o", obj]
            say("nvcc " + os.path.basename(src))
            subprocess.run(cmd, check=True)
            objs.append(obj)
        return objs


class BuildPy(build_py):
    """Also copies the sbatch templates (slurm/*.sbatch, their one source) into
    the package as hpcdl/slurm/templates, so `hpcdl slurm list` finds them in
    an installed wheel; a checkout or editable install reads slurm/ itself.
    A copy, not a symlink: links break in zips, on some file systems and in
    checkouts without symlink support."""

    def run(self):
        build_py.run(self)
        target = os.path.join(self.build_lib, "hpcdl", "slurm", "templates")
        self.mkpath(target)
        for src in sorted(glob.glob(os.path.join(HERE, "slurm", "*.sbatch"))):
            self.copy_file(src, os.path.join(target, os.path.basename(src)))


def mpi4py_include():
    try:
        import mpi4py
    except ImportError:
        sys.exit("hpcdl build: mpi4py is needed at build time (pip install mpi4py).")
    return mpi4py.get_include()


def core_extension():
    return Extension(
        "hpcdl._core",
        sources=[os.path.join("src_c", s) for s in CORE_SOURCES]
        + sorted(os.path.relpath(p, HERE)
                 for p in glob.glob(os.path.join(HERE, "src_c", "cuda", "*.c"))),
        include_dirs=[os.path.join("src_c", "include"), "src_c", mpi4py_include()],
        extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wno-unused-parameter"],
        libraries=["pthread", "m"],
    )


if __name__ == "__main__":  # pip's build backend runs setup.py as __main__ too
    setup(ext_modules=[core_extension()], cmdclass={"build_ext": BuildCore, "build_py": BuildPy})
