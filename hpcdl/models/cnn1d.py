"""cnn1d.py - a small 1-D convolutional network for sequences such as MNIST-1D's
40-value signals, shaped like that data set's own CNN baseline (Greydanus
2020: three convolutions of 25 channels, stride 2, then one linear layer;
about 5,000 parameters, 94% test accuracy on the original 4,000 samples).

    x (B, L) or (B, 1, L) -> conv k5 s2 p1 -> ReLU -> conv k3 s2 p1 -> ReLU
      -> conv k3 s2 p1 -> ReLU -> flatten (B, C * L3) -> linear -> logits (B, K)

Each convolution maps a length l to (l + 2p - k) // s + 1: 40 -> 19 -> 10 -> 5,
so for L = 40, C = 25, K = 10 the parameters are 150 + 1,900 + 1,900 + 1,260 =
5,210. No batch norm: N ranks then follow one process's path exactly.
"""
from torch import nn

# (kernel, stride, padding) of each convolution
LAYERS = ((5, 2, 1), (3, 2, 1), (3, 2, 1))


def out_length(length, layers=LAYERS):
    """The sequence length after the convolutions (ValueError if it reaches 0)."""
    out = length
    for k, s, p in layers:
        out = (out + 2 * p - k) // s + 1
        if out < 1:
            raise ValueError("cnn1d: sequences of %d values are too short for its %d strided "
                             "convolutions (at least 3)" % (length, len(layers)))
    return out


class CNN1D(nn.Module):
    """x (B, L) or (B, 1, L) float -> logits (B, num_classes).

    length: L, the values per sample; channels: C of every convolution."""

    def __init__(self, length, num_classes, channels=25):
        super().__init__()
        layers, c_in = [], 1
        for k, s, p in LAYERS:
            layers += [nn.Conv1d(c_in, channels, k, stride=s, padding=p), nn.ReLU()]
            c_in = channels
        self.length = length
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels * out_length(length), num_classes)

    def forward(self, x):
        if x.dim() == 2:  # flat rows (B, L): one input channel
            x = x.unsqueeze(1)
        return self.head(self.features(x).flatten(1))
