"""Run by torchrun in tests/test_distributed.py: each rank's loss and gradients on a gathered global batch, the
loss's own parameters' gradients averaged over the ranks as the trainer does."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from metricsearch.train import losses, weightings
from metricsearch.train.distributed import average_gradients, gather_batch, init_distributed, shutdown

#: (name, loss factory, weighting factory) as tests/test_distributed.py rebuilds them
CASES = {
    "ms": (lambda: losses.build("ms"), lambda: None),
    "margin_learned": (lambda: losses.build("margin", beta_mode="learned", nu=0.01), lambda: None),
    "contrastive_dro_kl": (lambda: losses.build("contrastive"), lambda: weightings.build_weighting("dro_kl")),
    "proxy_anchor": (lambda: losses.build("proxy_anchor", num_classes=4, embedding_dim=16), lambda: None),
    "soft_triple": (lambda: losses.build("soft_triple", num_classes=4, embedding_dim=16, centers_per_class=2),
                    lambda: None),
}


def global_batch(seed: int = 0, n: int = 24, dim: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A deterministic global batch: embeddings, labels (4 classes), data set indices."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, dim, generator=gen), torch.arange(n) % 4, torch.arange(n) * 3


def main(out: Path) -> None:
    ctx, _ = init_distributed(torch.device("cpu"))
    emb, labels, indices = global_batch()
    share = emb.shape[0] // ctx.world_size
    own = slice(ctx.rank * share, (ctx.rank + 1) * share)
    result = {}
    for name, (make_loss, make_weighting) in CASES.items():
        torch.manual_seed(0)
        loss_fn, weighting = make_loss(), make_weighting()
        local = emb[own].clone().requires_grad_(True)
        g_emb, g_labels, g_idx = gather_batch(local, labels[own], indices[own], ctx)
        loss = loss_fn(g_emb, g_labels, weighting=weighting)
        loss.backward()
        average_gradients(loss_fn, ctx)
        result[name] = {"loss": loss.detach(), "grad": local.grad, "own": (own.start, own.stop),
                        "labels": g_labels, "indices": g_idx,
                        "param_grads": {k: p.grad for k, p in loss_fn.named_parameters() if p.grad is not None}}
    torch.save(result, out / f"rank{ctx.rank}.pt")
    shutdown(ctx)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
