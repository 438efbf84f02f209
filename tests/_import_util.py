"""Helpers for the import / replay / export / watch tests: the DeepSpeed fixture,
a live collector on a real port, and catalog queries."""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import numpy as np

from collector.data import catalog
from collector.tools.cli import main as cli_main
from collector.data.codec import encode_batch
from collector.tools.importers.sink import GrpcSink, envelope
from collector.server.service import create_server
from collector.server.store import StoreConfig
from proto import pb

FIXTURE = Path(__file__).parent / "fixtures" / "deepspeed_run"


def copy_fixture(dest: Path) -> Path:
    shutil.copytree(FIXTURE, dest)
    return dest


def rankscope(*args) -> int:
    """Run the CLI in-process (what `rankscope ...` runs)."""
    return cli_main([str(a) for a in args])


def query(data_dir, sql: str, params=()) -> list[tuple]:
    con = catalog.connect(data_dir)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def only_run(data_dir, source: str | None = None) -> str:
    rows = query(data_dir, "SELECT run_id FROM runs WHERE ? IS NULL OR source = ?", [source, source])
    assert len(rows) == 1, rows
    return rows[0][0]


@contextlib.contextmanager
def live_collector(data_dir, port: int, token: str | None = None, tls=None):
    """A real collector on 127.0.0.1:port over data_dir (with a token / collector.data.security.ServerTLS
    when given); yields its endpoint."""
    server, bound, state = create_server(f"127.0.0.1:{port}", data_dir, token, tls=tls,
                                         store_config=StoreConfig(flush_interval=0.05))
    server.start()
    try:
        yield f"127.0.0.1:{bound}"
    finally:
        server.stop(grace=2).wait()
        state.close()


T0 = 1_790_000_000_000_000_000  # unix ns of the synthetic run's first record


def synthetic_rank(run_id: str, rank: int, world: int) -> list[pb.Envelope]:
    """One rank of a run streamed as a rank would: ~1.5 s of rows in every table, comm on two
    groups (world, tp0), some NULLs; flops and moe have no times. Run name 'src'."""
    client = f"test-{run_id}-{rank}"
    n = 300
    k = np.arange(n, dtype=np.int64)
    start = T0 + k * 5_000_000 + rank * 1000
    envs = [envelope(client, 1, hello=pb.Hello(run_id=run_id, run_name="src", rank=rank, world_size=world,
                                               host=f"node{rank}", pid=100 + rank, clock_offset_ns=7 * rank,
                                               started_at_ns=T0 - 1, source="engine", config_json='{"x": 1}'))]
    batches = [
        ("comm", dict(step=k // 10, group_name=["world", "world", "tp0"] * (n // 3),
                      group_size=np.full(n, world), seq=k,
                      op=["all_reduce", "all_gather"] * (n // 2), log_name=["grads"] * n, dtype=["float32"] * n,
                      numel=k + 1, bytes=(k + 1) * 4, start_ns=start, end_ns=start + 2000 + k,
                      async_op=(k % 3 == 0), algbw_gbs=k * 0.5, busbw_gbs=k * 0.75, peer=np.full(n, -1))),
        # a second comm batch with columns left out: stored as NULLs, must replay as NULLs
        ("comm", dict(step=k[:10], op=["barrier"] * 10, start_ns=start[:10] + 1, end_ns=start[:10] + 9,
                      bytes=np.zeros(10, dtype=np.int64))),
        ("timers", dict(step=k // 10, name=["fwd", "bwd"] * (n // 2), start_ns=start, dur_ns=k * 10)),
        ("monitor", dict(step=k[:30], tag=["loss"] * 30, value=np.linspace(2, 1, 30), samples=k[:30] * 8,
                         time_ns=start[:30])),
        ("loss_scale", dict(step=k[:30], scale=np.full(30, 65536.0), overflow=k[:30] % 7 == 0,
                            time_ns=start[:30])),
        ("flops", dict(step=np.full(3, 5), module=["", "0", "1"], parent=["", "", ""], depth=[0, 1, 1],
                       module_type=["Sequential", "Linear", "ReLU"], params=[10, 8, 0], macs=[40, 40, 0],
                       flops=[90, 80, 10], latency_ns=[1000, 600, 300])),
        ("memory", dict(step=k[:20], kind=["params", "rss"] * 10, bytes=k[:20] * 1024, time_ns=start[:20])),
        ("moe", dict(step=k[:8] // 2, layer=np.zeros(8, dtype=np.int64), expert=k[:8] % 4, tokens=k[:8] * 3,
                     dropped=np.zeros(8, dtype=np.int64), capacity=np.full(8, 32), aux_loss=k[:8] * 0.01)),
    ]
    for table, cols in batches:
        envs.append(envelope(client, len(envs) + 1, table=encode_batch(table, run_id, rank, cols)))
    envs.append(envelope(client, len(envs) + 1, end=pb.RunEnd(run_id=run_id, rank=rank, status="finished",
                                                                ended_at_ns=T0 + 2_000_000_000)))
    return envs


def send_synthetic_run(endpoint: str, run_id: str, world: int = 2) -> None:
    """Stream a synthetic run (synthetic_rank for each of ``world`` ranks) through the collector at ``endpoint``."""
    with GrpcSink(endpoint) as sink:
        sink.send([synthetic_rank(run_id, r, world) for r in range(world)])
