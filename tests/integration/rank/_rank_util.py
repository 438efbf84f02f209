"""Helpers for the rank-side tests: a small in-test collector built from the
generated gRPC stubs (a real server on a real port; it stands in for
collector.server, which is not what these tests test), and gloo ranks spawned
with a free master port."""

from __future__ import annotations

import json
import threading
import time
from concurrent import futures

import grpc

from collector.data.codec import decode_batch
from proto import SCHEMA_VERSION, pb, pb_grpc


class RecordingCollector(pb_grpc.CollectorServicer):
    """Acks every envelope at once and keeps them (deduped by client_id, seq).

    Knobs for failure tests: ``reject_tables`` aborts a stream with
    INVALID_ARGUMENT naming the seq of the first batch of such a table;
    ``drop_after`` aborts the stream (UNAVAILABLE) after that many envelopes
    without acking the last one; ``token`` requires the bearer token."""

    def __init__(self, token: str | None = None) -> None:
        self.lock = threading.Lock()
        self.received: list[pb.Envelope] = []  # every arrival, duplicates included
        self.durable: dict[tuple[str, int], pb.Envelope] = {}
        self.reject_tables: set[str] = set()
        self.drop_after: int | None = None
        self.token = token
        self.streams = 0

    def Stream(self, request_iterator, context):
        if self.token and ("authorization", f"Bearer {self.token}") not in context.invocation_metadata():
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        with self.lock:
            self.streams += 1
        for env in request_iterator:
            with self.lock:
                self.received.append(env)
                if env.schema_version != SCHEMA_VERSION:
                    context.abort(grpc.StatusCode.FAILED_PRECONDITION, "schema version")
                if env.HasField("table") and env.table.table in self.reject_tables:
                    self.reject_tables.discard(env.table.table)
                    context.set_trailing_metadata((("rankscope-rejected-seq", str(env.seq)),))
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad batch seq={env.seq}")
                if self.drop_after is not None and len(self.received) >= self.drop_after:
                    self.drop_after = None
                    context.abort(grpc.StatusCode.UNAVAILABLE, "simulated collector restart")
                self.durable.setdefault((env.client_id, env.seq), env)
            yield pb.Ack(seqs=[env.seq])

    def Health(self, request, context):
        return pb.HealthReply(schema_version=SCHEMA_VERSION)

    # ---- what tests read ----
    def envelopes(self, kind: str | None = None) -> list[pb.Envelope]:
        with self.lock:
            envs = sorted(self.durable.values(), key=lambda e: (e.client_id, e.seq))
        return [e for e in envs if kind is None or e.WhichOneof("body") == kind]

    def rows(self, table: str):
        """All durable rows of ``table`` as one pyarrow table (with run_id)."""
        import pyarrow as pa

        parts = []
        for env in self.envelopes("table"):
            if env.table.table == table:
                t = decode_batch(env.table)
                parts.append(t.append_column("run_id", pa.array([env.table.run_id] * t.num_rows, pa.string())))
        return pa.concat_tables(parts) if parts else None

    def wait_for(self, predicate, timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.02)
        return predicate()


def serve(port: int = 0, token: str | None = None):
    """(grpc server, port, servicer) listening on 127.0.0.1."""
    servicer = RecordingCollector(token=token)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_CollectorServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, port, servicer


def spawn(fn, nprocs: int, endpoint: str, out) -> list[dict]:
    """Run ``fn(rank, master_port, endpoint, out)`` on ``nprocs`` gloo ranks; each
    rank writes ``out/rank<r>.json``, returned in rank order."""
    from collector.testing.gloo import run_ranks

    run_ranks(fn, nprocs, endpoint, str(out))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nprocs)]
