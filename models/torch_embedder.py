"""The embedding network: backbone + linear head to `dim` (or none: the pooled features) + optional L2 normalisation."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from metricsearch.models.backbones import backbone_preprocessing, build_backbone
from metricsearch.models.base import ArrayEmbedder
from metricsearch.models.preprocessing import Preprocessing
from metricsearch.models.trunk import Trunk, split_backbone


class Embedder(ArrayEmbedder, nn.Module):
    """Maps preprocessed images (N x C x H x W) to embeddings (N x dim)."""

    def __init__(
        self, backbone: str = "small_cnn", dim: int | None = 128, normalize: bool = True,
        preprocessing: Preprocessing | dict[str, Any] | None = None, pretrained: str | bool | None = None,
        backbone_params: dict[str, Any] | None = None, tta_shifts: list | None = None, freeze: int | None = None,
        tta_rotations: list | None = None, members: int = 1, whiten: float = 0.0,
        tta_symmetries: list | None = None,
    ) -> None:
        """`dim` None: no head, the backbone's pooled features are the embedding. `preprocessing` as a dict:
        the keys it sets replace those of the backbone's own (its ImageNet preprocessing, where it has one).
        `freeze` N: the backbone's stem and first N blocks (the trunk) get no gradients, and every BatchNorm
        of the backbone keeps its statistics (in eval mode even while the model trains).
        `members` N > 1: an ensemble in one network, N backbones with their own heads side by side on the same
        images; the embedding is the members' (L2-normalised) embeddings concatenated, over sqrt(N) (cosine
        similarity: the mean of theirs), and each member trains on its own part (`member_embeddings`).
        `whiten` P in (0, 1]: in eval mode the embedding is multiplied by a dim x dim matrix, the within-class
        scatter of the training images' embeddings raised to -P (`set_whitening`; the identity until the trainer
        fits it), then L2-normalised again; 0: none.
        `tta_symmetries` (names of `SYMMETRIES`): in eval mode the embedding is the images' own (views and whitening
        included), L2-normalised, then that of each symmetric copy of the images the same way, side by side, over
        sqrt(1 + their number) (cosine similarity: the mean over the symmetries); a model trained with those
        symmetries as classes of their own (`augment_classes`) is an ensemble of 1 + N embeddings this way."""
        super().__init__()
        if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 1):
            raise ValueError(f"model.dim must be an integer >= 1 (or null: the backbone's features), got {dim!r}")
        if isinstance(members, bool) or not isinstance(members, int) or members < 1:
            raise ValueError(f"model.members must be an integer >= 1, got {members!r}")
        if isinstance(whiten, bool) or not isinstance(whiten, (int, float)) or not 0 <= whiten <= 1:
            raise ValueError(f"model.whiten must be a number in [0, 1] (0: no whitening), got {whiten!r}")
        if members > 1 and freeze is not None:
            raise ValueError("model.freeze splits one backbone: set model.members: 1, or drop model.freeze")
        if not isinstance(preprocessing, Preprocessing):
            preprocessing = Preprocessing.from_dict({**backbone_preprocessing(backbone), **(preprocessing or {})})
        self.preprocessing = preprocessing
        self.config = {
            "backbone": backbone, "dim": dim, "normalize": normalize,
            "preprocessing": self.preprocessing.to_dict(), "backbone_params": dict(backbone_params or {}),
        }
        nets, heads = [], []
        for _ in range(members):  # member by member: the first is the one model members 1 builds with the same seed
            nets.append(build_backbone(backbone, self.preprocessing.channels, pretrained, dict(backbone_params or {})))
            heads.append(nn.Linear(nets[-1].out_features, dim) if dim is not None else nn.Identity())
        self.backbone = nets[0] if members == 1 else SideBySide(nets)
        self.head = heads[0] if members == 1 else SideBySide(heads, split=True)
        self.members = members
        if members > 1:
            self.config["members"] = members
        self.normalize = normalize
        self.whiten = float(whiten)
        if whiten:
            self.config["whiten"] = self.whiten
            self.register_buffer("whitening", torch.eye(self.part_dim))
        self.set_views(tta_shifts or [], tta_rotations or [], tta_symmetries or [])
        self.trunk: Trunk | None = None
        if freeze is not None:
            self.trunk = split_backbone(self.backbone, freeze)
            for p in self.trunk.parameters():
                p.requires_grad_(False)
            self.trunk.eval()
            self.config["freeze"] = freeze

    def train(self, mode: bool = True) -> "Embedder":
        """Training or eval mode; with a frozen trunk the trunk and every BatchNorm of the backbone stay in eval mode
        (the trunk is a fixed feature extractor, BatchNorm keeps its ImageNet statistics; the trainable blocks'
        BatchNorm weights still learn)."""
        super().train(mode)
        if self.trunk is not None:
            self.trunk.eval()
            for module in self.backbone.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()
        return self

    def set_views(self, shifts: Sequence[Sequence[int]], rotations: Sequence[float],
                  symmetries: Sequence[str] = ()) -> None:
        """Average these test-time views in eval mode: shifts (dx, dy) in pixels, rotations in degrees (none: off);
        and put the embeddings of these symmetric copies (`SYMMETRIES` names) beside the images' own."""
        unknown = [name for name in symmetries if name not in SYMMETRIES]
        if unknown or len(set(symmetries)) != len(symmetries):
            raise ValueError(f"model.tta_symmetries takes distinct names from {', '.join(SYMMETRIES)}; "
                             f"got {list(symmetries)}")
        if symmetries and not self.normalize:
            raise ValueError("model.tta_symmetries puts L2-normalised embeddings side by side: set model.normalize: "
                             "true, or drop model.tta_symmetries")
        self.tta_shifts = [(int(dx), int(dy)) for dx, dy in shifts]
        self.tta_rotations = [float(a) for a in rotations]
        self.tta_symmetries = list(symmetries)
        for key, value in (("tta_shifts", [list(s) for s in self.tta_shifts]), ("tta_rotations", self.tta_rotations),
                           ("tta_symmetries", self.tta_symmetries)):
            if value:
                self.config[key] = value
            else:
                self.config.pop(key, None)

    def forward(self, images: Tensor) -> Tensor:
        """Embeddings for a batch of preprocessed images; in eval mode with `tta_shifts` or `tta_rotations`, the
        mean of the embeddings of the shifted and rotated views (test-time augmentation, part of the exported graph),
        then whitened where the model has `whiten`; with `tta_symmetries`, the same for each symmetric copy of the
        images too, side by side."""
        if self.training:
            return self._embed(images)
        copies = 1 + len(self.tta_symmetries)
        if copies > 1:  # every copy of every image through the network in one batch
            images = torch.cat([images, *(SYMMETRIES[name](images) for name in self.tta_symmetries)])
        if self.tta_shifts or self.tta_rotations:
            out = views_mean(self._embed, images, self.tta_shifts, self.tta_rotations, self.normalize)
        else:
            out = self._embed(images)
        if self.whiten:
            out = out @ self.whitening.to(out.dtype)
            out = F.normalize(out, dim=1) if self.normalize else out
        if copies == 1:
            return out
        return out.unflatten(0, (copies, -1)).transpose(0, 1).flatten(1) / math.sqrt(copies)

    def set_whitening(self, matrix: Tensor) -> None:
        """The part_dim x part_dim matrix that eval-mode embeddings (each copy's) are multiplied by (a model built with
        `whiten`)."""
        if not self.whiten:
            raise ValueError("set_whitening needs a model built with whiten > 0 (model.whiten)")
        if matrix.shape != self.whitening.shape:
            raise ValueError(f"the whitening matrix must be {tuple(self.whitening.shape)}, got {tuple(matrix.shape)}")
        self.whitening.copy_(matrix)

    def _embed(self, images: Tensor) -> Tensor:
        return self._finish(self.backbone(images))

    def _finish(self, features: Tensor) -> Tensor:
        out = self.head(features)
        if not self.normalize:
            return out
        if self.members == 1:
            return F.normalize(out, dim=1)
        return F.normalize(out.unflatten(1, (self.members, -1)), dim=2).flatten(1) / math.sqrt(self.members)

    def member_embeddings(self, embeddings: Tensor) -> list[Tensor]:
        """Each member's own embeddings (unit length where the model normalises) from the model's (N x dim)."""
        parts = list(embeddings.chunk(self.members, dim=1))
        return [part * math.sqrt(self.members) for part in parts] if self.normalize and self.members > 1 else parts

    def embed_from_trunk(self, trunk_output: Tensor) -> Tensor:
        """Embeddings from the frozen trunk's output (`self.trunk(images)`): the same as `self(images)`."""
        if self.trunk is None:
            raise ValueError("embed_from_trunk needs a frozen trunk (model.freeze)")
        return self._finish(self.trunk.finish(trunk_output))

    @property
    def dim(self) -> int:
        """Embedding dimension (in eval mode: with `tta_symmetries`, all the copies' parts)."""
        return self.part_dim * (1 + len(self.tta_symmetries))

    @property
    def part_dim(self) -> int:
        """The dimension of one image's embedding: what a training step outputs and the whitening acts on."""
        return getattr(self.head, "out_features", self.backbone.out_features)

    @torch.no_grad()
    def embed_arrays(self, batch: np.ndarray) -> np.ndarray:
        """Embeddings (N x dim float32) of preprocessed images, on the model's device, in eval mode."""
        was_training = self.training
        self.eval()
        device = next(self.parameters()).device
        try:
            return self(torch.from_numpy(batch).to(device)).float().cpu().numpy()
        finally:
            self.train(was_training)

    def checkpoint(self) -> dict[str, Any]:
        """The model part of a checkpoint: its config and weights."""
        return {"model_config": self.config, "model": self.state_dict()}


