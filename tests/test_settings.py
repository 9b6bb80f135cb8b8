"""test_settings.py - hpcdl/utils/settings.py, the one table of HPCDL_*
variables: every kind refuses a bad value in one line naming the variable,
what it takes and its default (issue 38: HPCDL_CHECK=abc was accepted
silently); hpcdl run refuses before starting any rank and hpcdl.comm.init
before the core reads them; the table agrees with README's."""
import re
import subprocess
import sys

import pytest

from hpcdl.utils import settings
from mpi_harness import mpi_env
from test_facts import README_VARS, c_number

HPCDL = [sys.executable, "-m", "hpcdl"]


@pytest.mark.parametrize("name,value,expects", [
    ("HPCDL_CHECK", "abc", "expected 0 or 1"),
    ("HPCDL_CHECK", "yes", "expected 0 or 1"),
    ("HPCDL_LOCAL_SIZE", "-1", "expected a whole number, 0 or more"),
    ("HPCDL_FUSION_THRESHOLD", "25M", "expected a whole number of bytes, 1 or more"),
    ("HPCDL_ZERO_IN_FLIGHT", "0", "expected a whole number, 1 or more"),
    ("HPCDL_STALL_SHUTDOWN_TIME_SECONDS", "10m", "expected a number of seconds, 0 or more, without a unit"),
    ("HPCDL_STALL_CHECK_TIME_SECONDS", "inf", "expected a number of seconds, 0 or more, without a unit"),
    ("HPCDL_WAIT", "busy", "expected one of auto, yield, spin"),
    ("HPCDL_LOG_LEVEL", "loud", "expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
])
def test_a_bad_value_is_one_line(name, value, expects):
    bad = settings.check_environment({name: value})
    assert len(bad) == 1 and bad[0].startswith("%s=%s: %s" % (name, value, expects)), bad
    assert "default %s)" % (settings.BY_NAME[name].default or "unset") in bad[0], bad
    with pytest.raises(settings.SettingError):
        settings.get(name, {name: value})


def test_good_values_and_defaults():
    env = {"HPCDL_CHECK": "0", "HPCDL_LOCAL_SIZE": " 2 ", "HPCDL_WAIT": "Yield",
           "HPCDL_STALL_SHUTDOWN_TIME_SECONDS": "2.5", "HPCDL_LOG_LEVEL": "info",
           "HPCDL_TIMELINE": "/tmp/t.json", "HPCDL_CHUNK_BYTES": ""}
    assert settings.check_environment(env) == []
    got = {n: settings.get(n, env) for n in env}
    assert got == {"HPCDL_CHECK": False, "HPCDL_LOCAL_SIZE": 2, "HPCDL_WAIT": "yield",
                   "HPCDL_STALL_SHUTDOWN_TIME_SECONDS": 2.5, "HPCDL_LOG_LEVEL": "INFO",
                   "HPCDL_TIMELINE": "/tmp/t.json", "HPCDL_CHUNK_BYTES": None}
    assert settings.get("HPCDL_FUSION_THRESHOLD", {}) == 25 << 20
    assert settings.get("HPCDL_CHECK", {}) is True


def test_the_table_is_readmes():
    """Every variable of README's table is in the settings table with the
    same default (where README states a number or a word), and back."""
    for name, stated in README_VARS.items():
        assert name in settings.BY_NAME, "README's %s is not in utils/settings.py" % name
        default = settings.BY_NAME[name].default
        first = re.match(r"-?\d+|\w+|", stated).group(0)
        if default is not None and first not in ("query", "off", "auto", ""):
            want = int(first) if first.isdigit() else first
            have = c_number(default) if default.isdigit() else default
            assert have == want, (name, stated, default)
    readme = open(re.sub(r"tests/.*", "README.md", __file__)).read()
    for s in settings.TABLE:
        assert s.name in readme or s.name.startswith(("HPCDL_CUDA", "HPCDL_SRUN",
                                                      "HPCDL_SLURM", "HPCDL_ELASTIC",
                                                      "HPCDL_DATA")), s.name


def test_hpcdl_run_refuses_before_starting_ranks():
    r = subprocess.run(HPCDL + ["run", "-n", "2", "-x", "HPCDL_CHECK=abc", "python", "-c",
                                "print('RAN')"], capture_output=True, text=True, timeout=120,
                       env=mpi_env())
    assert r.returncode == 2 and "RAN" not in r.stdout, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [
        "hpcdl: error: HPCDL_CHECK=abc: expected 0 or 1 (cross-rank agreement check before "
        "each collective; default 1)"], r.stderr


def test_comm_init_refuses_before_the_core_reads_them():
    env = dict(mpi_env(), HPCDL_STALL_SHUTDOWN_TIME_SECONDS="10m")
    r = subprocess.run([sys.executable, "-c", "from hpcdl import comm; comm.init()"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode != 0
    assert "SettingError: HPCDL_STALL_SHUTDOWN_TIME_SECONDS=10m: expected a number of " \
           "seconds, 0 or more, without a unit" in r.stderr, r.stderr
