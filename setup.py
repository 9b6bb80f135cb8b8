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
# the core's C files, as src_c/Makefile finds them, plus the binding; the
# src_c/cuda/*.c files compile to nothing without CUDA, its *.cu are build_cuda's
CORE_SOURCE_GLOBS = ["*.c", "python/*.c", "cuda/*.c"]


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


# ---------------------------------------------------------------- which MPI the core is built on
# Open MPI and the MPICH family (MPICH, Intel MPI, MVAPICH, Cray MPICH) are not
# interchangeable at run time; the core must be called through the MPI that
# mpi4py loaded. The build compiles and runs this probe with the wrapper and
# records the answer in hpcdl/_mpi_build.py, which hpcdl.utils.mpi_info
# compares with mpi4py's MPI before the core's first MPI call.
MPI_PROBE = r"""
#include <mpi.h>
#include <stdio.h>
int main(void) {
#if defined(OPEN_MPI)
    printf("family=openmpi\nheader=Open MPI %d.%d.%d\n", OMPI_MAJOR_VERSION,
           OMPI_MINOR_VERSION, OMPI_RELEASE_VERSION);
#elif defined(I_MPI_VERSION)
    printf("family=mpich\nheader=Intel MPI %s\n", I_MPI_VERSION);
#elif defined(MVAPICH2_VERSION)
    printf("family=mpich\nheader=MVAPICH2 %s\n", MVAPICH2_VERSION);
#elif defined(MPICH_VERSION)
    printf("family=mpich\nheader=MPICH %s\n", MPICH_VERSION);
#else
    printf("family=unknown\nheader=MPI %d.%d\n", MPI_VERSION, MPI_SUBVERSION);
#endif
    fflush(stdout);
    /* allowed before MPI_Init (MPI-3): no launcher, no singleton start-up */
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(lib, &len);
    printf("library=%s\n", lib);
    return 0;
}
"""


def not_an_mpi_wrapper(mpicc, why):
    sys.exit("hpcdl build: MPICC=%s is not an MPI C compiler wrapper (%s). Fix: point MPICC at "
             "your MPI's wrapper (mpicc, mpicc.mpich, mpiicc; module load openmpi), e.g. "
             "MPICC=mpicc pip install ." % (mpicc, why))


