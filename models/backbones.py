"""Backbone networks by name: a small CNN for CPU, and torchvision resnet18, resnet50, googlenet."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from metricsearch.registry import Registry

BACKBONES: Registry[nn.Module] = Registry("backbone")


class SmallCNN(nn.Module):
    """Four conv-BN-ReLU-pool blocks then global average pooling; trains in minutes on a CPU."""

    def __init__(self, in_channels: int = 1, width: int = 64) -> None:
        super().__init__()
        chans = [in_channels, width, width * 2, width * 2, width * 4]
        blocks = []
        for cin, cout in zip(chans[:-1], chans[1:]):
            blocks += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                       nn.ReLU(inplace=True), nn.MaxPool2d(2, ceil_mode=True)]
        self.features = nn.Sequential(*blocks)
        self.out_features = chans[-1]

    def forward(self, x: Tensor) -> Tensor:
        """Feature vectors, batch x out_features."""
        return self.features(x).mean(dim=(2, 3))


class ResidualBlock(nn.Module):
    """Two 3x3 conv-BN layers with a (1x1 projected where widths differ) shortcut, then ReLU and 2x2 max-pool."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
        )
        self.shortcut = (nn.Identity() if cin == cout else
                         nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout)))
        self.out = nn.Sequential(nn.ReLU(inplace=True), nn.MaxPool2d(2, ceil_mode=True))

    def forward(self, x: Tensor) -> Tensor:
        """The block's output, half the input's height and width."""
        return self.out(self.body(x) + self.shortcut(x))


class SmallResNet(nn.Module):
    """A conv stem at full resolution, then residual blocks that each halve the resolution; global average
    pooling. Widths `width`, 2 x width, 2 x width, 4 x width as in SmallCNN."""

    def __init__(self, in_channels: int = 1, width: int = 64) -> None:
        super().__init__()
        chans = [width, width * 2, width * 2, width * 4]
        self.stem = nn.Sequential(nn.Conv2d(in_channels, chans[0], 3, padding=1, bias=False),
                                  nn.BatchNorm2d(chans[0]), nn.ReLU(inplace=True), nn.MaxPool2d(2, ceil_mode=True))
        self.blocks = nn.Sequential(*(ResidualBlock(a, b) for a, b in zip(chans[:-1], chans[1:])))
        self.out_features = chans[-1]

    def forward(self, x: Tensor) -> Tensor:
        """Feature vectors, batch x out_features."""
        return self.blocks(self.stem(x)).mean(dim=(2, 3))


class TorchvisionBackbone(nn.Module):
    """A torchvision classifier with its final layer removed; grayscale input is repeated to RGB."""

    def __init__(self, net: nn.Module, out_features: int, in_channels: int) -> None:
        super().__init__()
        self.net = net
        self.out_features = out_features
        self.in_channels = in_channels

    def forward(self, x: Tensor) -> Tensor:
        """Feature vectors, batch x out_features."""
        if self.in_channels == 1:
            x = x.expand(-1, 3, -1, -1)
        return self.net(x)


@BACKBONES.register("small_cnn")
def small_cnn(in_channels: int = 1, width: int = 64, pretrained: str | None = None) -> nn.Module:
    """Small 4-block CNN (no ImageNet weights; `pretrained` may be a file path)."""
    if pretrained == "imagenet":
        raise ValueError("small_cnn has no ImageNet weights; use resnet18/resnet50/googlenet or a file path")
    return _load_file(SmallCNN(in_channels, width), pretrained)


@BACKBONES.register("small_resnet")
def small_resnet(in_channels: int = 1, width: int = 64, pretrained: str | None = None) -> nn.Module:
    """Small residual CNN: a conv stem and 3 residual blocks (about 2.5x SmallCNN's compute); CPU-trainable."""
    if pretrained == "imagenet":
        raise ValueError("small_resnet has no ImageNet weights; use resnet18/resnet50/googlenet or a file path")
    return _load_file(SmallResNet(in_channels, width), pretrained)


def _torchvision(name: str, in_channels: int, pretrained: str | None) -> nn.Module:
    import torchvision

    weights = None
    if pretrained == "imagenet":
        weights = torchvision.models.get_model_weights(name).DEFAULT
        cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name
        if not cached.exists():
            raise FileNotFoundError(
                f"ImageNet weights for {name} are not in the local torch cache ({cached}). "
                f"metricsearch never downloads at run time: on a machine with internet run "
                f"`python -c \"import torchvision; torchvision.models.{name}(weights='DEFAULT')\"` "
                f"and copy {cached.name} there, or pass --pretrained PATH to a weights file."
            )
    extra = {"aux_logits": False, "init_weights": weights is None} if name == "googlenet" else {}
    net = torchvision.models.get_model(name, weights=weights, **extra)
    out = net.fc.in_features
    net.fc = nn.Identity()
    backbone = TorchvisionBackbone(net, out, in_channels)
    return _load_file(backbone, pretrained) if pretrained != "imagenet" else backbone


def _load_file(module: nn.Module, pretrained: str | None) -> nn.Module:
    if pretrained is None:
        return module
    path = Path(pretrained)
    if not path.is_file():
        raise FileNotFoundError(f"--pretrained {pretrained}: no such file (use 'imagenet' or a weights file)")
    state = torch.load(path, map_location="cpu", weights_only=True)
    state = state.get("state_dict", state) if isinstance(state, dict) else state
    missing, unexpected = module.load_state_dict(state, strict=False)
    if len(missing) == len(module.state_dict()):
        raise ValueError(f"{path} holds no weights that fit this backbone (unexpected: {unexpected[:5]})")
    return module


@BACKBONES.register("resnet18")
def resnet18(in_channels: int = 3, pretrained: str | None = None) -> nn.Module:
    """torchvision ResNet-18 (512-d features)."""
    return _torchvision("resnet18", in_channels, pretrained)


@BACKBONES.register("resnet50")
def resnet50(in_channels: int = 3, pretrained: str | None = None) -> nn.Module:
    """torchvision ResNet-50 (2048-d features)."""
    return _torchvision("resnet50", in_channels, pretrained)


@BACKBONES.register("googlenet")
def googlenet(in_channels: int = 3, pretrained: str | None = None) -> nn.Module:
    """torchvision GoogLeNet / Inception-v1 (1024-d features)."""
    return _torchvision("googlenet", in_channels, pretrained)
