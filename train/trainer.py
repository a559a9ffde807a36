"""The trainer: config -> run directory with metrics, checkpoints and a plot; resumable."""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch.utils.data import DataLoader

from metricsearch.errors import MetricsearchError
from metricsearch.models.embedder import Embedder, build_embedder
from metricsearch.train import losses, sampling
from metricsearch.train.augment import build_augment
from metricsearch.train.config import component
from metricsearch.data import DataSplit, ImageSet, load_split, with_transformed_classes
from metricsearch.evaluation import evaluate_split
from metricsearch.train.dataset import ImageDataset
from metricsearch.train.device import amp_dtype, resolve_device
from metricsearch.train.plots import plot_training
from metricsearch.train.sampling.compat import check_compatible


class TrainingError(MetricsearchError):
    """Training cannot go on (e.g. the loss became NaN); the last good checkpoint is kept."""


@dataclass
class RunResult:
    """What a finished training run produced."""

    run_dir: Path
    epochs: int
    best_recall_at_1: float
    last_metrics: dict[str, Any]


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA) RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _evaluate(model: Embedder, split: DataSplit, config: dict[str, Any]) -> dict[str, Any]:
    """Recall@K, NMI and MAP@R of `model` on the split's test classes (query vs gallery where given)."""
    ev = config["eval"]

    def embed(images: ImageSet) -> np.ndarray:
        return model.embed_set(images, batch_size=ev["batch_size"])

    return evaluate_split(embed, split, ev.get("recall_k"), ev["nmi"], ev.get("one_shot_ways"))


def _optimizer(model: Embedder, loss: torch.nn.Module, cfg: dict[str, Any]) -> torch.optim.Optimizer:
    cfg = dict(cfg)
    name = cfg.pop("name", "adamw")
    lr = float(cfg.pop("lr"))
    head_lr = float(cfg.pop("head_lr", lr))
    groups = [{"params": list(model.backbone.parameters()), "lr": lr},
              {"params": list(model.head.parameters()), "lr": head_lr}]
    if hasattr(loss, "param_groups"):
        groups += loss.param_groups(lr)
    elif any(p.requires_grad for p in loss.parameters()):
        groups.append({"params": list(loss.parameters()), "lr": lr})
    classes = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}
    if name not in classes:
        raise ValueError(f"unknown optimizer.name {name!r}; choose one of {', '.join(classes)}")
    if name == "sgd":
        cfg.setdefault("momentum", 0.9)
    return classes[name](groups, lr=lr, **cfg)


