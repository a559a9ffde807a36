"""An ensemble in one network (`model.members`): its embedding, checkpoint and ONNX graph, each member trained on its
own loss, and the configs it cannot take."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from metricsearch.app.cli import main
from metricsearch.models.onnx_embedder import OnnxEmbedder
from metricsearch.models.torch_embedder import build_embedder, load_embedder
from metricsearch.train.export import export_onnx
from metricsearch.train.trainer import train
from test_pipeline import quick_config


def test_the_embedding_is_the_members_embeddings_side_by_side_in_torch_and_onnx(tmp_path) -> None:
    torch.manual_seed(0)
    model = build_embedder({"dim": 16, "members": 3, "backbone_params": {"width": 8},
                            "tta_shifts": [[0, 0], [2, 0]]}).eval()
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        members = [F.normalize(head(net(x)), dim=1) for net, head in zip(model.backbone.nets, model.head.nets)]
        single = model._embed(x)
        torch.testing.assert_close(single, torch.cat(members, dim=1) / 3 ** 0.5)
        for got, expected in zip(model.member_embeddings(single), members):
            torch.testing.assert_close(got, expected)
        cosine = single @ single.T  # the ensemble's similarity is the mean of its members'
        torch.testing.assert_close(cosine, sum(m @ m.T for m in members) / 3)
        assert model.dim == 48 and not torch.equal(model.head.nets[0].weight, model.head.nets[1].weight)
        with_views = model(x)
    assert model.config["members"] == 3 and "members" not in build_embedder({"dim": 16}).config
    torch.save(model.checkpoint(), tmp_path / "m.pt")
    with torch.no_grad():
        torch.testing.assert_close(load_embedder(tmp_path / "m.pt")(x), with_views)
    batch = x.numpy()
    export_onnx(model, tmp_path / "m.onnx", batch)
    onnx_model = OnnxEmbedder(tmp_path / "m.onnx", device="cpu")
    assert np.abs(onnx_model.embed_arrays(batch) - with_views.numpy()).max() <= 1e-4
    assert json.loads(onnx_model.metadata["model_config"])["members"] == 3


def test_each_member_trains_on_its_own_loss_as_the_single_model_would(tmp_path) -> None:
    """Member 0 of an ensemble starts from the single model's weights under the same seed and sees the same batches;
    with its own loss it follows that model (up to rounding), where one loss over the joint embedding would not."""
    one = torch.load(train(quick_config(tmp_path, "name=one"), progress=False).run_dir / "last.pt",
                     weights_only=False)["model"]
    two = torch.load(train(quick_config(tmp_path, "name=two", "model.members=2"), progress=False).run_dir / "last.pt",
                     weights_only=False)["model"]
    for key, value in one.items():
        part, rest = key.split(".", 1)
        torch.testing.assert_close(two[f"{part}.nets.0.{rest}"], value, atol=1e-3, rtol=0)
    assert (two["head.nets.1.weight"] - one["head.weight"]).abs().max() > 0.05


@pytest.mark.parametrize("overrides, message", [
    (["model.members=0"], "model.members"),
    (["model.members=2", "loss={name: ms}", "memory.size=32"], "set model.members: 1, or memory.size: 0"),
    (["model.members=2", "model.backbone=resnet18", "model.freeze=1"], "set model.members: 1, or drop model.freeze"),
])
def test_configs_an_ensemble_cannot_take_exit_2_with_one_line(tmp_path, capsys, overrides, message) -> None:
    args = ["train", "--output-dir", str(tmp_path), "--set", "epochs=1", "batches_per_epoch=1", *overrides]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
