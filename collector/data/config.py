"""One way to declare, check and build a config block.

Every block of configuration (the engine's DeepSpeed JSON sections, the comms
logger, telemetry, the client, the profiler, the schedulers, the loss scaler,
the monitors, MoE layers, the collector's store and compaction) is a kw-only
dataclass deriving from ``ConfigBlock``, declared beside the code that reads it:

    @dataclass(kw_only=True)
    class CommsLoggerConfig(ConfigBlock):
        SECTION: ClassVar[str] = "comms_logger"
        enabled: bool = False
        prof_ops: list[str] = field(default_factory=list)
        window: int = setting(100, ge=1)

    cfg = CommsLoggerConfig.from_dict({"enabled": True})

The field's annotation is its type and is checked (bool, int, float, str,
``list[X]``, ``dict``, ``X | None``, ``Literal[...]``, a nested block). JSON has
one number type, so an int field takes an integral float (``5e8``) and a float
field an int; both are stored as the declared type. ``setting(default, ge=, gt=,
le=, lt=, choices=)`` adds a range (for a list, to each item). A field without a
default is required. ``derived(...)`` declares a value the caller supplies (the
world size, the raw dict), never read from the config. Checks run in
``__post_init__``, so a block built directly is checked too; cross-field rules go
in ``validate()``.

``from_dict(d, key=...)`` builds nested blocks under ``key.field`` (a missing or
null block gets its defaults, unless the field defaults to None: no block; a block
already built is taken as it is, so an owner handed one does not report its
unknown keys again) and applies the one rule for keys a block does not know: a warning
naming each by its dotted path (``ConfigWarning``, "ignoring unknown config keys:
..."), so a ds_config.json written for DeepSpeed keeps working; keys in
``ACCEPTED`` are known to be harmless and pass silently; ``ALIASES`` maps an
older spelling to its field. A bad value raises ``ConfigError`` naming the dotted
key, what is allowed and what was given. A block remembers its dotted path, so
its owner can still ``fail()`` with the right key after building it (a learning
rate list checked against the optimizer's param groups).

Pure Python: the training ranks, the collector and the engine all build on it.
"""

from __future__ import annotations

import contextvars
import dataclasses
import difflib
import math
import os
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
_INVALID = object()  # what _coerce returns for a value that does not fit the type


def setting(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    ge=None,
    gt=None,
    le=None,
    lt=None,
    choices=None,
) -> Any:
    """A dataclass field with a range: ``ge``/``gt``/``le``/``lt`` for numbers, ``choices`` for any value."""
    meta = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt), ("choices", choices)) if v is not None}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


def derived(
    default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING, repr: bool = True
) -> Any:
    """A field the caller supplies (``from_dict(d, name=value)``), never read from the config dict."""
    return dataclasses.field(default=default, default_factory=default_factory, repr=repr, metadata={"derived": True})


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
    if tp is dict or origin is dict or tp is Mapping:
        return "an object"
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        return "a list" if item is Any else f"a list of {_describe(item).removeprefix('a ').removeprefix('an ')}s"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        words = (_describe(a) if a is not type(None) else "null" for a in typing.get_args(tp))
        return " or ".join(dict.fromkeys(words))
    if isinstance(tp, type) and issubclass(tp, ConfigBlock):
        return "an object"
    return getattr(tp, "__name__", str(tp))


