"""test_build.py - the build's messages for a missing MPI or a required but
missing nvcc (setup.py's detection functions, run with a bare PATH)."""
import importlib.util
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture()
def setup_module():
    spec = importlib.util.spec_from_file_location("hpcdl_setup", os.path.join(REPO, "setup.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # not __main__: defines functions, builds nothing
    return mod


def test_missing_mpi_says_how_to_get_one(setup_module, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("MPICC", raising=False)
    with pytest.raises(SystemExit) as e:
        setup_module.find_mpicc()
    msg = str(e.value)
    assert "apt-get install openmpi-bin libopenmpi-dev" in msg and "module load" in msg


def test_required_cuda_without_nvcc_is_an_error(setup_module, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("NVCC", raising=False)
    monkeypatch.setenv("HPCDL_WITH_CUDA", "1")
    with pytest.raises(SystemExit, match="nvcc"):
        setup_module.find_cuda()
    monkeypatch.setenv("HPCDL_WITH_CUDA", "0")
    assert setup_module.find_cuda() is None


def test_core_imports_and_reports_cuda_build():
    from hpcdl import _core
    assert isinstance(_core.built_with_cuda(), bool)
    assert isinstance(_core.mpi_cuda_aware(), bool)
