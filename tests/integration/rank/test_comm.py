"""collector.rank.comm, telemetry and hook in one process: config errors, the
comms-logger behaviours (verbose, debug caller, prof_ops, summary), run
identity, attach/detach, and never raising into training. Multi-rank
behaviour is in tests/*/rank/test_e2e.py.

Split by tier: the pure-function tests are in tests/unit/rank/test_comm.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from collector import hook
from collector.data import catalog
from collector.rank import comm, recorder, session, spool
from tests.integration.rank._rank_util import serve


@pytest.fixture
def one_rank(tmp_path):
    """A real single-rank gloo process group (the degenerate distributed case)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    comm.forget_groups()
    yield
    comm.configure({})
    comm.reset_summary()
    dist.destroy_process_group()
    comm.forget_groups()


@pytest.fixture
def collector():
    server, port, col = serve()
    yield f"127.0.0.1:{port}", col
    server.stop(0)


def _stop_quickly():
    s = session.active()
    if s is not None:
        s.client.cfg.close_timeout_s = 0.5


def my_training_step(t):
    comm.all_reduce(t)
    comm.broadcast(t, src=0)


def test_verbose_prints_deepspeed_style_lines_with_caller_in_debug(one_rank, capsys):
    comm.configure({"enabled": True, "verbose": True, "debug": True})
    my_training_step(torch.ones(4))
    comm.flush()
    out = capsys.readouterr().out
    assert re.search(
        r"rank=0 \| comm op: all_reduce \| \[Caller Func: my_training_step\] \| time \(ms\): [\d.]+ "
        r"\| msg size: 16\.0 B \| algbw \(Gbps\): [\d.]+  \| busbw \(Gbps\): [\d.]+",
        out,
    ), out
    assert "comm op: broadcast | [Caller Func: my_training_step]" in out


def test_prof_ops_records_only_the_listed_ops_or_log_names(one_rank):
    comm.configure({"enabled": True, "prof_all": False, "prof_ops": ["broadcast", "grads"]})
    my_training_step(torch.ones(4))
    comm.all_reduce(torch.ones(2), log_name="grads")  # listed by log_name, as DeepSpeed matches
    comm.all_reduce(torch.ones(2), log_name="other")
    summary = comm.log_summary(return_dict=True)
    assert sorted(summary) == ["broadcast", "grads"]


def test_log_summary_table_and_dict(one_rank, capsys):
    comm.configure({"enabled": True})
    for _ in range(3):
        comm.all_reduce(torch.ones(256))  # 1 KiB
    comm.all_reduce(torch.ones(4), log_name="tiny")
    comm.barrier()
    summary = comm.log_summary(return_dict=True)
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == [
        "Comm.",
        "Op",
        "Message",
        "Size",
        "Count",
        "Total",
        "Latency(ms)",
        "Avg",
        "Latency(ms)",
        "tput_avg",
        "(Gbps)",
        "busbw_avg",
        "(Gbps)",
    ]
    assert "1.0 KB" in out and "16.0 B" in out
    assert summary["all_reduce"][1024]["count"] == 3
    assert summary["tiny"][16]["count"] == 1
    assert summary["barrier"][0]["count"] == 1
    s = summary["all_reduce"][1024]
    assert s["total_latency_ms"] >= s["avg_latency_ms"] > 0
    assert s["busbw_avg_gbps"] == 0.0  # one rank: no bus traffic (factor 2(n-1)/n = 0)


def test_off_by_default_records_nothing(one_rank):
    comm.all_reduce(torch.ones(4))
    assert comm.flush() == 0 and comm.log_summary(return_dict=True) == {}


