"""Serving options declared once: a config field with its help generates its environment
variable and its launcher flag.

A field ``eagle_reserve: int | None = option(None, "...", metavar="M", at_least=0)`` of
HVDServingConfig becomes the variable ``SGLANG_HVD_EAGLE_RESERVE`` (what SGLang's spawned
processes read) and the flag ``--hvd-eagle-reserve M`` of ``python -m
sglang_hvd.launch_server`` (its help: the field's, plus the variable and the default).
The cache drafter's settings come from DrafterConfig's own fields the same way
(``max_scan`` -> ``SGLANG_HVD_MAX_SCAN``, ``--hvd-max-scan``), carried in
HVDServingConfig.drafter_overrides. One table (``Option`` rows) then reads the
environment, writes it, builds the flags and checks every value: a bad one is named by
its variable or its flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from collections.abc import Mapping

from ..errors import HvdInputError

PREFIX = "SGLANG_HVD_"
FLAG_PREFIX = "--hvd-"
_KINDS = (bool, int, float, str)


def option(default, help: str, *, metavar: str | None = None, at_least: float | None = None,
           at_most: float | None = None, minus_inf: bool = False, what: str = "number", flag: str | None = None,
           launcher_default: bool | None = None, default_text: str | None = None):
    """A serving option's field. ``at_least`` / ``at_most``: the smallest / largest value accepted; floats must be
    finite (``minus_inf``: -inf too; ``what`` names the value in that message); ``flag``
    replaces the generated flag name. A bool's flag is a switch: given, it sets the field
    to ``not launcher_default``, the value the launcher uses without it. ``default_text``
    says in the help what an unset option means (else the default is shown when not None)."""
    meta = {"help": help, "metavar": metavar, "at_least": at_least, "at_most": at_most, "minus_inf": minus_inf,
            "what": what, "flag": flag, "launcher_default": launcher_default, "default_text": default_text}
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True, slots=True)
class Option:
    """One serving option: a config field, its variable and its flag."""

    name: str  # the field's name (HVDServingConfig's, or DrafterConfig's when drafter)
    kind: type  # bool, int, float or str
    default: object
    help: str
    env: str  # SGLANG_HVD_NAME
    flag: str  # --hvd-name
    metavar: str | None = None
    at_least: float | None = None
    at_most: float | None = None
    minus_inf: bool = False
    what: str = "number"
    launcher_default: bool | None = None
    default_text: str | None = None  # what leaving it unset means, for the help
    drafter: bool = False  # a DrafterConfig field, carried in HVDServingConfig.drafter_overrides

    @property
    def dest(self) -> str:
        return "hvd_" + self.name

    def problem(self, value) -> str | None:
        """What is wrong with ``value`` (already of the option's kind), or None."""
        if self.kind is float and not math.isfinite(value) and not (self.minus_inf and value == -math.inf):
            return f"must be a finite {self.what}{' or -inf' if self.minus_inf else ''}, got {value}"
        if self.at_least is not None and value < self.at_least:
            return f"must be >= {self.at_least:g}, got {value}"
        if self.at_most is not None and value > self.at_most:
            return f"must be <= {self.at_most:g}, got {value}"
        return None

    def convert(self, text: str):
        """The value ``text`` spells, unchecked; ValueError says why it spells none."""
        if self.kind is bool:
            if text not in ("0", "1"):
                raise ValueError(f"must be 0 or 1, got {text!r}")
            return text == "1"
        try:
            return self.kind(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a valid {self.kind.__name__}") from None

    def parse(self, text: str):
        """``convert``, then ``problem``: ValueError with what is wrong (without the option's name)."""
        value = self.convert(text)
        problem = self.problem(value) if self.kind in (int, float) else None
        if problem:
            raise ValueError(problem)
        return value

    def format(self, value) -> str:
        """The text ``parse`` reads back as ``value`` (floats by repr: exact)."""
        if self.kind is bool:
            return "1" if value else "0"
        return repr(float(value)) if self.kind is float else str(value)

    def read_env(self, environ: Mapping[str, str]):
        """The value set in ``environ`` (None when unset or empty), converted but not yet
        checked (the config checks it); HvdInputError names the variable."""
        text = environ.get(self.env)
        if text in (None, ""):
            return None
        try:
            return self.convert(text)
        except ValueError as e:
            raise HvdInputError(f"{self.env}{' ' if self.kind is bool else '='}{e}") from None

    def flag_help(self) -> str:
        if self.kind is bool:
            return f"{self.help} ({self.env}={self.format(not self.launcher_default)})"
        default = self.default_text or (None if self.default is None else str(self.default))
        return f"{self.help} ({self.env}{'' if default is None else '; default: ' + default})"

    def add_flag(self, group) -> None:
        if self.kind is bool:
            group.add_argument(self.flag, dest=self.dest, action="store_const", const=not self.launcher_default,
                               default=self.launcher_default, help=self.flag_help())
            return
        group.add_argument(self.flag, dest=self.dest, type=self._argparse_type(), default=None,
                           metavar=self.metavar or {int: "N", float: "X", str: "TEXT"}[self.kind],
                           help=self.flag_help().replace("%", "%%"))

    def _argparse_type(self):
        def checked(text: str):
            try:
                return self.parse(text)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e)) from None

        checked.__name__ = self.kind.__name__
        return checked