class SideBySide(nn.Module):
    """Modules side by side: each on the whole input (or, with `split`, on its own equal slice of the features),
    their outputs concatenated."""

    def __init__(self, nets: Sequence[nn.Module], split: bool = False) -> None:
        super().__init__()
        self.nets = nn.ModuleList(nets)
        self.split = split
        self.out_features = sum(net.out_features for net in nets)

    def forward(self, x: Tensor) -> Tensor:
        """The concatenated outputs, batch x out_features."""
        parts = x.chunk(len(self.nets), dim=1) if self.split else [x] * len(self.nets)
        return torch.cat([net(part) for net, part in zip(self.nets, parts)], dim=1)


def views_mean(embed, images: Tensor, shifts: Sequence[tuple[int, int]], rotations: Sequence[float] = (),
               normalize: bool = True) -> Tensor:
    """The mean of `embed` over views of `images`: shifted by (dx, dy) pixels (edges replicated; without shifts,
    the images themselves) and rotated by each angle of `rotations` (degrees, counterclockwise about the centre,
    bilinear, edges replicated); L2-normalised again when `normalize`. All views go through `embed` as one batch."""
    n, _, h, w = images.shape
    views = [images]
    if shifts:
        pad = max(max(abs(dx), abs(dy)) for dx, dy in shifts)
        padded = F.pad(images, (pad, pad, pad, pad), mode="replicate") if pad else images
        views = [padded[:, :, pad - dy:pad - dy + h, pad - dx:pad - dx + w] for dx, dy in shifts]
    views += [rotated(images, angle) for angle in rotations]
    out = embed(torch.cat(views)).reshape(len(views), n, -1).mean(dim=0)
    return F.normalize(out, dim=1) if normalize else out


