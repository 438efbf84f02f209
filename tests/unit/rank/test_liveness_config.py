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


def test_the_generated_wrapper_marks_and_records_exactly_as_enter_and_complete(monkeypatch):
    """The wrappers inline enter/complete for speed: same in-flight slot during the call, same
    record after it, abandoned when the call raises, and the async case still left in flight."""
    import torch.distributed.distributed_c10d as c10d

    from collector.rank import recorder, state
    from collector.rank.ops import SPECS, instrument

    seen = []

    def real(tensor, op=None, group=None, async_op=False):
        seen.extend(fields(slot) for slot in REC.inflight.values())
        if tensor.numel() == 0:
            raise RuntimeError("backend says no")
        return "work" if async_op else None

    class Group:
        pass

    g = Group()
    REC.groups[g] = recorder._Group("g[0-3]", 4, "0-3")
    monkeypatch.setattr(c10d, "all_reduce", real)
    wrapper = instrument(SPECS["all_reduce"])
    monkeypatch.setattr(c10d, "all_reduce", c10d.all_reduce)
    monkeypatch.setattr(REC, "on", True)
    monkeypatch.setattr(state, "step", 7)

    def fields(record):  # a record's slots by their index names, as they are now
        return dict(enumerate(record))

    def without_times(values, leave_out=()):
        times = (recorder.SLOT_T0, recorder.SLOT_T1, recorder.SLOT_SINCE)
        return {k: v for k, v in values.items() if k not in (*times, *leave_out)}

    try:
        REC.pending.clear()
        entered = REC.enter("all_reduce", g, torch.float32, 4, 1)
        REC.complete(entered, "mine", None, None)
        reference = fields(entered)
        assert wrapper(torch.ones(4), group=g, log_name="mine") is None
        assert len(seen) == 1 and not REC.inflight
        during, record = seen[0], fields(REC.pending[-1])
        since, t0, t1, seq = recorder.SLOT_SINCE, recorder.SLOT_T0, recorder.SLOT_T1, recorder.SLOT_SEQ
        assert during[since] == during[t0] > 0 and during[t1] == 0
        assert record[t0] == during[t0] and record[seq] == reference[seq] + 1
        reference[seq] += 1  # the next collective of the group
        assert without_times(record) == without_times(reference) and without_times(
            during, leave_out=(SLOT_OP,)
        ) == without_times({**reference, recorder.SLOT_NAME: None, t1: 0}, leave_out=(SLOT_OP,))
        assert record[t1] >= record[t0] and record[recorder.SLOT_STEP] == 7

        with pytest.raises(RuntimeError):
            wrapper(torch.ones(0), group=g)
        assert not REC.inflight and REC.abandoned[-1][SLOT_OP] == "all_reduce"

        work = wrapper(torch.ones(4), group=g, async_op=True)
        # an async op leaves flight when its end is known; a Work without a future is timed at wait()
        assert isinstance(work, recorder._WaitTimedWork) and len(REC.inflight) == 1
        slot = next(iter(REC.inflight.values()))
        assert slot[recorder.SLOT_ASYNC] and slot[recorder.SLOT_KEY] == id(slot) and slot is REC.pending[-1]
        assert slot[recorder.SLOT_SINCE] == 0  # not waiting until the caller waits
    finally:
        REC.groups.pop(g, None)
        REC.inflight.clear()
        REC.pending.clear()
        REC.abandoned.clear()
