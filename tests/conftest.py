"""conftest.py - makes tests/ importable (mpi_harness) and sets Open MPI's
root permission for launches when the suite runs as root (CI does).

Every subprocess timeout in the test process (Popen.communicate / wait, and
so subprocess.run's) counts seconds of full-speed time (tests/hang_guard.py):
it stretches while other programs share the cores, up to 10x. Timeouts are
for hangs; a busy machine must not fail a test. pytest-timeout's limit per
test (pyproject.toml) counts the same way."""
import os
import signal
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hang_guard  # noqa: E402

hang_guard.install()

if os.geteuid() == 0:
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")

# the session's one real Slurm for tests/test_slurm*.py (started on first use)
from slurm_cluster import slurm_cluster  # noqa: E402,F401


def pytest_runtest_teardown(item):
    """A test that starts MPI inside the pytest process (a singleton) leaves
    PMIX_RANK, PMIx server addresses and OMPI_* settings in the C environment,
    behind os.environ's back; every later subprocess started without env=
    inherits them, and hpcdl then takes itself for a rank of that job ('-n 4
    ignored: this job has 1 rank') or mpiexec's ranks join the singleton's
    PMIx. After each test, variables the C environment holds that os.environ
    does not are unset."""
    for name in c_environment_names():
        if name not in os.environb:
            os.unsetenv(name)


def c_environment_names():
    """The names in the process's C environment (libc's environ)."""
    import ctypes
    environ = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    names, i = [], 0
    while environ[i] is not None:
        names.append(environ[i].split(b"=", 1)[0])
        i += 1
    return names


def pytest_configure(config):
    config.addinivalue_line("markers", "quick: a multi-rank launch that make check runs too "
                            "(one launch per rank count running many cases)")


def pytest_collection_modifyitems(config, items):
    """HPCDL_TEST_MAX_RANKS=K leaves out the multi-rank (`mpi`) tests whose
    rank-count parameter `n` is above K. The MPICH stage of `make test` sets
    it: MPICH's ranks poll, so 4 ranks on 2 cores are slow there, and the
    MPI-specific paths are covered on 2 and 3 ranks and 2 virtual nodes."""
    limit = os.environ.get("HPCDL_TEST_MAX_RANKS")
    if not limit:
        return
    keep, drop = [], []
    for item in items:
        n = getattr(getattr(item, "callspec", None), "params", {}).get("n")
        too_many = item.get_closest_marker("mpi") and isinstance(n, int) and n > int(limit)
        (drop if too_many else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


try:
    import pytest_timeout
except ImportError:  # the limit per test is pytest-timeout's; without it there is none
    pytest_timeout = None

if pytest_timeout is not None:
    import pytest

    @pytest.hookimpl(tryfirst=True)
    def pytest_timeout_set_timer(item, settings):
        """pytest-timeout's limit in full-speed seconds: a watcher thread ticks a
        hang_guard clock every 10 s and, when it runs out, raises the plugin's
        own timeout in the test's thread (its signal method: stacks dumped,
        the test fails, the session goes on)."""
        if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
            return None  # the plugin's own timer
        clock, stop, main = hang_guard.Clock(settings.timeout), threading.Event(), threading.get_ident()

        def watch():
            while not stop.wait(10):
                if clock.expired():
                    signal.pthread_kill(main, signal.SIGALRM)
                    return

        def fire(signum, frame):
            __tracebackhide__ = True
            pytest_timeout.timeout_sigalrm(item, settings)

        def cancel():
            stop.set()
            watcher.join()
            signal.signal(signal.SIGALRM, signal.SIG_DFL)

        signal.signal(signal.SIGALRM, fire)
        watcher = threading.Thread(target=watch, name="timeout " + item.nodeid, daemon=True)
        watcher.start()
        item.cancel_timeout = cancel
        return True