def probe_mpi(mpicc, workdir):
    """{'family': 'openmpi'|'mpich'|'unknown', 'library': first line of
    MPI_Get_library_version (the header's version when the probe cannot run)}.
    Exits with a one-line error when mpicc cannot compile and link MPI code."""
    os.makedirs(workdir, exist_ok=True)
    src, exe = os.path.join(workdir, "mpi_probe.c"), os.path.join(workdir, "mpi_probe")
    with open(src, "w") as f:
        f.write(MPI_PROBE)
    try:
        out = subprocess.run([mpicc, src, "-o", exe], capture_output=True, text=True,
                             timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        not_an_mpi_wrapper(mpicc, "running it failed: %s" % e)
    if out.returncode != 0:
        errors = [ln for ln in (out.stdout + out.stderr).splitlines()
                  if "error" in ln or "undefined reference" in ln]
        not_an_mpi_wrapper(mpicc, "it cannot build a program that includes mpi.h: %s"
                           % (errors[0].strip() if errors else "exit %d" % out.returncode))
    # a launcher's variables would make the probe look for its job
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMI_", "PMIX_", "HYDI_", "MPI_LOCAL"))}
    try:
        run = subprocess.run([exe], capture_output=True, text=True, timeout=60, env=env)
        text = run.stdout
    except (OSError, subprocess.TimeoutExpired):
        text = ""
    fields = {}
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq and key in ("family", "header", "library") and key not in fields:
            fields[key] = " ".join(value.split())
    if not fields:  # built but cannot run here (cross-compiling): the header says enough
        pre = subprocess.run([mpicc, "-E", "-dM", src], capture_output=True, text=True)
        macros = pre.stdout
        fields["family"] = ("openmpi" if "#define OPEN_MPI " in macros else
                            "mpich" if "#define MPICH_VERSION " in macros else "unknown")
        fields["library"] = "%s MPI (version from its header; the probe did not run)" % (
            {"openmpi": "Open MPI", "mpich": "MPICH family"}.get(fields["family"], "unknown"))
    fields.setdefault("library", fields.get("header", "unknown MPI"))
    return fields


def write_mpi_record(path, mpicc, probe):
    """hpcdl/_mpi_build.py beside the built core (generated; not in git)."""
    with open(path, "w") as f:
        f.write('"""_mpi_build.py - generated by setup.py when it built hpcdl._core: the MPI\n'
                'the core was compiled against. Read by hpcdl.utils.mpi_info."""\n')
        f.write("FAMILY = %r\n" % probe["family"])
        f.write("LIBRARY = %r\n" % probe["library"])
        f.write("MPICC = %r\n" % mpicc)
        f.write("MPICC_REAL = %r\n" % os.path.realpath(mpicc))


def mpi_compile_flags(mpicc):
    """The wrapper's include and define flags, for compilers it does not wrap
    (nvcc): Open MPI's --showme:compile, MPICH's -compile_info, else -show
    (Intel MPI, MVAPICH, older wrappers). Only -I/-D/-isystem words are kept:
    the rest (the compiler's name, -Wl, libraries) is not nvcc's business."""
    for args in (["--showme:compile"], ["-compile_info"], ["-show"]):
        try:
            out = subprocess.run([mpicc] + args, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode != 0:
            continue
        words, flags = out.stdout.split(), []
        for i, w in enumerate(words):
            if w in ("-I", "-D", "-isystem") and i + 1 < len(words):
                flags += [w, words[i + 1]]
            elif w.startswith(("-I", "-D")) and len(w) > 2:
                flags.append(w)
        return flags
    return []


def cuda_archs():
    """HPCDL_CUDA_ARCHS, default sm_75 (T4), sm_80 (A100), sm_90 (H100/H200); PTX of
    the newest lets later GPUs JIT it. nvcc 13 dropped sm_70 (V100): build with
    CUDA 12 and HPCDL_CUDA_ARCHS="70;80;90" for it."""
    return os.environ.get("HPCDL_CUDA_ARCHS", "75;80;90").split(";")


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
        probe = probe_mpi(mpicc, self.build_temp)
        say("MPI: %s (%s; library: %s)" % (mpicc, mpi_description(mpicc), probe["library"]))
        # beside the built core; an editable install copies only the core into
        # the checkout, so the record goes there itself
        records = [os.path.join(os.path.dirname(self.get_ext_fullpath("hpcdl._core")),
                                "_mpi_build.py")]
        if self.inplace or getattr(self, "editable_mode", False):
            records.append(os.path.join(HERE, "hpcdl", "_mpi_build.py"))
        for record in records:
            os.makedirs(os.path.dirname(record), exist_ok=True)
            write_mpi_record(record, mpicc, probe)
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
            # the core names the built architectures when a GPU is not among them
            ext.define_macros.append(("HPCDL_CUDA_ARCHS", '"%s"' % ",".join(cuda_archs())))
            ext.include_dirs.append(os.path.join(cuda[1], "include"))
            ext.extra_objects.extend(self.build_cuda(cuda[0], mpicc))
            ext.library_dirs.append(os.path.join(cuda[1], "lib64"))
            ext.libraries.extend(["cudart_static", "dl", "rt"])
        build_ext.build_extensions(self)

    def build_cuda(self, nvcc, mpicc):
        """nvcc-compiles src_c/cuda/*.cu; returns the object files."""
        sources = sorted(glob.glob(os.path.join(HERE, "src_c", "cuda", "*.cu")))
        mpi_flags = mpi_compile_flags(mpicc)
        say("nvcc gets the MPI wrapper's flags: %s" % (" ".join(mpi_flags) or "(none)"))
        objs = []
        os.makedirs(self.build_temp, exist_ok=True)
        archs = cuda_archs()
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
        sources=sorted(os.path.relpath(p, HERE) for g in CORE_SOURCE_GLOBS
                       for p in glob.glob(os.path.join(HERE, "src_c", g))),
        include_dirs=[os.path.join("src_c", "include"), "src_c", mpi4py_include()],
        extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wno-unused-parameter"],
        libraries=["pthread", "m"],
    )


if __name__ == "__main__":  # pip's build backend runs setup.py as __main__ too
    setup(ext_modules=[core_extension()], cmdclass={"build_ext": BuildCore, "build_py": BuildPy})