def test_single_process_session_without_process_group(collector, monkeypatch):
    endpoint, col = collector
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ids = []
    for _ in range(2):  # the same name twice: two runs
        s = session.start(run="same name!", endpoint=endpoint)
        assert s.ready and s.rank == 0 and s.world_size == 1
        session.set_step(11)
        session.emit("monitor", tag="Train/loss", value=0.5, samples=64)
        session.emit("monitor", tag="Train/lr", value=1e-3, samples=64, step=3)
        ids.append(s.run_id)
        session.stop()
    session.set_step(0)
    assert ids[0] != ids[1]
    assert all(re.fullmatch(r"same_name-\d{8}-\d{6}-[0-9a-f]{6}", i) for i in ids)
    hellos = col.envelopes("hello")
    assert {h.hello.run_id for h in hellos} == set(ids)
    h = hellos[0].hello
    assert (h.run_name, h.rank, h.world_size, h.clock_offset_ns, h.source) == ("same name!", 0, 1, 0, "hook")
    rows = col.rows("monitor").to_pydict()
    assert sorted(zip(rows["run_id"], rows["tag"], rows["step"])) == sorted(
        [(i, "Train/loss", 11) for i in ids] + [(i, "Train/lr", 3) for i in ids]
    )
    assert [e.end.status for e in col.envelopes("end")] == ["finished", "finished"]


def test_run_name_precedence(monkeypatch, collector):
    endpoint, _ = collector
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = {"telemetry": {"run": "from-config"}}
    cases = [({"run": "explicit"}, "from-env", "explicit"), ({}, "from-env", "from-env"), ({}, None, "from-config")]
    for kwargs, env, expected in cases:
        if env:
            monkeypatch.setenv("RANKSCOPE_RUN", env)
        else:
            monkeypatch.delenv("RANKSCOPE_RUN", raising=False)
        s = session.start(endpoint=endpoint, config=cfg, **kwargs)
        assert s.run_name == expected
        session.stop()
    assert session.start(config={"telemetry": {"enabled": False}}) is None


def test_attach_detach_patches_and_restores_torch_distributed(one_rank, collector):
    endpoint, col = collector
    originals = {op: getattr(dist, op) for op in comm.INSTRUMENTED_OPS}
    ddp_forward = torch.nn.parallel.DistributedDataParallel.forward
    with hook.attached(run="ctx", endpoint=endpoint) as active:
        assert all(getattr(dist, op) is getattr(comm, op) for op in comm.INSTRUMENTED_OPS)
        dist.all_reduce(torch.ones(4))
        dist.barrier()
        run_id = active.run_id
    assert {op: getattr(dist, op) for op in comm.INSTRUMENTED_OPS} == originals
    assert torch.nn.parallel.DistributedDataParallel.forward is ddp_forward
    assert session.active() is None and recorder.REC.on is False
    rows = col.rows("comm").to_pydict()
    assert rows["op"] == ["all_reduce", "barrier"] and set(rows["run_id"]) == {run_id}
    assert rows["group_name"] == ["world", "world"] and rows["seq"] == [1, 2] and rows["group_size"] == [1, 1]


def test_a_failing_block_ends_the_run_failed(one_rank, collector):
    endpoint, col = collector
    with pytest.raises(RuntimeError, match="boom"):
        with hook.attached(run="fails", endpoint=endpoint):
            raise RuntimeError("boom")
    assert [e.end.status for e in col.envelopes("end")] == ["failed"]


def test_ctrl_c_in_the_block_ends_the_run_stopped(one_rank, collector):
    """Its user stopped it: 'stopped', not 'failed'."""
    endpoint, col = collector
    with pytest.raises(KeyboardInterrupt):
        with hook.attached(run="stopped", endpoint=endpoint):
            raise KeyboardInterrupt
    assert [e.end.status for e in col.envelopes("end")] == ["stopped"]


def test_unreachable_collector_never_raises_into_training(one_rank, tmp_path, monkeypatch):
    monkeypatch.setenv("RANKSCOPE_SPOOL_DIR", str(tmp_path))
    active = hook.attach(run="offline", endpoint="no such host:::")
    _stop_quickly()
    for _ in range(5):
        dist.all_reduce(torch.ones(4))
    session.emit("timers", name="fwd", start_ns=1, dur_ns=2)
    session.emit("nosuch", x=1)  # bad table: dropped with a warning, no exception
    hook.detach()
    envs = [e for f in spool.files(tmp_path) for e in spool.read(f)]
    assert {e.client_id for e in envs} == {active.client_id}
    tables = sorted(
        e.table.table for e in envs if e.HasField("table") and e.table.table not in ("heartbeats", "host", "gc")
    )
    assert tables == ["comm", "timers"]  # besides the watchdog's beats and the host samples, as many as ran
    assert sum(e.table.rows for e in envs if e.HasField("table") and e.table.table == "comm") == 5


