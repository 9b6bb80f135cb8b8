"""mlp.py - a multi-layer perceptron: Linear -> ReLU blocks, then a Linear head."""
from torch import nn


class MLP(nn.Module):
    """x (B, in_features) -> logits (B, num_classes).

    hidden: the width of each hidden layer in order, e.g. (256, 128); () gives
    a linear classifier.
    """

    def __init__(self, in_features, num_classes, hidden=(256, 128)):
        super().__init__()
        layers, width = [], in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)