def _schedule(opt: torch.optim.Optimizer, cfg: dict[str, Any], steps_per_epoch: int, epochs: int):
    cfg = dict(cfg)
    name = cfg.pop("name", "cosine")
    warmup = int(float(cfg.pop("warmup_epochs", 0)) * steps_per_epoch)
    total = max(1, steps_per_epoch * epochs)
    if name == "cosine":
        floor = float(cfg.pop("min_factor", 0.01))

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            t = (step - warmup) / max(1, total - warmup)
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))
    elif name == "step":
        every = int(cfg.pop("every_epochs", max(1, epochs // 3))) * steps_per_epoch
        gamma = float(cfg.pop("gamma", 0.1))

        def factor(step: int) -> float:
            return (step + 1) / warmup if step < warmup else gamma ** ((step - warmup) // every)
    elif name == "constant":

        def factor(step: int) -> float:
            return (step + 1) / warmup if step < warmup else 1.0
    else:
        raise ValueError(f"unknown schedule.name {name!r}; choose cosine, step or constant")
    if cfg:
        raise ValueError(f"schedule {name!r} has no parameter(s) {sorted(cfg)}")
    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def _save(obj: dict[str, Any], path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _prepare_run_dir(config: dict[str, Any], resume: bool, overwrite: bool) -> Path:
    run_dir = Path(config["output_dir"]) / str(config["name"])
    last = run_dir / "last.pt"
    if resume:
        if not last.is_file():
            raise FileNotFoundError(f"--resume: {last} does not exist; start the run without --resume")
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
        differ = sorted(k for k in set(saved) | set(config) if k != "epochs" and saved.get(k) != config.get(k))
        if differ:
            raise ValueError(
                f"--resume: the config differs from the run's saved config in {differ}; "
                "only `epochs` may change when resuming"
            )
    elif last.is_file() and not overwrite:
        raise FileExistsError(
            f"{run_dir} already holds a run; pass --resume to continue it, --overwrite to replace it, "
            "or --set name=OTHER for a new run"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return run_dir


def train(
    config: dict[str, Any], resume: bool = False, overwrite: bool = False, progress: bool = True,
    stop_after_epoch: int | None = None,
) -> RunResult:
    """Train an embedder as the config says, evaluating and checkpointing into OUTPUT_DIR/NAME/.

    `stop_after_epoch` pauses the run after that epoch (resume it later with `resume=True`).
    """
    from tqdm.auto import tqdm

    device = resolve_device(config["device"])
    autocast = amp_dtype(device, config["amp"])
    split = load_split(config["dataset"], download=bool(config["download"]), split_classes=config["split_classes"],
                       split=config.get("split", "test"))
    split = replace(split, train=with_transformed_classes(split.train, config.get("augment_classes")))
    held_out = len(split.test) > 0  # else a final fit: no evaluation, best.pt is the last epoch
    if progress:
        for note in split.notes:
            print(f"data: {note}", flush=True)
    seed = int(config["seed"])
    seed_everything(seed)

    model_cfg = dict(config["model"])
    model = build_embedder(model_cfg, pretrained=model_cfg.get("pretrained"))
    train_labels = np.asarray(split.train.labels)
    counts = split.train.class_counts()
    stats = {"class_counts": counts, "num_classes": len(split.train.class_names), "num_images": len(split.train)}
    loss_name, loss_params = component(config, "loss")
    loss_fn = losses.build(loss_name, **stats, **loss_params)
    sampler_name, sampler_params = component(config, "sampler")
    batches = config["batches_per_epoch"]
    sampler = sampling.build_sampler(sampler_name, train_labels, seed=seed, batches_per_epoch=batches, **sampler_params)
    miner_name, miner_params = component(config, "miner")
    miner = sampling.build_miner(miner_name, **miner_params) if miner_name else None
    weighting_name, weighting_params = component(config, "weighting")
    weighting = (sampling.build_weighting(weighting_name, {**stats, "sampler": sampler}, **weighting_params)
                 if weighting_name else None)
    check_compatible(loss_fn, miner, weighting, sampler)
    run_dir = _prepare_run_dir(config, resume, overwrite)

    model.to(device)
    loss_fn.to(device)
    if device.type == "cuda":
        model.to(memory_format=torch.channels_last)
    optimizer = _optimizer(model, loss_fn, config["optimizer"])
    epochs = int(config["epochs"])
    scheduler = _schedule(optimizer, config["schedule"], len(sampler), epochs)
    scaler = torch.amp.GradScaler("cuda", enabled=autocast is torch.float16)

    history: list[dict[str, Any]] = []
    start_epoch, best_r1 = 0, -1.0
    if resume:
        state = torch.load(run_dir / "last.pt", map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        loss_fn.load_state_dict(state["loss"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        start_epoch, best_r1, history = state["epoch"], state["best_recall_at_1"], state["history"]
    _write_metrics(run_dir, history)

    augment = build_augment(config["augment"], model.preprocessing.size)
    dataset = ImageDataset(split.train, model.preprocessing, augment, cache=bool(config["cache_images"]))
    pin = device.type == "cuda"
    last_metrics: dict[str, Any] = history[-1] if history else {}
    for epoch in range(start_epoch, min(epochs, stop_after_epoch or epochs)):
        seed_everything(seed * 100_003 + epoch)  # per-epoch seeding makes --resume exact
        sampler.set_epoch(epoch)
        loader = DataLoader(dataset, batch_sampler=sampler, num_workers=config["num_workers"], pin_memory=pin)
        model.train()
        t0, seen, loss_sum, n_steps = time.perf_counter(), 0, 0.0, 0
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{epochs}", disable=None if progress else True, unit="batch", leave=False)
        for images, labels, indices in bar:
            images = images.to(device, non_blocking=pin)
            if device.type == "cuda":
                images = images.contiguous(memory_format=torch.channels_last)
            labels = labels.to(device, non_blocking=pin)
            with torch.autocast(device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
                emb = model(images)
            emb = emb.float()
            mined = sampler.pairs(labels)
            if miner is not None:
                mined = miner(emb.detach(), labels, mined)
            per_image = {"indices": indices.to(device)} if loss_fn.uses_indices else {}
            loss = loss_fn(emb, labels, mined=mined, reduction=weighting, **per_image)
            if not torch.isfinite(loss):
                raise TrainingError(
                    f"loss became {loss.item()} at epoch {epoch + 1}, step {n_steps + 1}; "
                    f"{run_dir / 'last.pt'} still holds the last good state. Start again with a lower "
                    "optimizer.lr (--overwrite), check the loss parameters, or try amp=off."
                )
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            sampler.observe(indices.tolist(), emb.detach())
            seen += len(images)
            n_steps += 1
            loss_sum += loss.item()
            bar.set_postfix(loss=f"{loss.item():.4f}", img_s=f"{seen / (time.perf_counter() - t0):.0f}")
        bar.close()
        row: dict[str, Any] = {"epoch": epoch + 1, "loss": loss_sum / max(n_steps, 1),
                               "images_per_s": seen / (time.perf_counter() - t0)}
        is_last = epoch + 1 == epochs
        if held_out and ((epoch + 1) % int(config["eval"]["every"]) == 0 or is_last):
            row.update(_evaluate(model, split, config))
        history.append(row)
        last_metrics = row
        state = {
            "model_config": model.config, "model": model.state_dict(), "loss": loss_fn.state_dict(),
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(), "epoch": epoch + 1, "history": history,
            "config": config, "class_names": split.test.class_names, "data_notes": split.notes,
        }
        _write_metrics(run_dir, history)  # rewritten from the checkpoint's history on --resume
        plot_training(history, run_dir / "training.png", title=f"{config['name']}: {loss_name} on {config['dataset']}")
        r1 = row.get("recall_at_k", {}).get(1)
        if not held_out or r1 is not None and r1 > best_r1:
            best_r1 = r1
            state["best_recall_at_1"] = best_r1
            _save(state, run_dir / "best.pt")
        state["best_recall_at_1"] = best_r1
        _save(state, run_dir / "last.pt")
        if progress:
            _report(row, epoch, epochs)
    return RunResult(run_dir, len(history), best_r1, last_metrics)


def _write_metrics(run_dir: Path, history: list[dict[str, Any]]) -> None:
    with open(run_dir / "metrics.jsonl", "w") as f:
        for row in history:
            f.write(json.dumps(row) + "\n")


def _report(row: dict[str, Any], epoch: int, epochs: int) -> None:
    text = f"epoch {epoch + 1}/{epochs}  loss {row['loss']:.4f}  {row['images_per_s']:.0f} img/s"
    if "recall_at_k" in row:
        recalls = "  ".join(f"R@{k} {v:.3f}" for k, v in row["recall_at_k"].items())
        nmi = f"  NMI {row['nmi']:.3f}" if row.get("nmi") is not None else ""
        text += f"  |  {recalls}{nmi}  MAP@R {row['map_at_r']:.3f}"
    print(text, flush=True)