def test_exit_without_detach_flushes_and_an_uncaught_error_ends_the_run_failed(collector, tmp_path):
    endpoint, col = collector
    script = (
        "from collector import hook\nfrom collector.rank import session\n"
        f"hook.attach(run='crashes', endpoint={endpoint!r})\n"
        "session.emit('timers', name='fwd', start_ns=1, dur_ns=2)\n"
        "raise RuntimeError('training crashed')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "WORLD_SIZE": "1", "RANKSCOPE_SPOOL_DIR": str(tmp_path)},
    )
    assert proc.returncode == 1 and "training crashed" in proc.stderr
    assert [e.end.status for e in col.envelopes("end")] == ["failed"]
    assert col.rows("timers").to_pydict()["name"] == ["fwd"]


def test_ddp_model_with_its_own_comm_hook_keeps_it(one_rank, collector):
    """DDP allows one comm hook: a user's hook wins over ddp_comm_hook, and its
    torch.distributed calls are still recorded."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    endpoint, col = collector
    with hook.attached(run="own-hook", endpoint=endpoint):
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
        model.register_comm_hook(None, allreduce_hook)
        model(torch.ones(3, 4)).sum().backward()  # would raise if a second hook were registered
        plain = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
        plain(torch.ones(3, 4)).sum().backward()
    names = col.rows("comm").to_pydict()["log_name"]
    assert names.count("ddp_bucket_all_reduce") == 1  # only the model without a hook of its own
    assert names.count("all_reduce") >= 1  # the user's hook, through the patched dist.all_reduce


def test_python_m_collector_hook_runs_an_unmodified_script(collector, tmp_path):
    endpoint, col = collector
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch, torch.distributed as dist\n"
        # a file store: a TCP port picked here could be taken by another process before the script binds it
        f"dist.init_process_group('gloo', init_method='file://{tmp_path / 'store'}', rank=0, world_size=1)\n"
        "for _ in range(int(sys.argv[1])):\n"
        "    dist.all_reduce(torch.ones(8))\n"
        "dist.destroy_process_group()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "collector.hook", "--endpoint", endpoint, str(script), "3"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "WORLD_SIZE": "1", "RANKSCOPE_SPOOL_DIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    assert col.envelopes("hello")[0].hello.run_name == "train"  # the script's name
    rows = col.rows("comm").to_pydict()
    assert rows["op"] == ["all_reduce"] * 3 and rows["bytes"] == [32] * 3


def test_an_async_op_in_flight_at_stop_is_still_recorded(live_collector, tmp_path):
    """Stopping waits (bounded, session.STOP_WAIT_S) for in-flight async ops, so the run's last
    async all_reduce keeps its row; the peer joins it 0.1 s after it sees the stop began."""
    from tests.integration.rank import _rank_workers as workers
    from tests.integration.rank._rank_util import spawn

    endpoint, data = live_collector
    results = spawn(workers.late_peer_worker, 2, endpoint, tmp_path)
    assert results[1]["sum"] == [3.0] * workers.N
    assert 0.05 < results[1]["stop_s"] < session.STOP_WAIT_S + 2.0
    con = catalog.connect(data)
    rows = con.execute("SELECT rank, async_op FROM comm WHERE op = 'all_reduce' ORDER BY rank").fetchall()
    ends = con.execute("SELECT rank, dropped_records FROM rank_ends ORDER BY rank").fetchall()
    assert rows == [(0, False), (1, True)]
    assert ends == [(0, 0), (1, 0)]
