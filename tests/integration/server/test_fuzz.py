"""10,000+ malformed and hostile frames at a live collector: each one is answered
with a clear status (undecodable input is INVALID_ARGUMENT, never INTERNAL or
UNKNOWN), the collector keeps serving, and a well-behaved stream running
alongside loses nothing (counted in DuckDB afterwards)."""

from __future__ import annotations

import asyncio
import collections
import random
import threading
import time

import grpc
import pytest
from google.protobuf.message import DecodeError

from collector.data import catalog
from collector.data.layout import COLLECTOR_TABLES, RUN_ID_RE, SHARED_PARTITION, stored_schemas
from collector.server.compaction import CompactionConfig
from collector.testing.collectors import live_collector
from collector.testing.fake_runs import comm_envelope, hello, run_end
from collector.testing.streams import RawStream
from proto import pb, pb_grpc
from tests.integration.server._fuzz_util import hostile

HOSTILE_FRAMES = 10_000
HEALTH_FRAMES = 500
CONCURRENT_STREAMS = 6  # hostile streams open at once
GOOD_ENVELOPES, GOOD_ROWS = 150, 100
STREAM_METHOD = "/rankscope.v1.Collector/Stream"
HEALTH_METHOD = "/rankscope.v1.Collector/Health"
NEVER = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}


@pytest.fixture
def collector(tmp_path):
    # compaction every 0.5 s: hostile input must not break merges running alongside
    with live_collector(
        tmp_path / "data", compaction_config=CompactionConfig(interval=0.5, min_files=4), grace_s=0
    ) as live:
        yield live.port, live.state


def _decodes(raw: bytes) -> pb.Envelope | None:
    try:
        return pb.Envelope.FromString(raw)
    except DecodeError:
        return None


def _send_each(port: int, frames: list[bytes]) -> list[tuple[grpc.StatusCode, str]]:
    """Each frame on its own stream, then half-close; the status the collector ends each with.
    CONCURRENT_STREAMS at once, from one asyncio client: the sync client starts a thread per
    stream to feed its request iterator (10,000 threads was most of this test's time)."""

    async def send_all() -> list[tuple[grpc.StatusCode, str]]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stream_call = channel.stream_stream(STREAM_METHOD, request_serializer=None, response_deserializer=None)
            open_streams = asyncio.Semaphore(CONCURRENT_STREAMS)

            async def send_one(raw: bytes) -> tuple[grpc.StatusCode, str]:
                async with open_streams:
                    try:
                        async for _ in stream_call(iter([raw]), timeout=30):
                            pass
                        return grpc.StatusCode.OK, ""
                    except grpc.RpcError as exc:
                        return exc.code(), exc.details() or ""

            return await asyncio.gather(*(send_one(raw) for raw in frames))

    return asyncio.run(send_all())


def test_hostile_frames_get_clear_statuses_and_a_good_stream_loses_nothing(collector, tmp_path):
    port, _state = collector
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")

    # The well-behaved rank, sending steadily while the fuzzing goes on.
    good = RawStream(channel)
    good_done = threading.Event()

    def pump():
        good.send(hello("good", 1, "goodrun", 0, 1))
        for seq in range(2, GOOD_ENVELOPES + 2):
            good.send(comm_envelope("good", seq, "goodrun", 0, (seq - 2) * GOOD_ROWS, GOOD_ROWS))
            time.sleep(0.02)
        good.send(run_end("good", GOOD_ENVELOPES + 2, "goodrun", 0))
        good_done.set()

    pumper = threading.Thread(target=pump, daemon=True)
    pumper.start()

    rng = random.Random(20261122)
    cases = list(hostile(rng, HOSTILE_FRAMES))
    answers = _send_each(port, [raw for _kind, raw in cases])

    bad_answers = []
    by_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for (kind, raw), (code, details) in zip(cases, answers):
        by_kind[kind][code.name] += 1
        env = _decodes(raw)
        if env is None:
            ok = code == grpc.StatusCode.INVALID_ARGUMENT and "decode" in details.lower()
        elif env.schema_version != 1:
            ok = code == grpc.StatusCode.FAILED_PRECONDITION and "schema_version" in details
        else:  # decodable: refused with a message naming the seq, or (harmless) accepted
            ok = (
                code == grpc.StatusCode.INVALID_ARGUMENT and f"seq {env.seq}" in details
            ) or code == grpc.StatusCode.OK
        if not ok or code in NEVER:
            bad_answers.append((kind, raw[:80], code.name, details))
    assert not bad_answers, f"{len(bad_answers)} unclear answers, first: {bad_answers[:5]}"
    refused = sum(n for counts in by_kind.values() for c, n in counts.items() if c != "OK")
    # These kinds are never valid; the others (bit flips, path-like client ids, odd but legal
    # numbers) are sometimes harmless and stored under run 'fuzzrun', which is checked below.
    for kind in ("random_bytes", "truncated", "wrong_version", "huge_rows", "bad_utf8", "empty_body"):
        assert by_kind[kind]["OK"] == 0, (kind, by_kind[kind])
    assert refused >= 0.75 * HOSTILE_FRAMES, dict(by_kind)

    # Raw frames at Health too: an empty or stray-field request is fine, garbage is INVALID_ARGUMENT.
    health_call = channel.unary_unary(HEALTH_METHOD, request_serializer=None, response_deserializer=None)
    for _i in range(HEALTH_FRAMES):
        raw = rng.randbytes(rng.choice([1, 3, 16, 200]))
        try:
            health_call(raw, timeout=10)
            code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            code = exc.code()
        try:
            pb.HealthRequest.FromString(raw)
            expected = grpc.StatusCode.OK
        except DecodeError:
            expected = grpc.StatusCode.INVALID_ARGUMENT
        assert code == expected, (raw, code)

    assert good_done.wait(60), "the good stream's sender stalled"
    good.finish(timeout=30)
    assert good.error is None, good.error
    assert good.acked == set(range(1, GOOD_ENVELOPES + 3))

    health = pb_grpc.CollectorStub(channel).Health(pb.HealthRequest(), timeout=10)
    assert health.batches_rejected >= refused * 0.9  # counted, and the collector still answers
    channel.close()
    con = catalog.connect(tmp_path / "data")
    total, distinct = con.execute("SELECT count(*), count(DISTINCT seq) FROM comm WHERE run_id = 'goodrun'").fetchone()
    assert total == distinct == GOOD_ENVELOPES * GOOD_ROWS
    assert con.execute("SELECT status FROM runs WHERE run_id = 'goodrun'").fetchone() == ("finished",)
    # Nothing a hostile frame named escaped the data dir or made a partition out of a path:
    # every directory is parquet/<known table>/run=<id from the safe alphabet> (or the collector
    # tables' shared run=@all, which compaction folds their per-run rows into).
    parquet = tmp_path / "data" / "parquet"
    for path in parquet.rglob("*"):
        rel = path.relative_to(parquet).parts
        assert rel[0] in stored_schemas(), path
        if len(rel) >= 2:
            shared = rel[1] == SHARED_PARTITION and rel[0] in COLLECTOR_TABLES
            named = rel[1].startswith("run=") and RUN_ID_RE.match(rel[1][4:])
            assert shared or rel[1] == "run=@schema" or named, path
        assert len(rel) <= 3, path
    assert {p.name for p in tmp_path.iterdir()} <= {"data", "spool"}
