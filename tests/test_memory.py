"""Cross-batch memory (XBM): MS against earlier batches' embeddings, by a loop reference, pytorch-metric-learning's
CrossBatchMemory, a gradient check, and in the trainer (exact resume, clear config errors)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from metricsearch.app.cli import main
from metricsearch.train.losses import build
from metricsearch.train.cross_batch_memory import CrossBatchMemory
from metricsearch.train.trainer import train
from test_losses_lse import EPS, cosine
from test_pipeline import quick_config


def ref_ms_against(emb: Tensor, labels: list[int], refs: Tensor, ref_labels: list[int], mining: bool,
                   a: float = 2.0, b: float = 50.0, base: float = 0.5) -> Tensor:
    """MS eq. 15 for the batch's anchors over [batch; refs] (each anchor's pair with itself left out), by loops."""
    s = cosine(torch.cat([emb, refs]))
    y = labels + ref_labels
    total = s.new_zeros(())
    for i in range(len(labels)):
        pos = [k for k in range(len(y)) if k != i and y[k] == y[i]]
        neg = [k for k in range(len(y)) if y[k] != y[i]]
        if mining:
            d = s.detach()
            min_pos = min((float(d[i, k]) for k in pos), default=math.inf)
            max_neg = max((float(d[i, k]) for k in neg), default=-math.inf)
            pos = [k for k in pos if float(d[i, k]) < max_neg + EPS]
            neg = [k for k in neg if float(d[i, k]) > min_pos - EPS]
        total = total + torch.log(1 + sum((torch.exp(-a * (s[i, k] - base)) for k in pos), s.new_zeros(()))) / a
        total = total + torch.log(1 + sum((torch.exp(b * (s[i, k] - base)) for k in neg), s.new_zeros(()))) / b
    return total / len(labels)


def case(seed: int, dim: int = 6) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    ref_labels = torch.tensor([0, 1, 4, 4, 2, 5, 3, 3, 6, 1])
    return (torch.randn(8, dim, generator=g, dtype=torch.float64), labels,
            torch.randn(10, dim, generator=g, dtype=torch.float64), ref_labels)


@pytest.mark.parametrize("mining", [True, False])
def test_ms_against_references_matches_the_loop_reference_with_its_gradient(mining: bool) -> None:
    emb, labels, refs, ref_labels = case(1)
    loss = build("ms" if mining else "ms_weighting")
    mine = emb.clone().requires_grad_(True)
    theirs_emb = emb.clone().requires_grad_(True)
    ours = loss.loss_against(mine, labels, refs, ref_labels)
    theirs = ref_ms_against(theirs_emb, labels.tolist(), refs, ref_labels.tolist(), mining)
    torch.testing.assert_close(ours, theirs)
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(mine.grad, theirs_emb.grad)


def test_ms_against_references_passes_gradcheck_and_reduces_to_the_batch_loss_without_them() -> None:
    emb, labels, refs, ref_labels = case(2)
    loss = build("ms_weighting")
    assert torch.autograd.gradcheck(lambda e: loss.loss_against(e, labels, refs, ref_labels),
                                    (emb.clone().requires_grad_(True),))
    torch.testing.assert_close(loss.loss_against(emb, labels, refs[:0], ref_labels[:0]), loss(emb, labels))


def test_memory_matches_pytorch_metric_learning_cross_batch_memory_step_by_step() -> None:
    pytest.importorskip("pytorch_metric_learning")
    from pytorch_metric_learning import losses, miners

    batch, size, dim = 16, 40, 8
    g = torch.Generator().manual_seed(5)
    # PML's memory holds the current batch too: its memory_size is ours plus one batch
    theirs = losses.CrossBatchMemory(losses.MultiSimilarityLoss(alpha=2, beta=50, base=0.5), dim,
                                     memory_size=size + batch, miner=miners.MultiSimilarityMiner(epsilon=0.1))
    ours = CrossBatchMemory(build("ms"), size, dim)
    for step in range(6):  # fills, then wraps around the ring
        emb = torch.randn(batch, dim, generator=g, dtype=torch.float64)
        labels = torch.randint(0, 6, (batch,), generator=g)
        a, b = ours(emb, labels), theirs(emb, labels)
        torch.testing.assert_close(a, b.to(a.dtype), rtol=1e-6, atol=1e-9, msg=f"step {step}")
    assert int(ours.filled) == size and int(ours.steps) == 6


def test_memory_waits_for_its_start_step_but_fills_from_the_first() -> None:
    emb, labels, _, _ = case(3)
    memory = CrossBatchMemory(build("ms"), 12, emb.shape[1], start_step=1)
    first = memory(emb, labels)
    torch.testing.assert_close(first, build("ms")(emb, labels))  # step 0: the batch alone
    assert int(memory.filled) == 8 and torch.equal(memory.bank[:8], emb.float())
    second = memory(emb.flip(0), labels.flip(0))  # step 1: against the bank as well
    assert not torch.allclose(second, build("ms")(emb.flip(0), labels.flip(0)))
    assert int(memory.filled) == 12 and int(memory.position) == 4
    with pytest.raises(ValueError, match="cannot use a cross-batch memory"):
        CrossBatchMemory(build("triplet"), 12, 4)


def test_training_with_memory_resumes_exactly_and_keeps_the_bank(tmp_path) -> None:
    settings = ["loss={name: ms}", "memory={size: 64, start_epoch: 1}"]
    full = train(quick_config(tmp_path, "name=full", "epochs=3", *settings), progress=False)
    train(quick_config(tmp_path, "name=split", "epochs=3", *settings), progress=False, stop_after_epoch=2)
    resumed = train(quick_config(tmp_path, "name=split", "epochs=3", *settings), resume=True, progress=False)
    a = torch.load(full.run_dir / "last.pt", weights_only=False)
    b = torch.load(resumed.run_dir / "last.pt", weights_only=False)
    for key, value in [*a["model"].items(), *a["memory"].items()]:
        assert torch.equal(value, {**b["model"], **b["memory"]}[key]), key
    assert int(a["memory"]["filled"]) == 64 and int(a["memory"]["steps"]) == 9
    plain = torch.load(train(quick_config(tmp_path, "name=plain", "epochs=3", "loss={name: ms}"),
                             progress=False).run_dir / "last.pt", weights_only=False)
    assert "memory" not in plain
    assert not torch.equal(plain["model"]["head.weight"], a["model"]["head.weight"])  # the bank changed training


@pytest.mark.parametrize("overrides, message", [
    (["loss={name: contrastive}", "memory.size=32"], "cannot use a cross-batch memory"),
    (["loss={name: ms}", "miner={name: ms}", "memory.size=32"], "drop the miner"),
    (["memory.sizes=32"], "sizes"),
])
def test_bad_memory_configs_exit_2_with_one_line(tmp_path, capsys, overrides, message) -> None:
    args = ["train", "--output-dir", str(tmp_path), "--set", "epochs=1", "batches_per_epoch=1", *overrides]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_run_saved_before_the_memory_and_distill_sections_existed_still_resumes(tmp_path) -> None:
    import yaml

    paused = train(quick_config(tmp_path, "epochs=2"), progress=False, stop_after_epoch=1)
    saved = yaml.safe_load((paused.run_dir / "config.yaml").read_text())
    del saved["memory"], saved["distill"]  # as an older version wrote it
    (paused.run_dir / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    assert train(quick_config(tmp_path, "epochs=2"), resume=True, progress=False).epochs == 2
    with pytest.raises(ValueError, match=r"\['memory'\]"):  # a real change of the new key is still refused
        train(quick_config(tmp_path, "epochs=3", "memory.size=16"), resume=True, progress=False)
