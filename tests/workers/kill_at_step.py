"""`python -m metricsearch ARGS` in this process, SIGKILLed when its build reaches a named step (index/build_steps.py):
STEP at its first arrival, STEP:N at its n-th.

    python tests/workers/kill_at_step.py STEP[:N] ARGS...
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Callable

from metricsearch.app.cli import main
from metricsearch.index.build_steps import BUILD_STEPS, observe_steps


def killer(stop: str) -> Callable[[str], None]:
    """An observer that SIGKILLs this process at the arrival at a step that `stop` (STEP or STEP:N) names."""
    name, _, nth = stop.partition(":")
    if name not in BUILD_STEPS:
        raise SystemExit(f"unknown build step {name!r}: one of {', '.join(BUILD_STEPS)}")
    arrivals = 0

    def at(step: str) -> None:
        nonlocal arrivals
        arrivals += step == name
        if step == name and arrivals == int(nth or 1):
            os.kill(os.getpid(), signal.SIGKILL)

    return at


if __name__ == "__main__":
    observe_steps(killer(sys.argv[1]))
    raise SystemExit(main(sys.argv[2:]))
