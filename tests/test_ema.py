"""Weight averaging (config `ema`): the average against a loop of its formula, its start step, what it replaces, and
in the trainer (exact resume, the weights at the end, clear config errors)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from metricsearch.app.cli import main
from metricsearch.train.ema import WeightAverage
from metricsearch.train.trainer import train
from test_pipeline import quick_config


def small_net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))


def step(net: nn.Module, seed: int) -> None:
    """Move every weight and the batch-norm statistics, as a training step would."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=g))
    net.train()
    net(torch.randn(8, 4, generator=g))  # updates running_mean, running_var and num_batches_tracked


def test_the_average_matches_a_loop_of_its_formula_from_its_start_step() -> None:
    net = small_net(0)
    span, start = 4.0, 2
    average = WeightAverage(net, span, start_step=start)
    expected: dict[str, torch.Tensor] | None = None
    for k in range(7):
        step(net, k)
        average.update(net, k)
        now = {n: t.detach().clone().double() for n, t in net.state_dict().items() if t.is_floating_point()}
        if k == start:
            expected = now  # it starts as the weights at its start step
        elif k > start:
            expected = {n: expected[n] * (1 - 1 / span) + now[n] / span for n in now}
    last = {n: t.clone() for n, t in net.state_dict().items()}
    average.apply(net)
    for name, value in net.state_dict().items():
        if value.is_floating_point():
            torch.testing.assert_close(value.double(), expected[name], rtol=1e-6, atol=1e-6)
            assert not torch.equal(value, last[name]), name
        else:  # the step counter of batch norm is the model's own
            assert torch.equal(value, last[name]), name
    assert int(average.state_dict()["n_averaged"]) == 7 - start


def test_before_its_start_step_the_average_leaves_the_weights_as_they_are() -> None:
    net = small_net(1)
    average = WeightAverage(net, 3.0, start_step=10)
    for k in range(3):
        step(net, k)
        average.update(net, k)
    before = {n: t.clone() for n, t in net.state_dict().items()}
    average.apply(net)
    for name, value in net.state_dict().items():
        assert torch.equal(value, before[name]), name
    with pytest.raises(ValueError, match="at least one step"):
        WeightAverage(net, 0.5)


def test_training_with_an_average_resumes_exactly_and_ends_on_the_average(tmp_path) -> None:
    settings = ["epochs=3", "ema={span: 1, start_epoch: 1}"]  # 3 batches an epoch: each step weighs 1/3
    full = train(quick_config(tmp_path, "name=full", *settings), progress=False)
    train(quick_config(tmp_path, "name=split", *settings), progress=False, stop_after_epoch=2)
    resumed = train(quick_config(tmp_path, "name=split", *settings), resume=True, progress=False)
    a = torch.load(full.run_dir / "last.pt", weights_only=False)
    b = torch.load(resumed.run_dir / "last.pt", weights_only=False)
    for key, value in [*a["model"].items(), *a["ema"].items()]:
        assert torch.equal(value, {**b["model"], **b["ema"]}[key]), key
    assert int(a["ema"]["n_averaged"]) == 6  # the steps of epochs 2 and 3
    for name, value in a["model"].items():  # the run's weights are the average's
        if value.is_floating_point():
            assert torch.equal(value, a["ema"][f"module.{name}"]), name
    plain = torch.load(train(quick_config(tmp_path, "name=plain", "epochs=3"), progress=False).run_dir / "last.pt",
                       weights_only=False)
    assert "ema" not in plain
    assert not torch.equal(plain["model"]["head.weight"], a["model"]["head.weight"])


def test_an_average_comes_before_the_distillation_and_the_whitening(tmp_path) -> None:
    settings = ["epochs=2", "ema={span: 1}", "distill={epochs: 1}", "model.whiten=0.5"]
    paused = train(quick_config(tmp_path, *settings), progress=False, stop_after_epoch=2)
    at_two = torch.load(paused.run_dir / "last.pt", weights_only=False)
    for name, value in at_two["model"].items():
        if value.is_floating_point() and f"module.{name}" in at_two["ema"] and "whiten" not in name:
            assert torch.equal(value, at_two["ema"][f"module.{name}"]), name
    done = train(quick_config(tmp_path, *settings), resume=True, progress=False)
    assert done.epochs == 3 and done.last_metrics.get("phase") == "distill"


@pytest.mark.parametrize("overrides, message", [
    (["ema.start_epoch=1"], "ema.start_epoch (1) must come before the run's last epoch"),
    (["ema.span=-1"], "ema.span"),
    (["ema.decay=0.99"], "decay"),
])
def test_bad_average_configs_exit_2_with_one_line(tmp_path, capsys, overrides, message) -> None:
    args = ["train", "--output-dir", str(tmp_path), "--set", "epochs=1", "batches_per_epoch=1", "ema.span=2",
            *overrides]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
