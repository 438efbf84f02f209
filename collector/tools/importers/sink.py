"""Delivering imported rows: as Envelopes, into a data dir or through a live collector.

Everything import, watch and replay write goes the way a rank's records go:
per (run, rank) one client with a Hello, TableBatches and a RunEnd, numbered
1, 2, 3... So the collector's dedupe applies: with a client_id derived from the
input (``client_id(...)``), sending the same input twice -- a watcher restarted
between the commit and its own ledger write -- stores it once.

- ``StoreSink(D)`` writes into data dir D through the collector's Store (the
  same ledger and segments as a running collector); it fails with ``DataDirBusy``
  if a collector holds D, whose users should pass ``--endpoint`` instead.
- ``GrpcSink(endpoint, token)`` streams to a collector and returns once every
  envelope is acknowledged, i.e. durable. Streams may be paced generators (replay).
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from collector.data import catalog, layout, security
from collector.data.codec import CodecError, encode_batch, envelope_rows
from collector.data.schema import TABLES
from collector.tools.importers.base import Parsed
from proto import SCHEMA_VERSION, pb, pb_grpc

BATCH_ROWS = 50_000


def client_id(*parts: str) -> str:
    return "import-" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def table_batches(table: str, run_id: str, rank: int, rows: pa.Table) -> Iterator[pb.TableBatch]:
    """TableBatches for ``rows`` (stored schema), in order. The wire has no nulls: a
    column left out is stored as NULL, so rows are cut into runs of consecutive rows
    with the same NULL columns and each run omits its NULL columns."""
    present = set(rows.column_names)
    names = [n for n in TABLES[table].arrow_schema().names[1:] if n in present]
    if rows.num_rows == 0:
        return
    pattern = np.zeros(rows.num_rows, dtype=np.int64)
    for bit, name in enumerate(names):
        nulls = rows[name].null_count
        if nulls == rows.num_rows:  # most columns are all or nothing: no per-row pass for those
            pattern |= 1 << bit
        elif nulls:
            pattern |= pc.is_null(rows[name]).to_numpy(zero_copy_only=False).astype(np.int64) << bit
    cuts = np.flatnonzero(np.diff(pattern)) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [rows.num_rows]])
    for start, end in zip(starts.tolist(), ends.tolist()):
        present = [n for bit, n in enumerate(names) if not (int(pattern[start]) >> bit) & 1]
        for lo in range(start, end, BATCH_ROWS):
            part = rows.slice(lo, min(end, lo + BATCH_ROWS) - lo)
            columns = {}
            for name in present:
                col = part[name]
                columns[name] = col.to_pylist() if pa.types.is_string(col.type) else col.to_numpy(zero_copy_only=False)
            yield encode_batch(table, run_id, rank, columns)


def envelope(client: str, seq: int, **body) -> pb.Envelope:
    return pb.Envelope(schema_version=SCHEMA_VERSION, client_id=client, seq=seq, **body)


def rank_envelopes(
    parsed: Parsed,
    *,
    run_id: str,
    run_name: str,
    rank: int,
    world_size: int,
    client: str,
    source: str,
    started_ns: int,
    ended_ns: int,
    linked_run_id: str = "",
    config_json: str = "",
    with_end: bool = True,
) -> list[pb.Envelope]:
    """Hello, the rank's rows of every table, RunEnd(finished) unless ``with_end`` is False."""
    hello = pb.Hello(
        run_id=run_id,
        run_name=run_name,
        rank=rank,
        world_size=world_size,
        host=socket.gethostname(),
        pid=os.getpid(),
        started_at_ns=started_ns,
        source=source,
        linked_run_id=linked_run_id,
        config_json=config_json,
    )
    out = [envelope(client, 1, hello=hello)]
    for table in TABLES:
        if (table, rank) in parsed.rows:
            for batch in table_batches(table, run_id, rank, parsed.arrow(table, rank)):
                out.append(envelope(client, len(out) + 1, table=batch))
    if with_end:
        end = pb.RunEnd(run_id=run_id, rank=rank, status="finished", ended_at_ns=ended_ns)
        out.append(envelope(client, len(out) + 1, end=end))
    return out


def time_range_ns(parsed: Parsed, default_ns: int) -> tuple[int, int]:
    stamps = [
        row[c]
        for (table, _), rows in parsed.rows.items()
        for row in rows
        for c in ("start_ns", "end_ns", "time_ns")
        if row.get(c) is not None
    ]
    return (min(stamps), max(stamps)) if stamps else (default_ns, default_ns)