def _field_kind(cls: type, f: dataclasses.Field) -> type:
    """bool, int, float or str, from the field's annotation (``X | None`` -> X)."""
    hint = typing.get_type_hints(cls)[f.name]
    kinds = [k for k in typing.get_args(hint) or (hint,) if k is not type(None)]
    if len(kinds) != 1 or kinds[0] not in _KINDS:
        raise TypeError(f"{cls.__name__}.{f.name}: a serving option is a bool, int, float or str (or None)")
    return kinds[0]


def options_of(cls: type, *, drafter: bool = False, skip: tuple[str, ...] = (),
               default_text=None) -> tuple[Option, ...]:
    """The options of a dataclass's fields that carry a help (``skip``: left out).
    ``default_text(name)``: what leaving a field's option unset means, when the field
    itself does not say (``option(default_text=...)``)."""
    out = []
    for f in dataclasses.fields(cls):
        if f.name in skip or "help" not in f.metadata:
            continue
        meta = f.metadata
        out.append(Option(
            name=f.name, kind=_field_kind(cls, f), default=None if drafter else f.default, help=meta["help"],
            env=PREFIX + f.name.upper(), flag=meta.get("flag") or FLAG_PREFIX + f.name.replace("_", "-"),
            metavar=meta.get("metavar"), at_least=meta.get("at_least"), at_most=meta.get("at_most"),
            minus_inf=meta.get("minus_inf", False),
            what=meta.get("what", "number"), launcher_default=meta.get("launcher_default"),
            default_text=meta.get("default_text") or (default_text(f.name) if default_text else None), drafter=drafter))
    return tuple(out)


def add_flags(group, options: tuple[Option, ...]) -> None:
    for opt in options:
        opt.add_flag(group)


def _gathered(options: tuple[Option, ...], value_of) -> dict:
    """``{field: value}`` of the options ``value_of(opt)`` gives (None: not given), with the
    drafter's settings gathered under ``drafter_overrides``."""
    values, overrides = {}, []
    for opt in options:
        value = value_of(opt)
        if value is None:
            continue
        if opt.drafter:
            overrides.append((opt.name, value))
        else:
            values[opt.name] = value
    values["drafter_overrides"] = tuple(overrides)
    return values


def values_from_flags(args: argparse.Namespace, options: tuple[Option, ...]) -> dict:
    """``{field: value}`` for the flags given (a bool switch: always)."""
    return _gathered(options, lambda opt: getattr(args, opt.dest))


def values_from_env(environ: Mapping[str, str], options: tuple[Option, ...]) -> dict:
    """``{field: value}`` for the variables set."""
    return _gathered(options, lambda opt: opt.read_env(environ))
