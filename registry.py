"""A name -> factory registry with helpful errors, shared by losses, samplers, miners, backbones."""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to factories (classes or functions) of one kind of component."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Callable[..., T]] = {}

    def register(self, name: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator that registers a factory under `name`."""

        def add(factory: Callable[..., T]) -> Callable[..., T]:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = factory
            return factory

        return add

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def get(self, name: str) -> Callable[..., T]:
        """The factory for `name`; a ValueError suggests close names for a typo."""
        if name not in self._entries:
            close = difflib.get_close_matches(str(name), self._entries, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ValueError(
                f"unknown {self.kind} {name!r}.{hint} Known: {', '.join(self.names())}"
            )
        return self._entries[name]

    def parameters(self, name: str) -> dict[str, Any]:
        """The factory's keyword parameters and their defaults (inspect.Parameter.empty if required)."""
        sig = inspect.signature(self.get(name))
        return {
            p.name: p.default
            for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        }

    def build(self, name: str, context: dict[str, Any] | None = None, /, **params: Any) -> T:
        """Instantiate `name` with `params`; `context` entries are passed only where accepted."""
        factory = self.get(name)
        accepted = self.parameters(name)
        unknown = sorted(set(params) - set(accepted))
        if unknown and not _takes_var_kwargs(factory):
            raise ValueError(
                f"{self.kind} {name!r} has no parameter(s) {', '.join(unknown)}; "
                f"it accepts: {', '.join(accepted) or 'none'}"
            )
        kwargs = {k: v for k, v in (context or {}).items() if k in accepted and k not in params}
        kwargs.update(params)
        try:
            return factory(**kwargs)
        except TypeError as exc:  # a value of the wrong type from a config: a user error, said in one line
            raise ValueError(f"{self.kind} {name!r}: a parameter has the wrong type ({exc})") from exc

    def describe(self, name: str) -> str:
        """First line of the factory's docstring."""
        doc = inspect.getdoc(self.get(name)) or ""
        return doc.splitlines()[0] if doc else ""


def _takes_var_kwargs(factory: Callable[..., Any]) -> bool:
    return any(
        p.kind is p.VAR_KEYWORD for p in inspect.signature(factory).parameters.values()
    )
