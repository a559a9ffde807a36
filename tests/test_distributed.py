"""Distributed training on CPU (gloo, 2 processes started by torchrun): the gathered global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from metricsearch.train.distributed import DistContext, context_from_env, gather_rows, select_backend

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "workers"))
from gathered_loss import CASES, global_batch  # noqa: E402


def torchrun(script: Path, *args: str, nproc: int = 2, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `script` under a real torchrun on this machine (localhost rendezvous, gloo)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def test_backend_and_context_selection() -> None:
    assert select_backend("cuda") == "nccl" and select_backend("cpu") == "gloo"
    assert context_from_env({}) == DistContext(0, 1, 0)
    ctx = context_from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert ctx.active and not ctx.is_main and ctx.world_size == 2
    with pytest.raises(ValueError, match="RANK"):
        context_from_env({"RANK": "2", "WORLD_SIZE": "2"})
    x = torch.ones(3, 2)
    assert gather_rows(x, DistContext()) is x  # one process: nothing to gather


def test_gathered_loss_and_gradients_equal_the_single_process_ones(tmp_path: Path) -> None:
    done = torchrun(REPO / "tests" / "workers" / "gathered_loss.py", str(tmp_path))
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    emb, labels, indices = global_batch()
    for name, (make_loss, make_weighting) in CASES.items():
        torch.manual_seed(0)
        loss_fn, weighting = make_loss(), make_weighting()
        full = emb.clone().requires_grad_(True)
        loss = loss_fn(full, labels, weighting=weighting)
        loss.backward()
        for r in ranks:
            got = r[name]
            start, stop = got["own"]
            assert torch.equal(got["labels"], labels) and torch.equal(got["indices"], indices)
            torch.testing.assert_close(got["loss"], loss.detach(), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(got["grad"], full.grad[start:stop], rtol=1e-5, atol=1e-6)
            for key, p in loss_fn.named_parameters():
                if p.grad is not None:
                    torch.testing.assert_close(got["param_grads"][key], p.grad, rtol=1e-5, atol=1e-6)
        assert any(g.abs().sum() > 0 for g in (ranks[0][name]["grad"], ranks[1][name]["grad"])), name
    assert ranks[0]["margin_learned"]["param_grads"], "the learned beta got no gradient"
    for name in ("proxy_anchor", "soft_triple"):  # replicated, not split: every rank holds the same whole gradient
        assert torch.equal(ranks[0][name]["param_grads"]["proxies"], ranks[1][name]["param_grads"]["proxies"])


def test_two_process_run_trains_evaluates_and_writes_one_run_dir(tmp_path: Path) -> None:
    overrides = [f"output_dir={tmp_path}", "name=ddp", "epochs=2", "batches_per_epoch=3", "eval.nmi=false",
                 "model.dim=16", "device=cpu", "loss={name: margin, beta_mode: learned}", "distill={epochs: 1}"]
    first = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "metricsearch",
         "train", "--quiet", "--stop-after-epoch", "1", "--set", *overrides],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert first.returncode == 0, first.stderr[-4000:]
    resumed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "metricsearch",
         "train", "--quiet", "--resume", "--set", *overrides],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert [p.name for p in tmp_path.iterdir()] == ["ddp"]
    *rows, test = [json.loads(line) for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2, 3]  # the third distils
    assert all(r["world_size"] == 2 for r in rows)
    assert test["split"] == "test" and test["epoch"] == 3 and 0.0 < test["recall_at_k"]["1"] <= 1.0  # rank 0's
    summaries = [line for line in resumed.stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == 1 and json.loads(summaries[0])["epochs"] == 3  # rank 0 alone reports
    state = torch.load(tmp_path / "ddp" / "last.pt", weights_only=False)
    assert state["epoch"] == 3 and float(state["loss"]["beta0"]) != 1.2  # the learned beta moved
    assert state["distill_after"] == 2 and (tmp_path / "ddp" / "distill_targets.pt").is_file()
