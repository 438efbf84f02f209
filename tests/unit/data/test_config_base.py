"""collector.data.config, the base of every config block: types and JSON's numbers, ranges,
required keys, nested blocks under dotted keys, the one unknown-key rule, older spellings,
and errors that name the dotted key, what is allowed and what was given."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import pytest

from collector.data.config import ConfigBlock, ConfigError, ConfigWarning, derived, setting


@dataclass(kw_only=True)
class Leaf(ConfigBlock):
    SECTION: ClassVar[str] = "outer.leaf"
    ACCEPTED: ClassVar[frozenset[str]] = frozenset({"harmless"})
    ALIASES: ClassVar[dict[str, str]] = {"old_size": "size"}
    size: int = setting(4, ge=1)
    path: str | None = None


@dataclass(kw_only=True)
class Outer(ConfigBlock):
    SECTION: ClassVar[str] = "outer"
    enabled: bool = False
    rate: float = setting(0.5, gt=0, le=1)
    count: int = setting(1, ge=0, lt=100)
    mode: Literal["fast", "slow"] = "fast"
    level: int = setting(0, choices=(0, 1, 2))
    lrs: float | list[float] = setting(1e-3, ge=0)
    names: list[str] = field(default_factory=list)
    options: dict = field(default_factory=dict)
    leaf: Leaf = field(default_factory=Leaf)
    maybe: Leaf | None = None
    world: int = derived(1)

    def validate(self) -> None:
        if self.enabled and not self.names:
            self.fail("names", "must name something when enabled", self.names)


@dataclass(kw_only=True)
class Required(ConfigBlock):
    SECTION: ClassVar[str] = "req"
    total: int = setting(ge=1)
    other: float


def _error(build) -> str:
    with pytest.raises(ConfigError) as err:
        build()
    return str(err.value)


def test_defaults_and_types_as_declared():
    cfg = Outer.from_dict({})
    assert (cfg.enabled, cfg.rate, cfg.count, cfg.mode, cfg.lrs, cfg.names) == (False, 0.5, 1, "fast", 1e-3, [])
    assert cfg.leaf == Leaf() and cfg.maybe is None and cfg.world == 1
    assert Outer.from_dict(None) == cfg
    assert Outer() == cfg  # built directly: the same checks and defaults


@pytest.mark.parametrize(
    "given, message",
    [
        ({"enabled": "yes"}, "outer.enabled: must be true or false (got 'yes')"),
        ({"enabled": 1}, "outer.enabled: must be true or false (got 1)"),
        ({"count": True}, "outer.count: must be an integer (got True)"),  # a bool is not a number here
        ({"count": 2.5}, "outer.count: must be an integer (got 2.5)"),
        ({"count": "3"}, "outer.count: must be an integer (got '3')"),
        ({"rate": float("nan")}, "outer.rate: must be a finite number (got nan)"),
        ({"rate": "fast"}, "outer.rate: must be a finite number (got 'fast')"),
        ({"rate": 10**400}, f"outer.rate: must be a finite number (got {10**400})"),
        ({"mode": "medium"}, "outer.mode: must be one of 'fast', 'slow' (got 'medium')"),
        ({"names": ["a", 3]}, "outer.names: must be a list of strings (got ['a', 3])"),
        ({"names": "a"}, "outer.names: must be a list of strings (got 'a')"),
        ({"options": [1]}, "outer.options: must be an object (got [1])"),
        ({"lrs": "x"}, "outer.lrs: must be a finite number or a list of finite numbers (got 'x')"),
    ],
)
def test_a_value_of_the_wrong_type_names_key_allowed_and_given(given, message):
    assert _error(lambda: Outer.from_dict(given)) == message


def test_json_numbers_become_the_declared_type():
    cfg = Outer.from_dict({"count": 5e1, "rate": 1, "lrs": [0, 1e-3], "names": ("a", "b")})
    assert cfg.count == 50 and type(cfg.count) is int
    assert cfg.rate == 1.0 and type(cfg.rate) is float
    assert cfg.lrs == [0.0, 1e-3] and all(type(v) is float for v in cfg.lrs)
    assert cfg.names == ["a", "b"]


@pytest.mark.parametrize(
    "given, message",
    [
        ({"rate": 0}, "outer.rate: must be > 0 (got 0)"),
        ({"rate": 1.5}, "outer.rate: must be <= 1 (got 1.5)"),
        ({"count": -1}, "outer.count: must be >= 0 (got -1)"),
        ({"count": 100}, "outer.count: must be < 100 (got 100)"),
        ({"level": 3}, "outer.level: must be one of 0, 1, 2 (got 3)"),
        ({"lrs": -1}, "outer.lrs: must be >= 0 (got -1)"),
        ({"lrs": [0.1, -0.2]}, "outer.lrs: must be >= 0 (got [0.1, -0.2])"),  # every item of a list
    ],
)
def test_ranges_name_the_bound(given, message):
    assert _error(lambda: Outer.from_dict(given)) == message


def test_nested_blocks_are_checked_under_their_dotted_key():
    assert _error(lambda: Outer.from_dict({"leaf": {"size": 0}})) == "outer.leaf.size: must be >= 1 (got 0)"
    assert (
        _error(lambda: Outer.from_dict({"maybe": {"size": "big"}}))
        == "outer.maybe.size: must be an integer (got 'big')"
    )
    assert _error(lambda: Outer.from_dict({"leaf": 3})) == "outer.leaf: must be an object (got 3)"
    assert (
        _error(lambda: Outer.from_dict({"leaf": {"size": 0}}, key="run.outer"))
        == "run.outer.leaf.size: must be >= 1 (got 0)"
    )
    # Built directly, a block names itself by its SECTION.
    assert _error(lambda: Leaf(size=0)) == "outer.leaf.size: must be >= 1 (got 0)"


def test_missing_or_null_block_gets_its_defaults_unless_its_default_is_none():
    cfg = Outer.from_dict({"leaf": None, "maybe": None})
    assert cfg.leaf == Leaf() and cfg.maybe is None
    assert Outer.from_dict({"maybe": {"size": 2}}).maybe == Leaf(size=2)
    given = Leaf(size=7)
    assert Outer.from_dict({"leaf": given}).leaf is given  # a block already built is used as it is


def test_a_block_remembers_its_dotted_key_for_later_errors():
    cfg = Outer.from_dict({"leaf": {"size": 2}}, key="engine.outer")
    assert cfg.key() == "engine.outer" and cfg.leaf.key("size") == "engine.outer.leaf.size"
    assert (
        _error(lambda: cfg.leaf.fail("size", "has 2 values but 3 are needed", 2))
        == "engine.outer.leaf.size: has 2 values but 3 are needed (got 2)"
    )
    assert Outer().leaf.key() == "outer.leaf"


def test_unknown_keys_warn_once_per_block_by_dotted_path_and_accepted_keys_pass():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = Outer.from_dict({"enabld": True, "colour": 1, "leaf": {"sise": 3, "harmless": 1}, "count": 2})
    assert [str(w.message) for w in caught] == [
        "ignoring unknown config keys: outer.colour, outer.enabld (did you mean outer.enabled?)",
        "ignoring unknown config keys: outer.leaf.sise (did you mean outer.leaf.size?)",
    ]
    assert all(w.category is ConfigWarning and issubclass(w.category, UserWarning) for w in caught)
    assert cfg.count == 2 and not cfg.enabled and cfg.leaf.size == 4  # the rest still applies
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Leaf.from_dict({"harmless": "anything"})  # ACCEPTED: silent


def test_a_derived_value_comes_from_the_caller_never_from_the_config():
    with pytest.warns(ConfigWarning, match=r"outer\.world"):
        cfg = Outer.from_dict({"world": 8}, world=4)
    assert cfg.world == 4
    assert "world" not in cfg.to_dict()


def test_required_keys_are_named_when_missing():
    assert _error(lambda: Required.from_dict({})) == "req.total, req.other: required, not given"
    assert (
        _error(lambda: Required.from_dict({"other": 1.0}, key="scheduler.params"))
        == "scheduler.params.total: required, not given"
    )
    assert Required.from_dict({"total": 3, "other": 1}) == Required(total=3, other=1.0)


def test_older_spelling_maps_to_its_field_and_a_conflict_is_an_error():
    assert Leaf.from_dict({"old_size": 8}).size == 8
    assert Leaf.from_dict({"old_size": 8, "size": 8}).size == 8
    assert _error(lambda: Leaf.from_dict({"old_size": 8, "size": 2})) == (
        "outer.leaf.old_size and outer.leaf.size: the same setting given twice with different values (8 and 2); "
        "keep one"
    )
    assert _error(lambda: Leaf.from_dict({"old_size": 0})) == "outer.leaf.size: must be >= 1 (got 0)"


def test_cross_field_rules_run_after_the_types():
    assert (
        _error(lambda: Outer.from_dict({"enabled": True})) == "outer.names: must name something when enabled (got [])"
    )
    assert _error(lambda: Outer(enabled=True)) == "outer.names: must name something when enabled (got [])"


def test_not_an_object_at_all():
    assert _error(lambda: Outer.from_dict([1, 2])) == "outer: must be an object (got [1, 2])"
    assert _error(lambda: Outer.from_dict("x", key="")) == "config: must be an object (got 'x')"


def test_to_dict_round_trips():
    cfg = Outer.from_dict({"count": 3, "names": ["a"], "leaf": {"size": 2, "path": "/x"}, "maybe": {}})
    again = Outer.from_dict(cfg.to_dict())
    assert again == cfg
    assert cfg.to_dict()["leaf"] == {"size": 2, "path": "/x"}
