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


def create_drafter(name: str, config: DrafterConfig | None = None, threads: int = 1) -> Drafter:
    """The drafter registered as ``name``. ``threads`` > 1: its batch calls draft rows on that
    many threads (only a drafter whose class says ``parallel = True``: the native one)."""
    _load_builtin()
    if name not in _REGISTRY:
        raise KeyError(f"unknown drafter {name!r}; available: {', '.join(sorted(_REGISTRY))}")
    cls = _REGISTRY[name]
    if getattr(cls, "parallel", False):
        return cls(config or DrafterConfig(), threads=threads)
    if type(threads) is not int or threads != 1:
        raise ValueError(f"the {name} drafter drafts on one thread; {threads!r} draft threads need the native drafter")
    return cls(config or DrafterConfig())
