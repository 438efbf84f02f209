"""`rankscope replay`: a run streamed through a real collector, replayed at 10x (from the
data dir and from an `export --archive` file) reproduces its tables row for row,
except run_id and what the collector stamps on arrival."""
from __future__ import annotations

import numpy as np
import pytest

from collector.codec import encode_batch
from collector.importers.sink import GrpcSink, envelope
from collector.schema import TABLES
from proto import pb
from tests._import_util import live_collector, query, rankscope

T0 = 1_790_000_000_000_000_000
RUN = "source-run"


def _rank_envelopes(rank: int, world: int) -> list[pb.Envelope]:
    """About 1.5 s of a 2-rank run with rows in every table (some NULLs; flops and moe have no times)."""
    client = f"test-rank-{rank}"
    n = 300
    k = np.arange(n, dtype=np.int64)
    start = T0 + k * 5_000_000 + rank * 1000
    envs = [envelope(client, 1, hello=pb.Hello(run_id=RUN, run_name="src", rank=rank, world_size=world,
                                               host=f"node{rank}", pid=100 + rank, clock_offset_ns=7 * rank,
                                               started_at_ns=T0 - 1, source="engine", config_json='{"x": 1}'))]
    batches = [
        ("comm", dict(step=k // 10, group_name=["world"] * n, group_size=np.full(n, world), seq=k,
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
        envs.append(envelope(client, len(envs) + 1, table=encode_batch(table, RUN, rank, cols)))
    envs.append(envelope(client, len(envs) + 1, end=pb.RunEnd(run_id=RUN, rank=rank, status="finished",
                                                                ended_at_ns=T0 + 2_000_000_000)))
    return envs


def _rows(data, table: str, run_id: str) -> list[tuple]:
    return sorted(query(data, f'SELECT * EXCLUDE (run_id) FROM "{table}" WHERE run_id = ?', [run_id]),
                  key=repr)


def _assert_same_run(data, original: str, replayed: str) -> None:
    for table in TABLES:
        rows = _rows(data, table, original)
        assert rows, table
        assert _rows(data, table, replayed) == rows, table
    cols = "name, world_size, status, config, epoch_ns(started_at), epoch_ns(ended_at), n_ranks"
    (src,) = query(data, f"SELECT {cols}, source, linked_run_id FROM runs WHERE run_id = ?", [original])
    (new,) = query(data, f"SELECT {cols}, source, linked_run_id FROM runs WHERE run_id = ?", [replayed])
    assert new[:-2] == src[:-2] and new[-2:] == ("replay", original)
    rank_cols = ("rank, host, pid, clock_offset_ns, epoch_ns(started_at), epoch_ns(ended_at), status, "
                 "dropped_records")
    assert (query(data, f"SELECT {rank_cols} FROM ranks WHERE run_id = ? ORDER BY rank", [replayed])
            == query(data, f"SELECT {rank_cols} FROM ranks WHERE run_id = ? ORDER BY rank", [original]))


@pytest.fixture
def source_run(tmp_path, port):
    data = tmp_path / "data"
    with live_collector(data, port) as endpoint:
        with GrpcSink(endpoint) as sink:
            sink.send([_rank_envelopes(r, 2) for r in range(2)])
        yield data, endpoint


def test_replay_from_the_data_dir_at_10x(source_run):
    data, endpoint = source_run
    assert rankscope("replay", data, "--run", RUN, "--speed", "10", "--endpoint", endpoint) == 0
    (replayed,) = query(data, "SELECT run_id FROM runs WHERE linked_run_id = ?", [RUN])[0]
    assert replayed != RUN
    _assert_same_run(data, RUN, replayed)


def test_replay_an_archive_by_name_as_fast_as_possible(source_run, tmp_path):
    data, endpoint = source_run
    archive = tmp_path / "src.rsarchive"
    assert rankscope("export", "--archive", "src", archive, "--data-dir", data) == 0
    assert rankscope("replay", archive, "--speed", "0", "--endpoint", endpoint) == 0
    (replayed,) = query(data, "SELECT run_id FROM runs WHERE linked_run_id = ?", [RUN])[0]
    _assert_same_run(data, RUN, replayed)


def test_replay_of_a_partition_folder_and_bad_paths(source_run, tmp_path, capsys):
    data, endpoint = source_run
    assert rankscope("replay", data / "parquet" / "comm" / f"run={RUN}", "--speed", "0",
                     "--endpoint", endpoint) == 0
    assert len(query(data, "SELECT run_id FROM runs WHERE linked_run_id = ?", [RUN])) == 1
    assert rankscope("replay", data, "--endpoint", endpoint) == 1
    assert "say which run with --run" in capsys.readouterr().err
    assert rankscope("replay", data, "--run", "nope", "--endpoint", endpoint) == 1
    assert "no run with id or name 'nope'" in capsys.readouterr().err
