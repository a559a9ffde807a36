"""The device choices every command and config takes: auto (a GPU where there is one), cpu or cuda."""

from __future__ import annotations

#: what `--device` and the config key `device` accept (training also takes cuda:N)
DEVICES = ("auto", "cpu", "cuda")


def check_device(name: str, indexed: bool = True) -> str:
    """`name` if it is a device choice (with `indexed`, also cuda:N); else a ValueError saying the choices."""
    if name in DEVICES or (indexed and isinstance(name, str) and name.startswith("cuda:")
                           and name[5:].isdigit()):
        return name
    choices = ", ".join(DEVICES) + (" or cuda:N" if indexed else "")
    raise ValueError(f"device must be one of {choices}, got {name!r}")
