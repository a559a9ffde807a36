"""The pair-weight plot: a valid PNG with one panel per loss, from a clustered random batch."""

from __future__ import annotations

import struct

import torch

from metricsearch.train.losses import build
from metricsearch.train.losses.pair_weight_plots import plot_pair_weights, random_batch

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_random_batch_is_clustered_and_deterministic():
    emb, labels = random_batch(n_classes=4, per_class=5, dim=16, seed=3)
    assert emb.shape == (20, 16) and labels.tolist() == [c for c in range(4) for _ in range(5)]
    torch.testing.assert_close(emb, random_batch(n_classes=4, per_class=5, dim=16, seed=3)[0])
    unit = torch.nn.functional.normalize(emb, dim=1)
    sim = unit @ unit.t()
    same = labels[:, None] == labels[None, :]
    off_diagonal = ~torch.eye(20, dtype=torch.bool)
    assert sim[same & off_diagonal].mean() > sim[~same].mean() + 0.2


def test_plot_pair_weights_writes_png(tmp_path):
    emb, labels = random_batch()
    losses = {"ms": build("ms"), "contrastive": build("contrastive"), "margin": build("margin"),
              "triplet_l2": build("triplet_l2")}
    out = plot_pair_weights(losses, emb, labels, tmp_path / "plots" / "weights.png")
    data = out.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert 800 <= width <= 3000 and 300 <= height <= 2000  # 3 x 2 panels
    assert 10_000 < len(data) < 5_000_000