def run_envelopes(
    parsed: Parsed,
    *,
    run_id: str,
    run_name: str,
    source: str,
    client_key: str,
    default_ns: int | None = None,
    with_end: bool = True,
    only_ranks_with_rows: bool = False,
) -> list[list[pb.Envelope]]:
    """One envelope list (one client) per rank 0..world_size-1; ranks with no rows still
    say Hello and RunEnd, so the run is 'finished' once imported."""
    world = max([parsed.world_size or 0, *(r + 1 for r in parsed.ranks), 1])
    start, end = time_range_ns(parsed, default_ns or time.time_ns())
    return [
        rank_envelopes(
            parsed,
            run_id=run_id,
            run_name=run_name,
            rank=rank,
            world_size=world,
            client=client_id(client_key, run_id, str(rank)),
            source=source,
            started_ns=start,
            ended_ns=end,
            with_end=with_end,
        )
        for rank in range(world)
        if not only_ranks_with_rows or rank in parsed.ranks
    ]


class SinkError(RuntimeError):
    """Delivery failed; the message says where and why."""


class _Sink:
    """A sink is used in a ``with`` block: leaving it closes the sink."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class StoreSink(_Sink):
    def __init__(self, data_dir):
        from collector.server.store import Store, StoreConfig  # the server side: no grpc server needed here

        self.data_dir = data_dir
        # An import may start a data dir (a new or empty folder), never turn some other folder into one.
        folder = Path(data_dir)
        if folder.is_dir() and any(folder.iterdir()) and not layout.is_data_dir(folder):
            raise SinkError(
                f"{str(folder)!r} is not a rankscope data dir and not empty; "
                "give --data-dir a new folder or an existing data dir"
            )
        catalog.ensure_catalog(data_dir)
        # an import's rows come all at once and nobody reads them before send() returns: committed when
        # send() flushes (or past flush_bytes), not every 0.25 s as a live collector's are -- a 1,024-rank
        # Flight Recorder import made 12 commits of 4 small segments each, each with its fsyncs, to be
        # read back as 12 files a table
        self.store = Store(data_dir, StoreConfig(flush_interval=5.0))

    def send(self, streams: Iterable[Iterable[pb.Envelope]]) -> int:
        errors: list[BaseException] = []
        sent = 0
        for stream in streams:
            for env in stream:
                try:
                    rows = envelope_rows(env)
                except CodecError as exc:  # what the collector would refuse; the message says why
                    raise SinkError(str(exc)) from None
                self.store.submit(env.client_id, env.seq, rows, lambda e: e and errors.append(e))
                sent += 1
        self.store.flush()
        if errors:
            raise SinkError(f"writing to {self.data_dir} failed: {errors[0]}")
        return sent

    def close(self) -> None:
        self.store.close()


class GrpcSink(_Sink):
    def __init__(self, endpoint: str, token: str | None = None, timeout_s: float = 120.0, tls_ca: str | None = None):
        """Through the collector at ``endpoint``; ``token`` and ``tls_ca`` default to
        $RANKSCOPE_TOKEN and $RANKSCOPE_TLS_CA, as for a rank's client."""
        self.endpoint = endpoint
        self.metadata = security.auth_metadata(security.resolve_token(token))
        self.timeout_s = timeout_s
        try:
            self.channel = security.open_channel(endpoint, tls_ca=security.resolve_tls_ca(tls_ca))
        except security.SecurityConfigError as exc:
            raise SinkError(str(exc)) from None
        try:
            grpc.channel_ready_future(self.channel).result(timeout=10)
        except grpc.FutureTimeoutError:
            self.channel.close()
            raise SinkError(f"no collector answers at {endpoint}") from None

    def _one_stream(self, stream: Iterable[pb.Envelope], errors: list) -> int:
        stub = pb_grpc.CollectorStub(self.channel)
        lock = threading.Condition()
        unacked: set[int] = set()
        state = {"sent_all": False}

        def requests():
            for env in stream:
                with lock:
                    unacked.add(env.seq)
                yield env
            with lock:
                state["sent_all"] = True
                # Keep the stream open until everything is durable: the acks come back on it.
                deadline = time.monotonic() + self.timeout_s
                while unacked and time.monotonic() < deadline:
                    lock.wait(0.1)

        count = 0
        try:
            for ack in stub.Stream(requests(), metadata=self.metadata):
                with lock:
                    unacked.difference_update(ack.seqs)
                    count += len(ack.seqs)
                    lock.notify_all()
                    if state["sent_all"] and not unacked:
                        break
        except grpc.RpcError as exc:
            errors.append(SinkError(f"collector at {self.endpoint}: {exc.code().name}: {exc.details()}"))
        with lock:
            if unacked and not errors:
                errors.append(SinkError(f"{len(unacked)} envelopes were not acknowledged by {self.endpoint}"))
        return count

    def send(self, streams: Iterable[Iterable[pb.Envelope]]) -> int:
        """Send the streams concurrently (one per rank, as ranks do); block until acked."""
        errors: list[BaseException] = []
        counts: list[int] = []
        threads = [
            threading.Thread(target=lambda s=s: counts.append(self._one_stream(s, errors)), daemon=True)
            for s in streams
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return sum(counts)

    def close(self) -> None:
        self.channel.close()