#: test-time symmetric copies (`tta_symmetries`), one function of N x C x H x W images per name: the tensor twins of
#: data.base.CLASS_TRANSFORMS, the transposes that `augment_classes` trains as classes of their own
SYMMETRIES: dict[str, Callable[[Tensor], Tensor]] = {
    "rot90": lambda x: x.transpose(2, 3).flip(2), "rot180": lambda x: x.flip(2).flip(3),
    "rot270": lambda x: x.transpose(2, 3).flip(3), "flip_lr": lambda x: x.flip(3), "flip_tb": lambda x: x.flip(2),
    "transpose": lambda x: x.transpose(2, 3), "transverse": lambda x: x.transpose(2, 3).flip(2).flip(3),
}


def rotated(images: Tensor, degrees: float) -> Tensor:
    """`images` rotated counterclockwise by `degrees` about their centre (bilinear, edges replicated)."""
    n, _, h, w = images.shape
    cos, sin = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
    # output pixel centres in pixels from the centre (y down), then the input point each samples, normalised
    ys = torch.arange(h, dtype=images.dtype, device=images.device) + 0.5 - h / 2
    xs = torch.arange(w, dtype=images.dtype, device=images.device) + 0.5 - w / 2
    y, x = torch.meshgrid(ys, xs, indexing="ij")
    grid = torch.stack([(cos * x - sin * y) / (w / 2), (sin * x + cos * y) / (h / 2)], dim=-1)
    return F.grid_sample(images, grid.expand(n, h, w, 2), mode="bilinear", padding_mode="border",
                         align_corners=False)


def build_embedder(config: dict[str, Any], pretrained: str | None = None) -> Embedder:
    """An Embedder from a `model` config section (backbone, dim, normalize, preprocessing, ...)."""
    cfg = dict(config)
    pre = cfg.pop("preprocessing", None)
    cfg.pop("pretrained", None)
    cfg.pop("project", None)  # the projection `export` appends, not part of the trained network
    known = {"backbone", "dim", "normalize", "backbone_params", "tta_shifts", "tta_rotations", "freeze", "members",
             "whiten", "tta_symmetries"}
    unknown = set(cfg) - known
    if unknown:
        raise ValueError(f"unknown model key(s) {sorted(unknown)}; "
                         f"known: {sorted(known | {'preprocessing', 'pretrained', 'project'})}")
    return Embedder(preprocessing=pre or {}, pretrained=pretrained, **cfg)


def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint file a path names: the file itself, or a run directory's best.pt, else last.pt."""
    path = Path(path)
    if path.is_dir():
        found = [c for c in (path / "best.pt", path / "last.pt") if c.is_file()]
        if not found:
            raise FileNotFoundError(f"{path} has no best.pt or last.pt: is it a metricsearch run directory?")
        return found[0]
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    return path


def load_checkpoint(path: str | Path) -> tuple[Embedder, dict[str, Any]]:
    """The Embedder (in eval mode) and the whole saved state of a checkpoint file or run directory."""
    path = resolve_checkpoint(path)
    state = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(state, dict) or "model_config" not in state:
        raise ValueError(f"{path} is not a metricsearch checkpoint (no model_config)")
    model = build_embedder(state["model_config"])
    model.load_state_dict(state["model"])
    return model.eval(), state


def load_embedder(path: str | Path) -> Embedder:
    """An Embedder restored from a checkpoint file or a run directory (its best.pt, else last.pt)."""
    return load_checkpoint(path)[0]
