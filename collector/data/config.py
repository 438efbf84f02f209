"""One way to declare, check and build a config block.

Every block of configuration (the engine's DeepSpeed JSON sections, the comms
logger, telemetry, the client, the profiler, the schedulers, the loss scaler,
the collector's store) is a kw-only dataclass deriving from ``ConfigBlock``:

    @dataclass(kw_only=True)
    class CommsLoggerConfig(ConfigBlock):
        SECTION: ClassVar[str] = "comms_logger"
        enabled: bool = False
        prof_ops: list[str] = field(default_factory=list)
        window: int = setting(100, ge=1)

    cfg = CommsLoggerConfig.from_dict({"enabled": True})

The field's annotation is its type and is checked (bool, int, float, str,
``list[str]``, ``dict``, ``X | None``, ``Literal[...]``, a nested block);
``setting(default, ge=, gt=, le=, lt=, choices=)`` adds a range. Checks run in
``__post_init__``, so a block built directly is checked too; cross-field rules
go in ``validate()``. One rule for keys a block does not know: a warning naming
each by its dotted path (``ConfigWarning``, "ignoring unknown config keys: ..."),
so a ds_config.json written for DeepSpeed keeps working; keys in ``ACCEPTED``
are known to be harmless and pass silently. A bad value raises ``ConfigError``
naming the dotted key, what is allowed and what was given.

Pure Python: the training ranks, the collector and the engine all build on it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import math
import types
import typing
import warnings
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, Union


class ConfigError(ValueError):
    """A config value is invalid; the message names the dotted key."""


class ConfigWarning(UserWarning):
    """A config key that is not used (unknown to this block)."""


# The dotted path of the block being built by from_dict (a nested block is built
# under "parent.key"); a block built directly uses its class's SECTION.
_building_key: contextvars.ContextVar[str | None] = contextvars.ContextVar("rankscope_config_key", default=None)


def setting(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, ge=None, gt=None,
            le=None, lt=None, choices=None) -> Any:
    """A dataclass field with a range: ``ge``/``gt``/``le``/``lt`` for numbers, ``choices`` for any value."""
    meta = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt), ("choices", choices)) if v is not None}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a finite number"
    if tp is str:
        return "a string"
    if tp is dict or origin is dict:
        return "an object"
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        return "a list" if item is Any else f"a list of {_describe(item).removeprefix('a ').removeprefix('an ')}s"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) if a is not type(None) else "null" for a in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, ConfigBlock):
        return "an object"
    return getattr(tp, "__name__", str(tp))


def _conforms(tp: Any, value: Any) -> bool:
    if tp is Any:
        return True
    origin = typing.get_origin(tp)
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if tp is str:
        return isinstance(value, str)
    if tp is dict or origin is dict:
        return isinstance(value, Mapping)
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        return isinstance(value, (list, tuple)) and all(_conforms(item, v) for v in value)
    if origin is Literal:
        return value in typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return any(_conforms(a, value) for a in typing.get_args(tp))
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def _nested_block(tp: Any) -> type[ConfigBlock] | None:
    """The ConfigBlock class in ``tp`` (``Block`` or ``Block | None``), if any."""
    for cand in (tp, *typing.get_args(tp)):
        if isinstance(cand, type) and issubclass(cand, ConfigBlock):
            return cand
    return None


@dataclasses.dataclass(kw_only=True)
class ConfigBlock:
    """Base of every config block (see the module docstring)."""

    SECTION: ClassVar[str] = ""  # dotted path of the block in its config file
    ACCEPTED: ClassVar[frozenset[str]] = frozenset()  # keys accepted and ignored without a warning

    # ---- building ----
    @classmethod
    def from_dict(cls, d: Mapping | ConfigBlock | None = None, *, key: str | None = None, **extra):
        """Build the block from a JSON-style dict (None: all defaults). ``extra`` are
        values the caller supplies (init-only fields, derived settings)."""
        if isinstance(d, cls):
            return d
        key = key if key is not None else cls.SECTION
        if d is None:
            d = {}
        if not isinstance(d, Mapping):
            raise ConfigError(f"{key or 'config'}: must be an object (got {d!r})")
        hints = cls._hints()
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(k for k in d if k not in names and k not in cls.ACCEPTED)
        if unknown:
            warn_unknown(key, unknown)
        values = {}
        for name, value in d.items():
            if name not in names:
                continue
            nested = _nested_block(hints.get(name))
            if nested is not None and (value is None or isinstance(value, Mapping)):
                value = None if value is None else nested.from_dict(value, key=_join(key, name))
            values[name] = value
        token = _building_key.set(key)
        try:
            return cls(**values, **extra)
        finally:
            _building_key.reset(token)

    def to_dict(self) -> dict:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.init}

    # ---- checking ----
    def __post_init__(self) -> None:
        hints = self._hints()
        for f in dataclasses.fields(self):
            if not f.init or f.name not in hints:
                continue
            value = getattr(self, f.name)
            tp = hints[f.name]
            if not _conforms(tp, value):
                self.fail(f.name, f"must be {_describe(tp)}", value)
            if typing.get_origin(tp) is list and isinstance(value, tuple):
                setattr(self, f.name, list(value))
            self._check_range(f, value)
        self.validate()

    def validate(self) -> None:
        """Cross-field rules of a block; raise through ``self.fail``."""

    def key(self, name: str = "") -> str:
        """The dotted path of this block, or of one of its fields."""
        base = _building_key.get()
        return _join(base if base is not None else self.SECTION, name)

    def fail(self, name: str, message: str, value: Any = dataclasses.MISSING) -> typing.NoReturn:
        got = "" if value is dataclasses.MISSING else f" (got {value!r})"
        raise ConfigError(f"{self.key(name)}: {message}{got}")

    def _check_range(self, f: dataclasses.Field, value: Any) -> None:
        meta = f.metadata
        if not meta or value is None:
            return
        if "choices" in meta and value not in meta["choices"]:
            self.fail(f.name, "must be one of " + ", ".join(repr(c) for c in meta["choices"]), value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            for op, bound, words in (("ge", meta.get("ge"), ">="), ("gt", meta.get("gt"), ">"),
                                     ("le", meta.get("le"), "<="), ("lt", meta.get("lt"), "<")):
                if bound is None:
                    continue
                ok = {"ge": value >= bound, "gt": value > bound, "le": value <= bound, "lt": value < bound}[op]
                if not ok:
                    self.fail(f.name, f"must be {words} {bound}", value)

    @classmethod
    def _hints(cls) -> dict[str, Any]:
        cached = cls.__dict__.get("_rankscope_hints")
        if cached is None:
            cached = typing.get_type_hints(cls)
            cls._rankscope_hints = cached
        return cached


def warn_unknown(key: str, names: list[str]) -> None:
    """The one unknown-key rule: one warning naming each key by its dotted path."""
    warnings.warn("ignoring unknown config keys: " + ", ".join(_join(key, n) for n in names), ConfigWarning,
                  stacklevel=4)


def _join(prefix: str | None, name: str) -> str:
    return f"{prefix}.{name}" if prefix and name else (prefix or name)


def _plain(value: Any) -> Any:
    if isinstance(value, ConfigBlock):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
