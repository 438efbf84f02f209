"""Evidence by itself (issue 32), live: 4 real gloo ranks with the hook attached, rank 1 late in a
named Python function (``slow_loader``), a real collector. The collector's commands ride the
ranks' streams; the ranks' traces land in the data dir and the ``artifacts`` table; the diff of
the suspect's and the reference's traces names the function.

Waits poll a definite condition with a generous deadline (the machine is shared)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collector.data import queries, trace_diff
from collector.data.live_collector import fetch
from collector.data.live_collector import write as advertise
from collector.testing.collectors import live_collector
from collector.testing.gloo import join_ranks, start_ranks, wait_for
from collector.testing.ports import free_port
from proto import pb
from tests.integration import _evidence_workers as workers

SLOW_MS = 40.0
STEP_MS = 10.0


def _spawn(endpoint: str, out: Path, slow_rank: int = 1, max_steps: int = 3000, slow: bool = True):
    if slow:
        (out / "slow").write_text("")
    return start_ranks(workers.train_worker, workers.WORLD, endpoint, str(out), slow_rank, SLOW_MS, STEP_MS, max_steps)


def _stop_and_join(ctx, out: Path, timeout: float = 120.0) -> None:
    (out / "stop").write_text("")
    join_ranks(ctx, timeout)


def _run_id(collector) -> str | None:
    runs = list(collector.state.liveness.runs)
    return runs[0] if runs else None


def _streaming(collector, n: int = workers.WORLD):
    run_id = _run_id(collector)
    return run_id if run_id and len(collector.state.liveness.streams_of(run_id)) == n else None


def _artifacts(data_dir, run_id):
    try:
        cat = queries.Catalog(data_dir)
    except queries.DataDirError:
        return None
    try:
        return trace_diff.captures(cat, run_id)
    finally:
        cat.close()


def _rows_where(data_dir, run_id, **equal):
    rows = _artifacts(data_dir, run_id)
    if rows is None:
        return None
    for column, value in equal.items():
        rows = rows[rows[column] == value]
    return rows


def _cli(*args, token: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RANKSCOPE_TOKEN"}
    if token:
        env["RANKSCOPE_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", *args], capture_output=True, text=True, env=env, timeout=300
    )


TOKEN = "evidence-token-0123456789abcdef"


def test_a_profile_command_captures_both_ranks_and_the_diff_names_the_slow_function(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("RANKSCOPE_TOKEN", TOKEN)  # the ranks (spawned children) stream with it
    with live_collector(tmp_path / "data", token=TOKEN) as collector:
        ctx = _spawn(collector.endpoint, out)
        try:
            run_id = wait_for(lambda: _streaming(collector), 120)
            assert run_id, "the 4 ranks never streamed"
            commands = collector.state.commands
            with pytest.raises(ValueError, match="steps 500 is outside"):
                commands.send(run_id, [1], pb.RankRequest(kind="profile", steps=500))
            reply = commands.send(
                run_id,
                [1, 0, 9],
                pb.RankRequest(kind="profile", steps=3, with_stack=True, reason="test"),
                roles={1: "suspect", 0: "reference"},
            )
            assert sorted(reply.sent) == [0, 1]
            assert reply.refused == [f"rank 9: no stream of run {run_id!r} open on this collector"]
            # a second capture while the first waits or runs is refused by the rank, with the reason
            second = commands.send(run_id, [1], pb.RankRequest(kind="profile", steps=2))

            def captured():
                rows = _rows_where(collector.data_dir, run_id, request_id=reply.request_id, status="captured")
                return rows if rows is not None and len(rows) == 2 else None

            rows = wait_for(captured, 120)
            assert rows is not None, _artifacts(collector.data_dir, run_id)
            refused = wait_for(lambda: _rows_where(collector.data_dir, run_id, request_id=second.request_id).size, 60)
            answers = _rows_where(collector.data_dir, run_id, request_id=second.request_id)
            assert refused and list(answers.status) == ["refused"]
            assert answers.detail.iloc[0].startswith("a profiler is already active")
            accepted = _rows_where(collector.data_dir, run_id, request_id=reply.request_id, status="accepted")
            assert sorted(accepted["rank"]) == [0, 1]
            for row in rows.itertuples():
                path = collector.data_dir / row.path
                assert path.stat().st_size == row.bytes > 0
                assert row.last_step - row.step + 1 == row.steps == 3
                assert trace_diff.load(path)["traceEvents"]  # Perfetto-openable Chrome JSON
            [found] = trace_diff.evidence(collector.data_dir, _artifacts(collector.data_dir, run_id))
            assert (found["suspect"], found["reference"]) == (1, 0)
            assert "slow_loader" in found["headline"], found
            [slow] = [line for line in found["lines"] if line["name"].startswith("slow_loader (")]
            assert SLOW_MS / 2 < slow["delta_ms"] < SLOW_MS * 3, slow  # per step, not per capture

            # on demand, from the command line: refused without the token, then a profile and stacks
            where = ("--endpoint", collector.endpoint, "--data-dir", str(collector.data_dir))
            refused = _cli("profile", run_id, "--ranks", "1", "--steps", "2", *where)
            assert refused.returncode == 2 and "UNAUTHENTICATED" in refused.stdout + refused.stderr, refused
            traces = tmp_path / "traces"
            asked = _cli(
                "profile",
                run_id,
                "--ranks",
                "1",
                "--reference",
                "2",
                "--steps",
                "2",
                "--out",
                str(traces),
                *where,
                token=TOKEN,
            )
            assert asked.returncode == 0, asked.stdout + asked.stderr
            assert "rank 1 spends" in asked.stdout and "slow_loader" in asked.stdout, asked.stdout
            merged = json.loads((traces / "merged.json").read_text())
            names = {e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"}
            assert names == {"rank 1 (suspect)", "rank 2 (reference)"}
            assert json.loads((traces / "rank2.json").read_text())["traceEvents"]
            stacks = _cli("stacks", run_id, "--ranks", "3", *where, token=TOKEN)
            assert stacks.returncode == 0 and "rank 3 MainThread (main)" in stacks.stdout, stacks.stdout + stacks.stderr
            health = _cli("health", run_id, "--data-dir", str(collector.data_dir))
            assert health.stdout.count("evidence: rank 1 spends") == 2, health.stdout
            # a memory report: this process's RSS, as a small JSON artifact
            memory = commands.send(run_id, [2], pb.RankRequest(kind="memory"))
            reported = wait_for(lambda: _answered(collector.data_dir, run_id, memory.request_id, "captured", [2]), 60)
            assert reported is not None, _artifacts(collector.data_dir, run_id)
            report = trace_diff.load(collector.data_dir / reported.path.iloc[0])
            assert report["rss_bytes"] > 10 << 20  # a torch process
        finally:
            _stop_and_join(ctx, out)
    for r in range(workers.WORLD):
        assert json.loads((out / f"rank{r}.json").read_text())["error"] is None


def _step_of(collector, run_id: str, rank: int) -> int:
    ranks = collector.state.liveness.runs.get(run_id, {})
    return ranks[rank].step if rank in ranks else 0


def _refreshed_after(metrics, run_id: str, after: float) -> bool:
    computed = metrics._computed.get(run_id)
    return computed is not None and computed.at > after


@pytest.mark.slow  # ~30 s; the same selection at 1,024 ranks is tests/integration/server/test_escalation.py (make test)
def test_a_live_straggler_finding_profiles_the_suspect_and_a_reference_and_a_healthy_phase_asks_nobody(tmp_path):
    from collector.server.escalation import Escalation
    from collector.server.metrics import MetricsEndpoint

    out = tmp_path / "out"
    out.mkdir()
    with live_collector(tmp_path / "data") as collector:
        escalation = Escalation(collector.state.commands, run_interval_s=3600)
        metrics = MetricsEndpoint(collector.state, None, refresh_s=0.5, escalation=escalation)
        ctx = _spawn(collector.endpoint, out, slow=False)
        try:
            run_id = wait_for(lambda: _streaming(collector), 120)
            assert run_id, "the 4 ranks never streamed"
            # healthy phase: 60 steps and two refreshes of the findings after them ask nobody
            assert wait_for(lambda: _step_of(collector, run_id, 1) >= 60, 120)
            for _ in range(2):
                mark = time.monotonic()
                assert wait_for(lambda mark=mark: _refreshed_after(metrics, run_id, mark), 60)
            assert not escalation.asked and not collector.state.commands.sent
            assert _rows_where(collector.data_dir, run_id).empty
            (out / "slow").write_text("")  # rank 1 turns straggler

            def captured():
                rows = _rows_where(collector.data_dir, run_id, status="captured")
                return rows if rows is not None and len(rows) == 2 else None

            rows = wait_for(captured, 180)
            assert rows is not None, (escalation.asked, _artifacts(collector.data_dir, run_id))
            [(asked_run, request_id, roles, _)] = escalation.asked  # one escalation: the rate limit holds
            assert asked_run == run_id and roles[1] == "suspect"
            [reference] = [r for r, role in roles.items() if role == "reference"]
            assert reference != 1 and sorted(roles) == sorted({1, reference})
            assert set(rows.request_id) == {request_id} and sorted(rows["rank"]) == sorted(roles)
            assert all("rank 1" in f for f in rows.finding), list(rows.finding)
            # within 10 steps of the ask: the suspect accepted at step a, its capture ended by a + 10
            accepted = _rows_where(collector.data_dir, run_id, status="accepted", rank=1)
            suspect = rows[rows["rank"] == 1].iloc[0]
            assert suspect.last_step <= int(accepted.step.iloc[0]) + 10, (accepted, suspect)
            [found] = trace_diff.evidence(collector.data_dir, _artifacts(collector.data_dir, run_id))
            assert "slow_loader" in found["headline"].split(";")[0], found["headline"]
            # the finding stays while the run goes on: it is not asked about again
            mark = time.monotonic()
            assert wait_for(lambda: _refreshed_after(metrics, run_id, mark), 60)
            assert len(escalation.asked) == 1 and len(collector.state.commands.sent) == 2
            # the live answer (what `rankscope health` prints first) carries the evidence, diffed once
            advertise(collector.data_dir, collector.endpoint, False, os.getpid())  # as `rankscope collect` does
            answer = fetch(collector.data_dir, run_id)
            assert answer is not None and [e["request_id"] for e in answer.evidence] == [request_id], answer
            [straggler] = [f for f in answer.findings if f["kind"] == "straggler" and f["ranks"] == [1]]
            assert [e["request_id"] for e in straggler["captured"]] == [request_id], straggler
            health = _cli("health", run_id, "--data-dir", str(collector.data_dir))
            assert f"evidence: {found['headline']} (request {request_id}" in health.stdout, health.stdout
        finally:
            _stop_and_join(ctx, out)
            metrics.close()


def _answered(data_dir, run_id, request_id, status, ranks):
    rows = _rows_where(data_dir, run_id, request_id=request_id, status=status)
    return rows if rows is not None and set(ranks) <= set(rows["rank"]) else None


@pytest.mark.slow
def test_a_rank_killed_mid_capture_breaks_nothing_and_its_peer_says_its_capture_ended(tmp_path):
    import signal

    out = tmp_path / "out"
    out.mkdir()
    with live_collector(tmp_path / "data") as collector:
        ctx = _spawn(collector.endpoint, out)
        try:
            run_id = wait_for(lambda: _streaming(collector), 120)
            assert run_id
            reply = collector.state.commands.send(
                run_id, [1, 0], pb.RankRequest(kind="profile", steps=20), roles={1: "suspect", 0: "reference"}
            )
            assert (
                wait_for(lambda: _answered(collector.data_dir, run_id, reply.request_id, "accepted", [0, 1]), 60)
                is not None
            )
            os.kill(int((out / "pid1").read_text()), signal.SIGKILL)
            failed = wait_for(lambda: _answered(collector.data_dir, run_id, reply.request_id, "failed", [0]), 120)
            assert failed is not None, _artifacts(collector.data_dir, run_id)
            assert failed.detail.iloc[0].startswith("the run ended after "), failed.detail.iloc[0]
            assert _rows_where(collector.data_dir, run_id, status="captured").empty
            # the collector goes on: the dead rank is no longer reachable, and says so
            assert wait_for(lambda: 1 not in collector.state.liveness.streams_of(run_id), 60)
            again = collector.state.commands.send(run_id, [1], pb.RankRequest(kind="stacks"))
            assert list(again.sent) == [] and "rank 1: no stream" in again.refused[0]
        finally:
            _stop_and_join_any(ctx, out)
    for r in (0, 2, 3):
        assert json.loads((out / f"rank{r}.json").read_text())["error"]  # their peer died: the run failed


def _stop_and_join_any(ctx, out: Path, timeout: float = 120.0) -> None:
    """Like _stop_and_join, for a run one of whose ranks was killed (its exit code is not 0)."""
    (out / "stop").write_text("")
    deadline = time.monotonic() + timeout
    while any(p.is_alive() for p in ctx.processes):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise AssertionError("ranks did not finish")
        time.sleep(0.5)


@pytest.mark.slow
def test_a_collector_restart_mid_capture_keeps_both_traces(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    data_dir, port = tmp_path / "data", free_port()
    ctx = None
    try:
        with live_collector(data_dir, port=port) as collector:
            ctx = _spawn(collector.endpoint, out)
            run_id = wait_for(lambda: _streaming(collector), 120)
            assert run_id
            reply = collector.state.commands.send(
                run_id,
                [1, 0],
                pb.RankRequest(kind="profile", steps=10, with_stack=True),
                roles={1: "suspect", 0: "reference"},
            )
            assert wait_for(lambda: _answered(data_dir, run_id, reply.request_id, "accepted", [0, 1]), 60) is not None
            assert _rows_where(data_dir, run_id, status="captured").empty  # stopped while the ranks capture
        with live_collector(data_dir, port=port) as collector:
            rows = wait_for(lambda: _answered(data_dir, run_id, reply.request_id, "captured", [0, 1]), 120)
            assert rows is not None, _artifacts(data_dir, run_id)
            assert len(rows) == 2  # a resent trace is stored once
            [found] = trace_diff.evidence(data_dir, _artifacts(data_dir, run_id))
            assert "slow_loader" in found["headline"].split(";")[0], found["headline"]
            _stop_and_join(ctx, out)
            ctx = None
    finally:
        if ctx is not None:
            _stop_and_join_any(ctx, out)
    for r in range(workers.WORLD):
        assert json.loads((out / f"rank{r}.json").read_text())["error"] is None


@pytest.mark.slow
def test_an_engine_run_straggler_is_profiled_by_escalation_and_the_diff_names_the_function(tmp_path):
    from collector.server.escalation import Escalation
    from collector.server.metrics import MetricsEndpoint

    out = tmp_path / "out"
    out.mkdir()
    with live_collector(tmp_path / "data") as collector:
        escalation = Escalation(collector.state.commands)
        metrics = MetricsEndpoint(collector.state, None, refresh_s=1.0, escalation=escalation)
        ctx = start_ranks(workers.engine_worker, workers.WORLD, collector.endpoint, str(out), 1, SLOW_MS, 3000)
        try:
            run_id = wait_for(lambda: _streaming(collector), 180)
            assert run_id, "the 4 ranks never streamed"

            def captured():
                rows = _rows_where(collector.data_dir, run_id, status="captured")
                return rows if rows is not None and len(rows) == 2 else None

            rows = wait_for(captured, 240)
            assert rows is not None, (escalation.asked, _artifacts(collector.data_dir, run_id))
            assert sorted(rows.role) == ["reference", "suspect"]
            assert int(rows[rows.role == "suspect"]["rank"].iloc[0]) == 1
            [found] = trace_diff.evidence(collector.data_dir, _artifacts(collector.data_dir, run_id))
            assert "slow_loader" in found["headline"].split(";")[0], found["headline"]
        finally:
            _stop_and_join(ctx, out)
            metrics.close()
