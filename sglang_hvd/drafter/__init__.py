"""Cache drafters: one Protocol (protocol.py), one registry (registry.py), one file per implementation."""

from .protocol import Draft, Drafter, DrafterConfig
from .registry import available_drafters, create_drafter, register_drafter

__all__ = ["Draft", "Drafter", "DrafterConfig", "available_drafters", "create_drafter", "register_drafter"]
