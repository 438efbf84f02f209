"""`rankscope simulate`: the shipped template is the sample run's step, the run it writes has
the shape it claims (counted), an injected straggler is found by `rankscope health` and a
healthy simulation is not, the same run arrives whether written or streamed, and bad
arguments are refused naming the option. ``--hang`` writes what hung ranks send, and
`rankscope health` names the stuck rank, the op and the step, at 1,024 ranks, written or
streamed; without it, no liveness finding.

Split by tier: the pure-function tests are in tests/unit/tools/test_simulate.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from collector.data import catalog, queries
from collector.testing.collectors import live_collector
from collector.tools import simulate


def cli(*args: str, timeout: float = 300, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def test_simulate_into_a_data_dir_then_health_names_the_straggler(tmp_path):
    d = tmp_path / "sim"
    out = cli("simulate", "--ranks", "96", "--steps", "30", "--hosts", "12", "--straggler", "61:40", "--name",
              "sim96", "--data-dir", str(d))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "96/96 ranks" in out.stdout
    con = catalog.connect(str(d))
    sim = simulate.Simulation(ranks=96, steps=30, run_id="x")
    assert con.execute("SELECT world_size, name FROM runs").fetchall() == [(96, "sim96")]
    assert con.execute("SELECT count(*), count(DISTINCT rank) FROM comm").fetchone() == (96 * 30 * 7, 96)
    assert con.execute("SELECT count(DISTINCT host) FROM ranks").fetchone() == (12,)
    total = sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("comm", "timers", "monitor", "memory"))
    assert total == sim.records_per_rank * 96
    con.close()
    health = cli("health", "sim96", "--data-dir", str(d), "--json")
    assert health.returncode == 1, health.stderr
    late = [f for f in json.loads(health.stdout) if f["kind"] == "straggler"]
    assert late and all(f["ranks"] == [61] for f in late)


def test_a_healthy_simulation_has_no_straggler(tmp_path):
    # a relative --data-dir, as a person types it (the rollups' commits once failed on one)
    out = cli("simulate", "--ranks", "64", "--steps", "20", "--name", "calm", "--data-dir", "sim", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    health = cli("health", "calm", "--data-dir", "sim", "--json", cwd=tmp_path)
    assert not [f for f in json.loads(health.stdout) if f["kind"] == "straggler"]


def test_streamed_through_a_collector_arrives_complete(tmp_path):
    sim = simulate.Simulation(ranks=40, steps=12, stragglers=(simulate.Straggler(3, 20_000_000),), run_id="live-sim")
    with live_collector(tmp_path / "data") as (endpoint, data_dir):
        acked = simulate.stream(sim, endpoint, streams=16)
    assert acked == sum(1 for r in range(40) for _ in sim.rank_envelopes(r))
    catalog.ensure_catalog(data_dir)
    con = catalog.connect(str(data_dir))
    counts = dict(con.execute("SELECT rank, count(*) FROM comm GROUP BY rank").fetchall())
    assert counts == {r: 12 * 7 for r in range(40)}
    assert con.execute("SELECT count(*) FROM rank_ends WHERE status = 'finished'").fetchone() == (40,)
    con.close()


LIVENESS_KINDS = {"hang", "desync", "silent_rank", "rank_stopped"}


@pytest.mark.parametrize("hang", [True, False])
def test_health_names_the_hung_rank_op_and_step_at_1024_ranks_and_nothing_without(tmp_path, hang):
    d = tmp_path / "sim"
    extra = ["--hang", "700:3"] if hang else []
    out = cli("simulate", "--ranks", "1024", "--steps", "6", "--name", "big", *extra, "--data-dir", str(d))
    assert out.returncode == 0, out.stderr
    health = cli("health", "big", "--data-dir", str(d), "--json")
    found = [f for f in json.loads(health.stdout) if f["kind"] in LIVENESS_KINDS]
    if not hang:
        assert found == [] and health.returncode != 2
        return
    assert health.returncode == 2, health.stderr
    [f] = [f for f in found if f["kind"] == "hang"]
    assert f["ranks"] == [700] and f["steps"] == [3, 3] and f["evidence"]["op"] == "reduce_scatter_tensor"
    assert "at step 3" in f["text"] and "waiting for rank 700" in f["text"]
    cat = queries.Catalog(d)
    run_id = queries.resolve_run(cat.con, "big")
    [row] = queries.hangs(cat, run_id).itertuples()
    assert list(row.missing_ranks) == [700] and len(row.waiting_ranks) == 1023 and row.seq == 21
    assert queries.stacks(cat, run_id, [700]).innermost.str.endswith("in simulated_stall").all()


@pytest.mark.parametrize("slow", [True, False])
def test_health_names_the_slow_host_of_128_over_the_world_group_alone_and_nothing_without(tmp_path, slow):
    """1,024 ranks on 128 hosts whose only group is the world (plain DDP), node-0017's link 4x
    slower from step 30: `rankscope health` says it is the network, names that host alone (by its
    telemetry's arrival) and no straggler; the same run without the slow link raises no warning.
    (What `rankscope health` costs at this size: benches/slow_links.py --world-only.)"""
    d = tmp_path / "sim"
    extra = ["--slow-link", "17:4@30"] if slow else []
    out = cli("simulate", "--ranks", "1024", "--hosts", "128", "--steps", "60", "--world-only", *extra,
              "--name", "ddp", "--data-dir", str(d))  # fmt: skip
    assert out.returncode == 0, out.stderr
    health = cli("health", "ddp", "--data-dir", str(d), "--json")
    found = json.loads(health.stdout)
    warnings = [f for f in found if f["severity"] in ("warning", "critical")]
    if not slow:
        assert warnings == [] and health.returncode == 0, [f["text"] for f in warnings]
        return
    [link] = warnings
    assert link["kind"] == "slow_link" and link["evidence"]["hosts"] == [["node-0017"]], link["text"]
    assert link["ranks"] == list(range(136, 144))
    assert 0 <= link["evidence"]["detected_step"] - 30 <= 10 and abs(link["evidence"]["onset_step"] - 30) <= 2
    assert "node-0017's link" in link["text"] and "125 other hosts" in link["text"]


def test_a_hang_streamed_through_a_collector_is_found(tmp_path):
    with live_collector(tmp_path / "data") as (endpoint, data_dir):
        out = cli("simulate", "--ranks", "48", "--steps", "4", "--hang", "9:2", "--name", "live-hang",
                  "--endpoint", endpoint)  # fmt: skip
        assert out.returncode == 0, out.stderr
    catalog.ensure_catalog(data_dir)
    health = cli("health", "live-hang", "--data-dir", str(data_dir), "--json")
    assert health.returncode == 2, health.stderr
    [f] = [f for f in json.loads(health.stdout) if f["kind"] == "hang"]
    assert f["ranks"] == [9] and f["steps"] == [2, 2] and len(f["evidence"]["waiting_ranks"]) == 47


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ranks", "0", "--steps", "5"], "--ranks must be >= 1"),
        (["--ranks", "8", "--steps", "5", "--straggler", "9:40"], "--straggler: rank 9 is not a rank"),
        (["--ranks", "8", "--steps", "5", "--straggler", "3-40"], "is not RANK:MS"),
        (["--ranks", "8", "--steps", "5", "--straggler", "3:40@5"], "past the last step"),
        (["--ranks", "8", "--steps", "5", "--hosts", "9"], "--hosts must be in"),
        (["--ranks", "8", "--steps", "5", "--hang", "8:2"], "--hang: rank 8 is not a rank"),
        (["--ranks", "8", "--steps", "5", "--hang", "3"], "is not RANK:STEP"),
        (["--ranks", "8", "--steps", "5", "--hang", "3:5"], "--hang: step 5 is past the last step"),
        (["--ranks", "1", "--steps", "5", "--hang", "0:2"], "--hang needs --ranks >= 2"),
        (["--ranks", "16", "--steps", "5", "--slow-link", "1-4@2"], "is not HOST:FACTOR@STEP[-END]"),
        (
            ["--ranks", "16", "--steps", "5", "--slow-link", "2:4@2"],
            "--slow-link: host 2 is not one of the run's 2 hosts",
        ),
        (["--ranks", "16", "--steps", "5", "--slow-link", "1:0.5@2"], "factor 0.5 must be >= 1"),
        (["--ranks", "16", "--steps", "5", "--slow-link", "1:4@3-2"], "END 2 must be after STEP 3"),
        (["--ranks", "8", "--steps", "5", "--hosts", "8", "--host-groups"], ">= 2 hosts of >= 2 ranks each"),
    ],
)
def test_bad_arguments_name_the_option(tmp_path, args, message):
    out = cli("simulate", *args, "--data-dir", str(tmp_path / "d"))
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "d").exists()
