"""test_cuda_info.py - `hpcdl info`'s lines on the path CUDA tensors take
(hpcdl.cli.info.device_path): IPC inside a node unless HPCDL_CUDA_IPC is 0
(read as the C core reads it, with atoi), GPU-direct or staging across nodes
with the reason (the override or the MPI's own answer), and nothing without a
CUDA build. The core's own choice is tested by src_c's check-fake."""
from hpcdl.cli import info


def test_ipc_in_a_node_by_default_staged_across_without_cuda_aware_mpi():
    inside, across = info.device_path(True, False, env={})
    assert inside.startswith("CUDA IPC") and "HPCDL_CUDA_IPC unset" in inside
    assert "fake runtime only" in inside
    assert across == ("staged through pinned host memory "
                      "(MPIX_Query_cuda_support() says no or cannot say)")


def test_overrides_are_named_as_the_reason():
    inside, across = info.device_path(True, True, env={"HPCDL_MPI_CUDA_AWARE": "force",
                                                        "HPCDL_CUDA_IPC": "1"})
    assert "HPCDL_CUDA_IPC=1" in inside
    assert across == "GPU-direct: device pointers to MPI (HPCDL_MPI_CUDA_AWARE=force)"
    _, across = info.device_path(True, True, env={})
    assert across.endswith("(MPIX_Query_cuda_support() says yes)")


def test_ipc_off_as_the_core_reads_it():
    for off in ("0", "00", "no", " 0"):  # atoi: no leading integer is 0
        inside, _ = info.device_path(True, False, env={"HPCDL_CUDA_IPC": off})
        assert inside == "as across nodes (HPCDL_CUDA_IPC=%s)" % off
    inside, _ = info.device_path(True, False, env={"HPCDL_CUDA_IPC": "2"})
    assert inside.startswith("CUDA IPC")


def test_no_cuda_build_says_so_for_both():
    both = info.device_path(False, False, env={"HPCDL_CUDA_IPC": "1"})
    assert both[0] == both[1] and "built without CUDA" in both[0]


def test_info_json_carries_the_lines():
    got = info.collect()
    if got.get("core_built") is not True:
        assert "device_path_node" not in got  # the lines need the core's answers
        return
    assert (got["device_path_node"], got["device_path_across"]) == info.device_path(
        got["core_cuda"], got["mpi_cuda_aware"])
