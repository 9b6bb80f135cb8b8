"""resnet.py - the ResNet family (He et al., 2015), written here so that hpcdl
needs no torchvision. Layer for layer the same as torchvision's resnet18 and
resnet50 (v1.5: a Bottleneck strides in its 3x3 conv), so parameter counts
match: 11,689,512 and 25,557,032 with the ImageNet stem and 1000 classes.

Shapes: B = batch, C = input channels (3), H x W = image size, K = classes.
x (B, C, H, W) -> logits (B, K). Global average pooling before the head, so
any H, W >= 1 works; the stem decides the resolution the stages see:

    ImageNet stem (small_input=False), for 224x224:
        7x7 conv stride 2 -> 3x3 max-pool stride 2   (224 -> 56)
    CIFAR stem (small_input=True), for 32x32:
        3x3 conv stride 1, no pool                    (32 -> 32)
    then four stages of blocks, widths 64, 128, 256, 512 (x4 for Bottleneck),
    stages 2-4 halving H and W; pool; Linear(512 * expansion, K).

ResNet-18 = BasicBlock x (2, 2, 2, 2); ResNet-50 = Bottleneck x (3, 4, 6, 3).
"""
from torch import nn


def conv3x3(c_in, c_out, stride=1):
    return nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)


def conv1x1(c_in, c_out, stride=1):
    return nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False)


# ---------------------------------------------------------------- blocks
class BasicBlock(nn.Module):
    """Two 3x3 convs, each with batch norm; x + F(x), then ReLU.
    (B, c_in, H, W) -> (B, width, H / stride, W / stride)."""
    expansion = 1

    def __init__(self, c_in, width, stride=1, downsample=None, norm_layer=nn.BatchNorm2d):
        super().__init__()
        self.conv1 = conv3x3(c_in, width, stride)
        self.bn1 = norm_layer(width)
        self.conv2 = conv3x3(width, width)
        self.bn2 = norm_layer(width)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample  # matches the shortcut's shape to F(x)'s, or None

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + shortcut)


class Bottleneck(nn.Module):
    """1x1 conv to width, 3x3 conv at width (strided here: v1.5), 1x1 conv up to
    4 * width; x + F(x), then ReLU.
    (B, c_in, H, W) -> (B, 4 * width, H / stride, W / stride)."""
    expansion = 4

    def __init__(self, c_in, width, stride=1, downsample=None, norm_layer=nn.BatchNorm2d):
        super().__init__()
        c_out = width * self.expansion
        self.conv1 = conv1x1(c_in, width)
        self.bn1 = norm_layer(width)
        self.conv2 = conv3x3(width, width, stride)
        self.bn2 = norm_layer(width)
        self.conv3 = conv1x1(width, c_out)
        self.bn3 = norm_layer(c_out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + shortcut)


# ---------------------------------------------------------------- the network
class ResNet(nn.Module):
    """x (B, in_channels, H, W) -> logits (B, num_classes).

    block: BasicBlock or Bottleneck; layers: blocks per stage, e.g. (2, 2, 2, 2).
    small_input: the CIFAR stem (3x3 conv, no max-pool) for images of about
    32x32; False gives the ImageNet stem. norm_layer: a BatchNorm2d-like class,
    e.g. hpcdl.torch.SyncBatchNorm (as Horovod's benchmark uses).
    """

    def __init__(self, block, layers, num_classes=1000, small_input=False, in_channels=3,
                 norm_layer=nn.BatchNorm2d):
        super().__init__()
        if small_input:
            self.conv1 = conv3x3(in_channels, 64)
            self.maxpool = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.bn1 = norm_layer(64)
        self.relu = nn.ReLU(inplace=True)
        c = 64
        stages = []
        for i, (width, n) in enumerate(zip((64, 128, 256, 512), layers)):
            stage, c = self._stage(block, c, width, n, 1 if i == 0 else 2, norm_layer)
            stages.append(stage)
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c, num_classes)
        self._init_weights()

    @staticmethod
    def _stage(block, c_in, width, n, stride, norm_layer):
        """n blocks; the first strides and, where the shape changes, gets a
        1x1-conv shortcut. Returns (stage, channels out)."""
        c_out = width * block.expansion
        downsample = None
        if stride != 1 or c_in != c_out:
            downsample = nn.Sequential(conv1x1(c_in, c_out, stride), norm_layer(c_out))
        blocks = [block(c_in, width, stride, downsample, norm_layer)]
        blocks += [block(c_out, width, norm_layer=norm_layer) for _ in range(n - 1)]
        return nn.Sequential(*blocks), c_out

    def _init_weights(self):
        # as torchvision: He-normal convs (fan_out); norm layers start at
        # weight 1, bias 0 and Linear keeps torch's default, as they construct
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


# ---------------------------------------------------------------- by name
def resnet18(num_classes=10, small_input=True, **options):
    """ResNet-18; by default the CIFAR-10 form (32x32 input, 10 classes: 11,173,962
    parameters). options: in_channels, norm_layer."""
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes, small_input, **options)


def resnet50(num_classes=1000, small_input=False, **options):
    """ResNet-50; by default the ImageNet form (224x224 input, 1000 classes:
    25,557,032 parameters). small_input=True for 32x32. options: in_channels,
    norm_layer."""
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes, small_input, **options)
