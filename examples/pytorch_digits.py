"""pytorch_digits.py - Horovod's MNIST example (examples/pytorch/pytorch_mnist.py)
on hpcdl, with scikit-learn's built-in digits instead of MNIST: 1,797 8x8
grey images of 0-9, so nothing is downloaded. Same shape as Horovod's: a
small CNN, a DistributedSampler per rank, the learning rate scaled by the
number of ranks, DistributedOptimizer, parameters and optimizer state
broadcast from rank 0, test metrics averaged with hvd.allreduce.

    hpcdl run -n 2 -- python examples/pytorch_digits.py
    mpirun -n 4 python examples/pytorch_digits.py --epochs 20

It ends with a check: the final test accuracy must reach --min-accuracy
(default 0.9; 0 turns the check off), or the exit status is 1.
"""
import argparse
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import TensorDataset

import hpcdl.torch as hvd  # was: import horovod.torch as hvd

# ---------------------------------------------------------------- settings
parser = argparse.ArgumentParser(description="PyTorch digits example (Horovod's MNIST)")
parser.add_argument("--batch-size", type=int, default=32, metavar="N",
                    help="input batch size for training, per rank (default: 32)")
parser.add_argument("--test-batch-size", type=int, default=1000, metavar="N",
                    help="input batch size for testing (default: 1000)")
parser.add_argument("--epochs", type=int, default=10, metavar="N",
                    help="number of epochs to train (default: 10)")
parser.add_argument("--lr", type=float, default=0.02, metavar="LR",
                    help="learning rate per rank (default: 0.02)")
parser.add_argument("--momentum", type=float, default=0.9, metavar="M",
                    help="SGD momentum (default: 0.9)")
parser.add_argument("--no-cuda", action="store_true", default=False,
                    help="disables CUDA training")
parser.add_argument("--seed", type=int, default=42, metavar="S",
                    help="random seed (default: 42)")
parser.add_argument("--log-interval", type=int, default=10, metavar="N",
                    help="how many batches to wait before logging training status")
parser.add_argument("--fp16-allreduce", action="store_true", default=False,
                    help="use fp16 compression during allreduce")
parser.add_argument("--use-adasum", action="store_true", default=False,
                    help="use adasum algorithm to do reduction")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0,
                    help="apply gradient predivide factor in optimizer (default: 1.0)")
parser.add_argument("--min-accuracy", type=float, default=0.9,
                    help="the final check: exit 1 below this test accuracy (default: 0.9)")


class Net(nn.Module):
    """x (B, 1, 8, 8) -> log-probabilities (B, 10): Horovod's MNIST net, shrunk to 8x8."""

    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 16, kernel_size=3, padding=1)   # -> 16 x 8 x 8, pool 4 x 4
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)  # -> 32 x 4 x 4, pool 2 x 2
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(128, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 128)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def digits_datasets(seed):
    """(train, test) TensorDatasets of (1, 8, 8) float images and int64 labels:
    the same stratified 80/20 split on every rank, normalised with the training
    set's mean and std (as MNIST's transforms.Normalize((0.1307,), (0.3081,)))."""
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)  # pixels are 0..16
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=seed,
                                              stratify=y)
    mean, std = x_tr.mean(), x_tr.std()

    def dataset(images, labels):
        return TensorDataset(torch.from_numpy((images - mean) / std),
                             torch.from_numpy(labels.astype(np.int64)))
    return dataset(x_tr, y_tr), dataset(x_te, y_te)


def train(args):
    def train_epoch(epoch):
        model.train()
        # Horovod: set epoch to sampler for shuffling.
        train_sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(train_loader):
            if args.cuda:
                data, target = data.cuda(), target.cuda()
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            optimizer.step()
            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
                # Horovod: use train_sampler to determine the number of examples in
                # this worker's partition.
                print("Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(
                    epoch, batch_idx * len(data), len(train_sampler),
                    100. * batch_idx / len(train_loader), loss.item()), flush=True)

    def metric_average(val, name):
        tensor = torch.tensor(val)
        avg_tensor = hvd.allreduce(tensor, name=name)
        return avg_tensor.item()

    def test():
        model.eval()
        test_loss = 0.
        test_accuracy = 0.
        with torch.no_grad():
            for data, target in test_loader:
                if args.cuda:
                    data, target = data.cuda(), target.cuda()
                output = model(data)
                # sum up batch loss
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                # get the index of the max log-probability
                pred = output.max(1, keepdim=True)[1]
                test_accuracy += pred.eq(target.view_as(pred)).cpu().float().sum().item()

        # Horovod: use test_sampler to determine the number of examples in
        # this worker's partition.
        test_loss /= len(test_sampler)
        test_accuracy /= len(test_sampler)

        # Horovod: average metric values across workers.
        test_loss = metric_average(test_loss, "avg_loss")
        test_accuracy = metric_average(test_accuracy, "avg_accuracy")

        # Horovod: print output only on first rank.
        if hvd.rank() == 0:
            print("\nTest set: Average loss: {:.4f}, Accuracy: {:.2f}%\n".format(
                test_loss, 100. * test_accuracy), flush=True)
        return test_accuracy

    # Horovod: initialize library.
    hvd.init()
    torch.manual_seed(args.seed)

    if args.cuda:
        # Horovod: pin GPU to local rank.
        torch.cuda.set_device(hvd.local_rank())
        torch.cuda.manual_seed(args.seed)

    # Horovod: limit # of CPU threads to be used per worker.
    torch.set_num_threads(1)

    train_dataset, test_dataset = digits_datasets(args.seed)
    # Horovod: use DistributedSampler to partition the training data.
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, sampler=train_sampler)
    # Horovod: use DistributedSampler to partition the test data.
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size,
                                              sampler=test_sampler)

    model = Net()
    if args.cuda:
        # Move model to GPU.
        model.cuda()

    # Horovod: scale learning rate by the number of ranks (Adasum needs no scaling).
    lr_scaler = 1 if args.use_adasum else hvd.size()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * lr_scaler,
                          momentum=args.momentum)

    # Horovod: broadcast parameters & optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    # Horovod: (optional) compression algorithm.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    # Horovod: wrap optimizer with DistributedOptimizer.
    optimizer = hvd.DistributedOptimizer(optimizer,
                                         named_parameters=model.named_parameters(),
                                         compression=compression,
                                         op=hvd.Adasum if args.use_adasum else hvd.Average,
                                         gradient_predivide_factor=args.gradient_predivide_factor)

    for epoch in range(1, args.epochs + 1):
        train_epoch(epoch)
        accuracy = test()
    return accuracy


if __name__ == "__main__":
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()
    accuracy = train(args)
    ok = accuracy >= args.min_accuracy
    if hvd.rank() == 0:
        print("Final test accuracy: %.4f (check: >= %.2f %s) on %d rank(s)"
              % (accuracy, args.min_accuracy, "OK" if ok else "FAILED", hvd.size()), flush=True)
    hvd.shutdown()
    sys.exit(0 if ok else 1)
