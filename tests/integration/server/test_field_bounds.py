"""Every numeric field of every message at its boundary values (0, -1, 2^31, 2^63-1, 2^63,
2^64-1, where the field's type can hold them) and batches whose declared rows do not match
their columns, at a live collector: the answer is OK (the value is legal) or INVALID_ARGUMENT /
FAILED_PRECONDITION naming the field, never INTERNAL; nothing is stored from a refused message;
and the collector keeps serving a well-behaved stream afterwards."""

from __future__ import annotations

import itertools

import grpc
import pytest

from collector.data import catalog, codec
from collector.testing.collectors import live_collector
from collector.testing.fake_runs import comm_envelope, hello, run_end
from proto import pb

BOUNDARIES = [0, -1, 2**31, 2**63 - 1, 2**63, 2**64 - 1]
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}
STREAM_METHOD = "/rankscope.v1.Collector/Stream"
# (message, field) -> the values it may legally take; anything else must be refused
LEGAL = {
    ("envelope", "schema_version"): lambda v: v == 1,
    ("envelope", "seq"): lambda v: 1 <= v <= codec.INT64_MAX,
    ("hello", "rank"): lambda v: v == 0,  # world_size 1 below
    ("hello", "world_size"): lambda v: 1 <= v <= codec.MAX_WORLD_SIZE,
    ("hello", "pid"): lambda v: v >= 0,
    ("hello", "started_at_ns"): lambda v: v >= 0,
    ("hello", "clock_offset_ns"): lambda v: True,
    ("table", "rank"): lambda v: v >= 0,
    ("table", "rows"): lambda v: v == 3,  # the batch carries 3 rows
    ("end", "rank"): lambda v: v >= 0,
    ("end", "ended_at_ns"): lambda v: v >= 0,
    ("end", "dropped_records"): lambda v: 0 <= v <= codec.INT64_MAX,
}
_counter = itertools.count()


def _envelope(part: str, run_id: str) -> pb.Envelope:
    cid = f"bounds-{next(_counter)}"
    if part == "table":
        return comm_envelope(cid, 1, run_id, 0, 0, 3)
    if part == "end":
        return run_end(cid, 1, run_id, 0)
    return hello(cid, 1, run_id, 0, 1, pid=1)


def _cases():
    for (part, field), legal in LEGAL.items():
        for value in BOUNDARIES:
            run_id = f"fz-{part}-{field}-{BOUNDARIES.index(value)}".replace("_", "-")
            env = _envelope("hello" if part == "envelope" else part, run_id)
            target = env if part == "envelope" else getattr(env, part)
            try:
                setattr(target, field, value)
            except ValueError:  # the protobuf type cannot hold it: nothing to send
                continue
            yield pytest.param(part, field, value, legal(value), run_id, env, id=f"{part}.{field}={value}")


def _send(channel, envelopes) -> tuple[grpc.StatusCode, str]:
    call = channel.stream_stream(
        STREAM_METHOD, request_serializer=pb.Envelope.SerializeToString, response_deserializer=pb.Ack.FromString
    )
    try:
        for _ in call(iter(envelopes), timeout=30):
            pass
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""


@pytest.fixture(scope="module")
def collector(tmp_path_factory):
    with live_collector(tmp_path_factory.mktemp("bounds") / "data", grace_s=0) as live:
        with grpc.insecure_channel(live.endpoint) as channel:
            yield live, channel


def _stored_rows(data_dir, run_id: str) -> int:
    con = catalog.connect(data_dir)
    try:
        return sum(
            con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", [run_id]).fetchone()[0]
            for table in ("comm", "_runs_raw", "_ranks_raw", "_rank_ends_raw")
        )
    finally:
        con.close()


@pytest.mark.parametrize("part, field, value, legal, run_id, env", list(_cases()))
def test_boundary_values_are_refused_by_name_or_stored(collector, part, field, value, legal, run_id, env):
    live, channel = collector
    code, details = _send(channel, [env])
    if legal:
        assert code == grpc.StatusCode.OK, details
        assert _stored_rows(live.data_dir, run_id) > 0
        return
    assert code in REFUSALS, (code, details)
    assert field in details, details
    assert _stored_rows(live.data_dir, run_id) == 0


@pytest.mark.parametrize("declared", [0, 1, 2, 3, 4, 1_000_000, 2**32 - 1])
@pytest.mark.parametrize("columns", ["all", "none", "no step"])
def test_a_batch_must_carry_the_rows_it_declares(collector, declared, columns):
    live, channel = collector
    run_id = f"rows-{declared}-{columns.replace(' ', '-')}"
    env = comm_envelope(f"rows-{next(_counter)}", 1, run_id, 0, 0, 3)
    if columns == "none":
        del env.table.columns[:]
    elif columns == "no step":
        keep = [c for c in env.table.columns if c.name != "step"]
        del env.table.columns[:]
        env.table.columns.extend(keep)
    env.table.rows = declared
    code, details = _send(channel, [env])
    if (declared == 0 and columns == "none") or (declared == 3 and columns != "none"):
        assert code == grpc.StatusCode.OK, details  # an empty batch is legal and stores nothing
    else:
        assert code in REFUSALS, (columns, declared, code, details)
        assert "rows" in details, details
    assert _stored_rows(live.data_dir, run_id) == (3 if columns != "none" and declared == 3 else 0)


def test_the_collector_keeps_serving_after_the_boundary_values(collector):
    live, channel = collector
    run_id = "bounds-after"
    code, details = _send(channel, [hello("after", 1, run_id, 0, 1), comm_envelope("after", 2, run_id, 0, 0, 5)])
    assert code == grpc.StatusCode.OK, details
    con = catalog.connect(live.data_dir)
    try:
        assert con.execute("SELECT count(*) FROM comm WHERE run_id = ?", [run_id]).fetchone()[0] == 5
    finally:
        con.close()
