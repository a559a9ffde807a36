"""Deprecated aliases of the train modules and names renamed by issue 87: each warns when used; all go in the
next release (0.2)."""

from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType
from typing import Any


def warn_renamed(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn (DeprecationWarning) that `old` is now `new`, and that the old name goes in the next release;
    `stacklevel` 3 points at the caller of the function that warns."""
    warnings.warn(f"{old} is deprecated: use {new} (the old name goes in the next release)", DeprecationWarning,
                  stacklevel=stacklevel)


def alias_module(old: str, new: str) -> ModuleType:
    """The module `new`, imported also under its old name `old` (for a thin module at the old path), with a warning."""
    warn_renamed(old, new)
    module = importlib.import_module(new)
    sys.modules[old] = module
    return module


def renamed_attribute(module: str, name: str, renames: dict[str, str]) -> Any:
    """For a module's `__getattr__`: the object an old attribute `name` now is (`renames`: old name -> the new
    one's full dotted path, `package.module.name`), with a warning; an AttributeError for any other name."""
    if name not in renames:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    warn_renamed(f"{module}.{name}", renames[name], stacklevel=4)
    new_module, _, new_name = renames[name].rpartition(".")
    return getattr(importlib.import_module(new_module), new_name)