def _coerce(tp: Any, value: Any) -> Any:
    """``value`` as type ``tp`` (an integral float as int, an int as float, a tuple as
    list), or _INVALID when it is not one."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if tp is type(None):
        return value if value is None else _INVALID
    if tp is bool:
        return value if isinstance(value, bool) else _INVALID
    if isinstance(value, bool):  # True is an int to Python, not to a config
        return _INVALID if tp in (int, float) else _coerce_other(tp, origin, value)
    if tp is int:
        if isinstance(value, int):
            return value
        return int(value) if isinstance(value, float) and value.is_integer() else _INVALID
    if tp is float:
        if not isinstance(value, (int, float)):
            return _INVALID
        try:
            value = float(value)
        except OverflowError:  # an int too big for a float
            return _INVALID
        return value if math.isfinite(value) else _INVALID
    return _coerce_other(tp, origin, value)


def _coerce_other(tp: Any, origin: Any, value: Any) -> Any:
    if tp is str:
        return value if isinstance(value, str) else _INVALID
    if tp is dict or origin is dict or tp is Mapping:
        return value if isinstance(value, Mapping) else _INVALID
    if origin is list:
        if not isinstance(value, (list, tuple)):
            return _INVALID
        (item,) = typing.get_args(tp) or (Any,)
        items = [_coerce(item, v) for v in value]
        return _INVALID if any(v is _INVALID for v in items) else items
    if origin is Literal:
        return value if any(value == a and type(value) is type(a) for a in typing.get_args(tp)) else _INVALID
    if origin in (Union, types.UnionType):
        for member in typing.get_args(tp):
            coerced = _coerce(member, value)
            if coerced is not _INVALID:
                return coerced
        return _INVALID
    if isinstance(tp, type):
        return value if isinstance(value, tp) else _INVALID
    return value


def _nested_block(tp: Any) -> type[ConfigBlock] | None:
    """The ConfigBlock class when ``tp`` is ``Block`` or ``Block | None``, else None."""
    members = (
        [a for a in typing.get_args(tp) if a is not type(None)]
        if typing.get_origin(tp) in (Union, types.UnionType)
        else [tp]
    )
    if len(members) == 1 and isinstance(members[0], type) and issubclass(members[0], ConfigBlock):
        return members[0]
    return None


@dataclasses.dataclass(kw_only=True)
class ConfigBlock:
    """Base of every config block (see the module docstring)."""

    SECTION: ClassVar[str] = ""  # dotted path of the block in its config file
    ACCEPTED: ClassVar[frozenset[str]] = frozenset()  # keys accepted and ignored without a warning
    ALIASES: ClassVar[Mapping[str, str]] = {}  # older spelling -> field

    # ---- building ----
    @classmethod
    def from_dict(cls, d: Mapping | ConfigBlock | None = None, *, key: str | None = None, **extra):
        """Build the block from a JSON-style dict (None: all defaults). ``extra`` are
        the ``derived`` values the caller supplies."""
        if isinstance(d, cls):
            return d
        key = key if key is not None else cls.SECTION
        if d is None:
            d = {}
        if not isinstance(d, Mapping):
            raise ConfigError(f"{key or 'config'}: must be an object (got {d!r})")
        d = cls._renamed(d, key)
        hints = cls._hints()
        fields = [f for f in dataclasses.fields(cls) if f.init and not f.metadata.get("derived")]
        names = {f.name for f in fields}
        unknown = sorted(k for k in d if k not in names and k not in cls.ACCEPTED)
        if unknown:
            warn_unknown(key, unknown, known=sorted(names | cls.ACCEPTED | set(cls.ALIASES)))
        missing = [
            f.name
            for f in fields
            if f.name not in d and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise ConfigError(", ".join(_join(key, name) for name in missing) + ": required, not given")
        values = {}
        for f in fields:
            value = d.get(f.name, dataclasses.MISSING)
            nested = _nested_block(hints.get(f.name))
            # A nested block is built here, under its dotted key; a missing or null one gets its
            # defaults, unless the field's default is no block at all (None).
            if nested is not None and (
                isinstance(value, Mapping)
                or ((value is None or value is dataclasses.MISSING) and f.default is not None)
            ):
                value = nested.from_dict(value if isinstance(value, Mapping) else None, key=_join(key, f.name))
            if value is not dataclasses.MISSING:
                values[f.name] = value
        token = _building_key.set(key)
        try:
            return cls(**values, **extra)
        finally:
            _building_key.reset(token)

    @classmethod
    def _renamed(cls, d: Mapping, key: str) -> Mapping:
        """``d`` with older spellings (ALIASES) under their field's name."""
        if not any(old in d for old in cls.ALIASES):
            return d
        d = dict(d)
        for old, new in cls.ALIASES.items():
            if old not in d:
                continue
            value = d.pop(old)
            if new in d and d[new] != value:
                raise ConfigError(
                    f"{_join(key, old)} and {_join(key, new)}: the same setting given twice with "
                    f"different values ({value!r} and {d[new]!r}); keep one"
                )
            d[new] = value
        return d

    def to_dict(self) -> dict:
        return {
            f.name: _plain(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.init and not f.metadata.get("derived")
        }

    # ---- checking ----
    def __post_init__(self) -> None:
        building = _building_key.get()
        object.__setattr__(self, "_dotted_key", building if building is not None else self.SECTION)
        # Blocks built directly inside these checks use their own SECTION, not this block's key.
        token = _building_key.set(None)
        try:
            self._check_fields()
            self.validate()
        finally:
            _building_key.reset(token)

    def _check_fields(self) -> None:
        hints = self._hints()
        for f in dataclasses.fields(self):
            if not f.init or f.name not in hints:
                continue
            value = getattr(self, f.name)
            coerced = _coerce(hints[f.name], value)
            if coerced is _INVALID:
                self.fail(f.name, f"must be {_describe(hints[f.name])}", value)
            if coerced is not value:
                object.__setattr__(self, f.name, coerced)
            self._check_range(f, coerced, value)

    def validate(self) -> None:
        """Cross-field rules of a block; raise through ``self.fail``."""

    def key(self, name: str = "") -> str:
        """The dotted path of this block, or of one of its fields."""
        return _join(getattr(self, "_dotted_key", self.SECTION), name)

    def fail(self, name: str, message: str, value: Any = dataclasses.MISSING) -> typing.NoReturn:
        """Raise ConfigError "<dotted key of name>: <message> (got <value>)"."""
        got = "" if value is dataclasses.MISSING else f" (got {value!r})"
        raise ConfigError(f"{self.key(name)}: {message}{got}")

    def _check_range(self, f: dataclasses.Field, value: Any, given: Any) -> None:
        meta = f.metadata
        if not meta or value is None:
            return
        for item in value if isinstance(value, list) else (value,):
            if "choices" in meta and item not in meta["choices"]:
                self.fail(
                    f.name,
                    "must be one of "
                    + ", ".join(str(c) if isinstance(c, (int, float)) else repr(c) for c in meta["choices"]),
                    given,
                )
            if not isinstance(item, (int, float)) or isinstance(item, bool):
                continue
            for op, words in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
                bound = meta.get(op)
                if bound is not None and not _BOUND_CHECKS[op](item, bound):
                    self.fail(f.name, f"must be {words} {bound}", given)

    @classmethod
    def _hints(cls) -> dict[str, Any]:
        cached = cls.__dict__.get("_rankscope_hints")
        if cached is None:
            cached = typing.get_type_hints(cls)
            cls._rankscope_hints = cached
        return cached


_BOUND_CHECKS = {
    "ge": lambda v, b: v >= b,
    "gt": lambda v, b: v > b,
    "le": lambda v, b: v <= b,
    "lt": lambda v, b: v < b,
}


def warn_unknown(key: str, names: list[str], known: typing.Iterable[str] = ()) -> None:
    """The one unknown-key rule: one warning naming each key by its dotted path, with the known key
    it is closest to where there is one (a typo: ``zero_optimisation (did you mean zero_optimization?)``)."""
    known = [k for k in known if isinstance(k, str)]
    described = []
    for name in names:
        close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.75)
        hint = f" (did you mean {_join(key, close[0])}?)" if close else ""
        described.append(_join(key, str(name)) + hint)
    warnings.warn("ignoring unknown config keys: " + ", ".join(described), ConfigWarning, stacklevel=4)


_plain_formatwarning = warnings.formatwarning
_shown: set[str] = set()  # the ConfigWarnings already printed by this process


def _formatwarning(message, category, filename, lineno, line=None) -> str:
    """How a ConfigWarning reads on the console: its message alone, no file:line and no echoed
    source line (the config's author has nothing to do with the line that read it); on a
    distributed job's rank 0 only, as every rank reads the same config. Other warnings as before;
    a warning recorded by ``catch_warnings`` is unaffected."""
    if isinstance(category, type) and issubclass(category, ConfigWarning):
        text = f"{category.__name__}: {message}\n"
        if os.environ.get("RANK", "0") not in ("", "0") or text in _shown:
            return ""
        _shown.add(text)  # once per process, however many times the config is read
        return text
    return _plain_formatwarning(message, category, filename, lineno, line)


warnings.formatwarning = _formatwarning


def _join(prefix: str | None, name: str) -> str:
    return f"{prefix}.{name}" if prefix and name else (prefix or name)


def _plain(value: Any) -> Any:
    if isinstance(value, ConfigBlock):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
