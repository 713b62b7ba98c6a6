"""The drafter registry: implementations register a name; callers create by name.

Kept apart from protocol.py so that implementations import the contract (protocol.py)
and the registry without an import loop: the registry imports them lazily.
"""

from __future__ import annotations

from collections.abc import Callable

from .protocol import Drafter, DrafterConfig

_REGISTRY: dict[str, Callable[[DrafterConfig], Drafter]] = {}


def register_drafter(name: str) -> Callable[[type], type]:
    """Class decorator: make a drafter available under ``name`` (``hvd replay --drafter``)."""

    def add(cls: type) -> type:
        if name in _REGISTRY:
            raise ValueError(f"drafter {name!r} is already registered")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return add


def _load_builtin() -> None:
    from . import native_drafter, suffix_drafter  # noqa: F401  (register "native" when built, "python")


def available_drafters() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def create_drafter(name: str, config: DrafterConfig | None = None) -> Drafter:
    _load_builtin()
    if name not in _REGISTRY:
        raise KeyError(f"unknown drafter {name!r}; available: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name](config or DrafterConfig())
