"""Class proxies: MS against one learned proxy per class, by a loop reference with the gradients of the embeddings
and of the proxies, a gradient check, and in the trainer (its own learning rate, exact resume, clear config errors)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from metricsearch.train.losses import build
from metricsearch.train.proxies import ClassProxies
from test_memory import case, full_and_paused, ref_ms_against, training_error


@pytest.mark.parametrize("loss_name", ["ms", "ms_weighting"])
@pytest.mark.parametrize("negatives", [True, False])
def test_proxies_loss_and_gradients_match_the_loop_reference(loss_name: str, negatives: bool) -> None:
    emb, labels, _, _ = case(4)
    proxies = ClassProxies(build(loss_name), [3, 0, 2, 1, 0, 3, 5], emb.shape[1], negatives).double()
    assert proxies.proxy_labels.tolist() == [0, 1, 2, 3, 5]
    theirs_proxies = proxies.proxies.detach().clone().requires_grad_(True)
    mine, theirs_emb = emb.clone().requires_grad_(True), emb.clone().requires_grad_(True)
    ours = proxies(mine, labels)
    theirs = ref_ms_against(theirs_emb, labels.tolist(), F.normalize(theirs_proxies, dim=1),
                            proxies.proxy_labels.tolist(), mining=loss_name == "ms", ref_negatives=negatives)
    torch.testing.assert_close(ours, theirs)
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(mine.grad, theirs_emb.grad)
    torch.testing.assert_close(proxies.proxies.grad, theirs_proxies.grad)
    assert proxies.proxies.grad.abs().sum() > 0


def test_proxies_pass_gradcheck_in_the_embeddings_and_the_proxies() -> None:
    emb, labels, _, _ = case(5)
    loss = build("ms_weighting")
    proxies = torch.randn(6, emb.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    proxy_labels = torch.arange(6)

    for negatives in (True, False):
        def value(e: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
            return loss.loss_against(e, labels, F.normalize(p, dim=1), proxy_labels, ref_negatives=negatives)

        assert torch.autograd.gradcheck(value, (emb.clone().requires_grad_(True), proxies.requires_grad_(True)))


def test_proxies_refuse_a_loss_without_references() -> None:
    with pytest.raises(ValueError, match="cannot compare with class proxies"):
        ClassProxies(build("triplet"), [0, 1], 4)


def test_training_with_proxies_trains_them_at_their_rate_and_resumes_exactly(tmp_path) -> None:
    a, after_two = full_and_paused(tmp_path, ["loss={name: ms}", "proxies={per_class: 1, lr_factor: 5}"])
    backbone, *_, own = a["optimizer"]["param_groups"]
    assert own["lr"] == pytest.approx(5 * backbone["lr"]) and own["weight_decay"] == 0.0
    assert len(own["params"]) == 1 and a["memory"]["proxies"].shape == (len(a["memory"]["proxy_labels"]), 32)
    assert not torch.equal(a["memory"]["proxies"], after_two["memory"]["proxies"])  # the third epoch moved them


@pytest.mark.parametrize("overrides, message", [
    (["loss={name: contrastive}", "proxies.per_class=1"], "cannot compare with class proxies"),
    (["loss={name: ms}", "miner={name: ms}", "proxies.per_class=1"], "drop the miner"),
    (["loss={name: ms}", "memory.size=32", "proxies.per_class=1"], "memory.size: 0"),
    (["proxies.per_class=2"], "per_class"),
    (["proxies.lr=0.1"], "proxies.lr"),
])
def test_bad_proxies_configs_exit_2_with_one_line(tmp_path, capsys, overrides, message) -> None:
    assert message in training_error(tmp_path, capsys, overrides)
