"""The weighting contract: a weighting turns a pair loss's per-pair losses into the batch loss."""

from __future__ import annotations

from typing import Callable

from torch import Tensor

#: (losses, pos, neg, labels) -> the batch loss (a scalar); `losses` is B x B, `pos` / `neg` the B x B boolean masks
#: of the pairs that count, `labels` the batch's classes
Weighting = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
