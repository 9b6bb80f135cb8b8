"""test_examples.py - hpcdl.models' ResNets against the published architectures
(parameter counts, stage shapes), models.build by name, and the Horovod-style
examples in examples/ run to their final checks on 2 ranks; the torchrun-style
DDP script on backend hpcdl under `hpcdl run -n 2` against one process."""
import os
import re
import subprocess
import sys

import pytest
import torch

from hpcdl import models
from hpcdl.models import resnet
from mpi_harness import REPO, mpi_env, run_python

EXAMPLES = os.path.join(REPO, "examples")
BENCHMARK = os.path.join(EXAMPLES, "pytorch_synthetic_benchmark.py")
DIGITS = os.path.join(EXAMPLES, "pytorch_digits.py")
TORCHRUN = os.path.join(EXAMPLES, "torchrun_ddp.py")


def n_params(model):
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- the ResNets
# torchvision's counts (resnet18(), resnet50()); the CIFAR forms swap the 7x7
# stem for a 3x3 one (3*64*(49-9) = 7,680 fewer) and the head for 10 classes
@pytest.mark.parametrize("build, kwargs, count", [
    (resnet.resnet18, {}, 11_173_962),                                   # CIFAR-10
    (resnet.resnet18, dict(num_classes=1000, small_input=False), 11_689_512),
    (resnet.resnet50, {}, 25_557_032),                                   # ImageNet
    (resnet.resnet50, dict(num_classes=10, small_input=True), 23_520_842),
], ids=["resnet18-cifar", "resnet18-imagenet", "resnet50-imagenet", "resnet50-cifar"])
def test_parameter_counts(build, kwargs, count):
    assert n_params(build(**kwargs)) == count


def stage_shapes(model, x):
    """The (C, H, W) after the stem and after each of the four stages."""
    shapes = []
    x = model.maxpool(model.relu(model.bn1(model.conv1(x))))
    shapes.append(tuple(x.shape[1:]))
    for stage in (model.layer1, model.layer2, model.layer3, model.layer4):
        x = stage(x)
        shapes.append(tuple(x.shape[1:]))
    return shapes


@torch.no_grad()
def test_resnet18_cifar_shapes():
    model = resnet.resnet18().eval()
    x = torch.randn(3, 3, 32, 32)
    assert stage_shapes(model, x) == [(64, 32, 32), (64, 32, 32), (128, 16, 16),
                                      (256, 8, 8), (512, 4, 4)]
    assert model(x).shape == (3, 10)


@torch.no_grad()
def test_resnet50_imagenet_shapes():
    model = resnet.resnet50().eval()
    x = torch.randn(1, 3, 224, 224)
    assert stage_shapes(model, x) == [(64, 56, 56), (256, 56, 56), (512, 28, 28),
                                      (1024, 14, 14), (2048, 7, 7)]
    assert model(x).shape == (1, 1000)


@torch.no_grad()
def test_resnet50_small_input_and_channels():
    model = resnet.resnet50(num_classes=7, small_input=True, in_channels=1).eval()
    assert stage_shapes(model, torch.randn(2, 1, 32, 32))[-1] == (2048, 4, 4)
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 7)


@torch.no_grad()
def test_resnet_samples_independent_in_eval():
    # eval-mode batch norm uses running statistics: each sample's logits must
    # not depend on what else is in the batch (catches a reshape across B)
    torch.manual_seed(0)
    model = resnet.resnet18().eval()
    x = torch.randn(4, 3, 32, 32) * torch.arange(1, 5).view(4, 1, 1, 1)
    whole = model(x)
    one_by_one = torch.cat([model(x[i:i + 1]) for i in range(4)])
    torch.testing.assert_close(whole, one_by_one, rtol=1e-4, atol=1e-5)


def test_resnet_trains_one_step():
    torch.manual_seed(0)
    model = resnet.resnet18(num_classes=3)
    before = [p.detach().clone() for p in model.parameters()]
    loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 3, 16, 16)),
                                             torch.tensor([0, 1, 2, 0]))
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_norm_layer_is_used_everywhere():
    class Norm(torch.nn.BatchNorm2d):
        pass
    model = resnet.resnet18(norm_layer=Norm)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert len(norms) == 20 and all(type(m) is Norm for m in norms)  # 1 + 8*2 + 3 shortcuts


