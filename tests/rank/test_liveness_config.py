"""hang_after_s and heartbeat_s: the argument, then the environment, then the config block;
bad values are refused naming the key or the variable. And the in-flight mark: a collective is
known from the moment it is entered, and leaves flight when it returns or raises."""

from __future__ import annotations

import pytest
import torch

from collector.data.config import ConfigError
from collector.rank import session
from collector.rank.recorder import REC, SLOT_OP, SLOT_SEQ
from collector.rank.session import TelemetryConfig, _seconds


def test_hang_after_s_resolves_argument_then_environment_then_config(monkeypatch):
    cfg = TelemetryConfig.from_dict({"hang_after_s": 30, "heartbeat_s": 2})
    assert (cfg.hang_after_s, cfg.heartbeat_s) == (30.0, 2.0)
    assert TelemetryConfig.from_dict(None).hang_after_s == 60.0
    monkeypatch.delenv("RANKSCOPE_HANG_AFTER_S", raising=False)
    assert _seconds("hang_after_s", None, "RANKSCOPE_HANG_AFTER_S", cfg.hang_after_s) == 30.0
    monkeypatch.setenv("RANKSCOPE_HANG_AFTER_S", "5")
    assert _seconds("hang_after_s", None, "RANKSCOPE_HANG_AFTER_S", cfg.hang_after_s) == 5.0
    assert _seconds("hang_after_s", 2, "RANKSCOPE_HANG_AFTER_S", cfg.hang_after_s) == 2.0


def test_bad_values_name_the_key_or_variable(monkeypatch):
    with pytest.raises(ConfigError, match=r"telemetry\.hang_after_s"):
        TelemetryConfig.from_dict({"hang_after_s": 0})
    with pytest.raises(ConfigError, match=r"telemetry\.heartbeat_s"):
        TelemetryConfig.from_dict({"heartbeat_s": 600})
    monkeypatch.setenv("RANKSCOPE_HANG_AFTER_S", "soon")
    with pytest.raises(ConfigError, match="RANKSCOPE_HANG_AFTER_S: must be a number of seconds"):
        _seconds("hang_after_s", None, "RANKSCOPE_HANG_AFTER_S", 60.0)
    with pytest.raises(ConfigError, match="hang_after_s: must be a positive number"):
        _seconds("hang_after_s", -1, "RANKSCOPE_HANG_AFTER_S", 60.0)
    with pytest.raises(ValueError, match="RANKSCOPE_HANG_AFTER_S"):
        session.start(run="bad-env", endpoint="127.0.0.1:1")


def test_a_collective_is_in_flight_from_entry_and_leaves_when_it_returns_or_raises():
    seen = []

    def real(tensor, op=None, group=None, async_op=False):
        seen.extend((slot[SLOT_OP], slot[SLOT_SEQ]) for slot in REC.inflight.values())
        if tensor.numel() == 0:
            raise RuntimeError("backend says no")

    class Group:  # stands in for the world group: only its cache entry is read
        pass

    from collector.rank import recorder

    g = Group()
    REC.groups[g] = recorder._Group("world", 1, "0")
    try:
        slot = REC.enter("all_reduce", g, torch.float32, 4, 1)
        real(torch.ones(4))
        assert id(slot) in REC.inflight and seen == [("all_reduce", slot[SLOT_SEQ])]
        REC.complete(slot, None, None, None)
        assert id(slot) not in REC.inflight
        slot = REC.enter("all_reduce", g, torch.float32, 0, 1)
        with pytest.raises(RuntimeError):
            try:
                real(torch.ones(0))
            except BaseException:
                REC.abandon(slot)
                raise
        assert id(slot) not in REC.inflight and REC.abandoned[-1] is slot
    finally:
        REC.groups.pop(g, None)
        REC.pending.clear()
        REC.abandoned.clear()
