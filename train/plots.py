"""The training plot: loss and Recall@1 over epochs, as a PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def training_figure(history: list[dict[str, Any]], title: str = "") -> Any:
    """A two-panel matplotlib figure (train loss, validation Recall@1 per epoch) of metrics.jsonl rows; both
    panels span every epoch, tick whole epochs only and shade the distillation's epochs (rows with phase: distill)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    epochs = [row["epoch"] for row in history]
    fig, (ax_loss, ax_r1) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax_loss.plot(epochs, [row["loss"] for row in history], marker="o", color="tab:blue")
    ax_loss.set(xlabel="epoch", ylabel="mean training loss", title="loss")
    evals = [row for row in history if row.get("recall_at_k")]
    ax_r1.plot([r["epoch"] for r in evals], [r["recall_at_k"][1] for r in evals], marker="o", color="tab:green")
    ax_r1.set(xlabel="epoch", ylabel="Recall@1 (validation classes)", title="Recall@1", ylim=(0, 1.02))
    distilled = [row["epoch"] for row in history if row.get("phase") == "distill"]
    for ax in (ax_loss, ax_r1):
        if distilled:  # their loss adds the distance to the targets
            ax.axvspan(min(distilled) - 0.5, max(distilled) + 0.5, color="tab:orange", alpha=0.15,
                       label="distillation (loss + weight x distance)")
            ax.legend(loc="best", fontsize="small")
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers
        if epochs:  # the same span on both panels, even where one epoch was evaluated
            ax.set_xlim(min(epochs) - 0.25, max(epochs) + 0.25)
            if max(epochs) - min(epochs) < 10:  # too short a span for the locator to keep to whole numbers
                ax.set_xticks(range(min(epochs), max(epochs) + 1))
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_training(history: list[dict[str, Any]], out: str | Path, title: str = "") -> Path:
    """Write the training figure (see `training_figure`) of metrics.jsonl rows as a PNG."""
    import matplotlib.pyplot as plt

    fig = training_figure(history, title)
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