# ---------------------------------------------------------------- models.build
def test_build_resnets_by_name():
    small = models.build("resnet50", (3, 32, 32), 10)
    large = models.build("resnet50", (3, 224, 224), 1000)
    assert n_params(small) == 23_520_842 and n_params(large) == 25_557_032
    assert n_params(models.build("resnet18", (3, 32, 32), 10)) == 11_173_962
    # small_input given explicitly wins over the image size
    assert n_params(models.build("resnet18", (3, 32, 32), 1000, small_input=False)) \
        == 11_689_512
    assert models.build("resnet18", (1, 8, 8), 10)(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_build_resnet_needs_an_image_shape():
    with pytest.raises(ValueError, match=r"\(C, H, W\)"):
        models.build("resnet18", 64, 10)


def test_build_mlp_unchanged_and_on_images():
    # the trainer's call: flat features, hidden widths; state_dict names as before
    torch.manual_seed(0)
    flat = models.build("mlp", 64, 10, hidden=(32,))
    assert list(flat.state_dict()) == ["net.0.weight", "net.0.bias", "net.2.weight",
                                       "net.2.bias"]
    assert flat(torch.randn(5, 64)).shape == (5, 10)
    image = models.build("mlp", (3, 4, 4), 10, hidden=(32,))
    assert n_params(image) == 48 * 32 + 32 + 32 * 10 + 10
    assert image(torch.randn(5, 3, 4, 4)).shape == (5, 10)


def test_build_unknown_name_lists_all():
    with pytest.raises(ValueError, match="mlp, cnn1d, resnet18, resnet50"):
        models.build("vgg16", (3, 32, 32), 10)


# ---------------------------------------------------------------- the examples
FLOAT = r"([0-9]+\.[0-9]+)"


@pytest.mark.mpi
@pytest.mark.slow
def test_synthetic_benchmark_two_ranks():
    r = run_python(2, BENCHMARK, timeout=60)
    out = r.stdout
    for line in ("Model: resnet18", "Batch size: 16", "Number of GPUs: 2"):
        assert line in out, out
    iters = re.findall(r"Iter #(\d+): %s img/sec per GPU" % FLOAT, out)
    assert [int(i) for i, _ in iters] == [0, 1, 2], out
    per = re.search(r"Img/sec per GPU: %s \+-%s" % (FLOAT, FLOAT), out)
    total = re.search(r"Total img/sec on 2 GPU\(s\): %s \+-%s" % (FLOAT, FLOAT), out)
    assert per and total, out
    # the printed numbers are rounded to 0.1: allow each its half-step
    rates = [float(x) for _, x in iters]
    mean = sum(rates) / len(rates)
    assert float(per.group(1)) == pytest.approx(mean, abs=0.11), out
    assert float(total.group(1)) == pytest.approx(2 * float(per.group(1)), abs=0.16), out
    assert float(per.group(1)) > 0, out
    assert "Parameters identical on all 2 ranks: OK" in out, out


@pytest.mark.mpi
@pytest.mark.slow
def test_digits_two_ranks_reaches_accuracy():
    r = run_python(2, DIGITS, timeout=60)
    out = r.stdout
    epochs = re.findall(r"Test set: Average loss: %s, Accuracy: %s%%" % (FLOAT, FLOAT), out)
    assert len(epochs) == 10, out  # one test() per epoch, printed by rank 0 only
    final = re.search(r"Final test accuracy: %s \(check: >= 0\.90 OK\) on 2 rank\(s\)"
                      % FLOAT, out)
    assert final and float(final.group(1)) >= 0.9, out
    assert float(final.group(1)) == pytest.approx(float(epochs[-1][1]) / 100, abs=1e-4), out


@pytest.mark.mpi
def test_synthetic_benchmark_with_adasum():
    # Horovod's --use-adasum: the delta optimizer keeps the replicas identical
    r = run_python(2, BENCHMARK, timeout=60, args=["--use-adasum", "--num-warmup-batches", "0",
                                                   "--num-batches-per-iter", "1",
                                                   "--num-iters", "1"])
    assert "Parameters identical on all 2 ranks: OK" in r.stdout, r.stdout


@pytest.mark.mpi
def test_torchrun_script_under_hpcdl_run_matches_one_process(tmp_path):
    # the script reads RANK / LOCAL_RANK / WORLD_SIZE (hpcdl run sets them, and
    # MASTER_ADDR/PORT, which the hpcdl backend leaves unused) and calls
    # init_process_group(backend="hpcdl"); one process: the same file, WORLD_SIZE=1
    env = mpi_env({"OMP_NUM_THREADS": "1"})
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    two = subprocess.run([sys.executable, "-m", "hpcdl", "run", "-n", "2", "--", sys.executable,
                          TORCHRUN, "--save", str(tmp_path / "two.pt")],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert two.returncode == 0, two.stdout + two.stderr
    one = subprocess.run([sys.executable, TORCHRUN, "--save", str(tmp_path / "one.pt")],
                         capture_output=True, text=True, cwd=REPO, timeout=120,
                         env=dict(env, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1"))
    assert one.returncode == 0, one.stdout + one.stderr
    assert "epoch 2: mean loss" in two.stdout and "(2 ranks, backend hpcdl)" in two.stdout
    assert_same_weights(tmp_path / "two.pt", tmp_path / "one.pt")


def assert_same_weights(two_pt, one_pt):
    """TORCHRUN's --save of N ranks against one process's (also tests/test_slurm_jobs.py)."""
    got, want = torch.load(two_pt), torch.load(one_pt)
    assert sorted(got) == sorted(want) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    for k in want:  # 24 SGD steps; float32 sum order differs (measured 1.5e-7)
        rel = ((got[k] - want[k]).abs().max() / want[k].abs().max()).item()
        assert rel <= 1e-6, (k, rel)
