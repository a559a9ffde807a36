"""An evaluation result as text, as the CLI and the demo print it."""

from __future__ import annotations

from typing import Any

#: the prefixes of the result keys beyond Recall@K, NMI and MAP@R (one-shot protocols, recall against exact)
EXTRA_METRICS = ("one_shot", "recall_at_10_vs")


def format_metrics(result: dict[str, Any]) -> str:
    """An evaluation result as aligned text lines: Recall@K, NMI, MAP@R, queries, one-shot accuracy."""
    lines = [f"Recall@{k:<5} {v:.4f}" for k, v in result["recall_at_k"].items()]
    if result["nmi"] is not None:
        lines.append(f"NMI          {result['nmi']:.4f}")
    lines += [f"MAP@R        {result['map_at_r']:.4f}", f"queries      {result['n_queries']}"]
    if result.get("center"):
        lines.append(f"centred      by {result['center']:g} x the mean gallery embedding")
    for key in (k for k in result if k.startswith(EXTRA_METRICS)):
        value = result[key]
        if isinstance(value, dict):  # a protocol's error and its 95% confidence interval
            low, high = value["ci95"]
            centred = f", centred {value['center']:g}" if value.get("center") else ""
            lines.append(f"{key:<12} error {value['error']:.4f} (95% CI {low:.4f}-{high:.4f}, "
                         f"{value['episodes']} episodes{centred})")
        else:
            lines.append(f"{key:<12} {value:.4f}")
    return "\n".join(lines)
