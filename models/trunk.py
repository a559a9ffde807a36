"""A pretrained backbone split into a frozen trunk (stem and first blocks) and the trainable rest (`model.freeze`)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

#: the architectures whose blocks `model.freeze` counts
FREEZABLE = "timm EfficientNet-style models (efficientnet_lite0, timm:efficientnet_b0, ...) and ResNets"


class Trunk:
    """The stem and the first blocks of a pretrained backbone (modules the backbone owns), and what finishes the
    pooled features from the trunk's output: calling it runs the trunk, `finish` the rest."""

    def __init__(self, layers: list[nn.Module], rest: list[nn.Module], finish: Callable[[Tensor], Tensor],
                 expand_gray: bool) -> None:
        self.layers, self._rest, self._finish, self.expand_gray = layers, rest, finish, expand_gray

    def __call__(self, x: Tensor) -> Tensor:
        """The trunk's output (a feature map) for preprocessed images."""
        if self.expand_gray:
            x = x.expand(-1, 3, -1, -1)
        for layer in self.layers:
            x = layer(x)
        return x

    def parameters(self) -> list[nn.Parameter]:
        """The trunk's parameters."""
        return [p for layer in self.layers for p in layer.parameters()]

    def eval(self) -> None:
        """Every trunk layer in eval mode (BatchNorm uses its ImageNet statistics and leaves them unchanged)."""
        for layer in self.layers:
            layer.eval()

    def finish(self, x: Tensor) -> Tensor:
        """The backbone's pooled features from the trunk's output: the remaining blocks, then the backbone's end."""
        for block in self._rest:
            x = block(x)
        return self._finish(x)


def split_backbone(backbone: nn.Module, blocks: int) -> Trunk:
    """The trunk of `backbone` (a PretrainedBackbone) up to and including block `blocks` (0: the stem alone);
    a ValueError naming the valid range, or the architectures that have blocks to count."""
    net = getattr(backbone, "net", None)
    layout = _layout(net) if net is not None else None
    if layout is None:
        name = type(net if net is not None else backbone).__name__
        raise ValueError(f"config key model.freeze: the {name} backbone has no blocks to freeze; "
                         f"it works with {FREEZABLE}")
    stem, stages, finish = layout
    if isinstance(blocks, bool) or not isinstance(blocks, int) or not 0 <= blocks <= len(stages):
        raise ValueError(f"config key model.freeze must be an integer from 0 (the stem alone) to {len(stages)} "
                         f"(every block of this backbone), got {blocks!r}")
    return Trunk([*stem, *stages[:blocks]], stages[blocks:], finish, getattr(backbone, "in_channels", 3) == 1)


def _layout(net: nn.Module) -> tuple[list[nn.Module], list[nn.Module], Callable[[Tensor], Tensor]] | None:
    """(stem layers, blocks, end: last feature map -> pooled features) of a supported architecture, else None."""
    if type(net).__name__ == "EfficientNet" and hasattr(net, "conv_head"):
        return [net.conv_stem, net.bn1], list(net.blocks), lambda x: net.forward_head(net.bn2(net.conv_head(x)),
                                                                                     pre_logits=True)
    if all(hasattr(net, f"layer{i}") for i in range(1, 5)):
        act = net.act1 if hasattr(net, "act1") else net.relu
        if hasattr(net, "forward_head"):  # timm
            def end(x: Tensor) -> Tensor:
                return net.forward_head(x, pre_logits=True)
        else:  # torchvision, its fc replaced by Identity
            def end(x: Tensor) -> Tensor:
                return net.fc(torch.flatten(net.avgpool(x), 1))
        return [net.conv1, net.bn1, act, net.maxpool], [net.layer1, net.layer2, net.layer3, net.layer4], end
    return None
