"""Automatic escalation at scale (issue 32): a 1,024-rank run simulated by ``rankscope simulate``
(rank 517 late from step 15, 128 hosts), its real findings and step analysis, the collector's real
liveness and command channel holding one stream per rank. Only the suspect and one reference on
its host are asked; the rate limits hold; a healthy run asks nobody; a hang asks for stacks only.

The ranks' streams are recording stand-ins (what ``Ack.requests`` would carry); the live path
through gRPC to real ranks is tests/integration/test_evidence.py's."""

from __future__ import annotations

import pytest

from collector.data import findings, queries
from collector.data.findings import Finding
from collector.server.commands import Commands
from collector.server.escalation import Escalation
from collector.server.liveness import Liveness
from collector.testing import fake_runs
from collector.tools.cli import main as cli

RANKS, HOSTS, SUSPECT = 1024, 128, 517


class RecordingStream:
    def __init__(self) -> None:
        self.requests = []

    def request(self, request) -> None:
        self.requests.append(request)


class NoStore:
    def submit(self, *args):
        pass


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """{"late" / "healthy": (run id, rank -> host, its findings, its step analysis)}."""
    data_dir = tmp_path_factory.mktemp("sim1k")
    common = ["simulate", "--ranks", str(RANKS), "--hosts", str(HOSTS), "--data-dir", str(data_dir)]
    assert cli([*common, "--steps", "40", "--straggler", f"{SUSPECT}:40@15", "--name", "late"]) == 0
    assert cli([*common, "--steps", "30", "--name", "healthy"]) == 0
    cat = queries.Catalog(data_dir)
    try:
        runs = {}
        for name in ("late", "healthy"):
            run_id = queries.resolve_run(cat.con, name)
            hosts = dict(cat.df("select rank, host from ranks where run_id = ?", [run_id]).itertuples(index=False))
            runs[name] = (run_id, hosts, findings.for_run(cat, run_id), queries.step_analysis(cat, run_id))
        return runs
    finally:
        cat.close()


def _live(simulated, name: str = "late"):
    """Liveness with every rank of the run streaming (its Hello, host included), and the run's findings."""
    run_id, hosts, found, steps = simulated[name]
    liveness = Liveness(NoStore(), start=False)
    streams = {}
    for rank in range(RANKS):
        streams[rank] = RecordingStream()
        liveness.observe(streams[rank], fake_runs.hello(f"c{rank}", 1, run_id, rank, RANKS, host=hosts[rank]))
    return run_id, liveness, streams, hosts, found, steps


def _asked(streams) -> dict[int, list]:
    return {r: s.requests for r, s in streams.items() if s.requests}


def test_at_1024_ranks_only_the_suspect_and_a_reference_on_its_host_are_asked_once(simulated):
    run_id, liveness, streams, hosts, found, steps = _live(simulated)
    assert any(f.kind == "straggler" and f.ranks == (SUSPECT,) for f in found), [f.text for f in found]
    escalation = Escalation(Commands(liveness))
    [request_id] = escalation.offer(run_id, found, steps)
    asked = _asked(streams)
    assert len(asked) == 2 and SUSPECT in asked, sorted(asked)
    [reference] = [r for r in asked if r != SUSPECT]
    assert hosts[reference] == hosts[SUSPECT]
    roles = {r: reqs[0].role for r, reqs in asked.items()}
    assert roles == {SUSPECT: "suspect", reference: "reference"}
    for [request] in asked.values():
        assert (request.kind, request.steps, request.with_stack, request.id) == ("profile", 3, True, request_id)
        assert f"rank {SUSPECT}" in request.finding
    # the same findings again (the next refresh): nobody is asked again
    assert escalation.offer(run_id, found, steps) == []
    # another finding within the run's interval waits
    other = Finding(kind="straggler", severity="critical", text="rank 12 costs ...", ranks=(12,))
    assert escalation.offer(run_id, [other], steps) == []
    assert sum(len(s.requests) for s in streams.values()) == 2


def test_the_per_rank_limit_holds_when_the_run_limit_allows(simulated):
    run_id, liveness, streams, _, found, steps = _live(simulated)
    escalation = Escalation(Commands(liveness), run_interval_s=0)
    assert len(escalation.offer(run_id, found, steps)) == 1
    worse = Finding(kind="straggler", severity="critical", text=f"rank {SUSPECT} costs more", ranks=(SUSPECT,))
    assert escalation.offer(run_id, [worse], steps) == []  # the suspect was asked lately
    assert sum(len(s.requests) for s in streams.values()) == 2


def test_a_slowness_that_is_over_asks_nobody_and_the_same_finding_ongoing_does(simulated):
    run_id, liveness, streams, _, _, steps = _live(simulated)
    text = f"rank {SUSPECT} costs 3.6 ms per step"
    over = Finding(kind="straggler", severity="warning", text=text + "; was slow in steps 3-16, not since",
                   ranks=(SUSPECT,), evidence={"pattern": "transient", "first_step": 3, "last_step": 16})  # fmt: skip
    assert Escalation(Commands(liveness)).offer(run_id, [over], steps) == []
    assert not _asked(streams)
    ongoing = Finding(kind="straggler", severity="warning", text=text, ranks=(SUSPECT,), evidence={})
    assert len(Escalation(Commands(liveness)).offer(run_id, [ongoing], steps)) == 1
    assert SUSPECT in _asked(streams)


def test_a_healthy_1024_rank_run_asks_nobody(simulated):
    healthy, liveness, streams, _, found, steps = _live(simulated, "healthy")
    assert not [f for f in found if f.severity in ("warning", "critical")], [f.text for f in found]
    assert Escalation(Commands(liveness)).offer(healthy, found, steps) == []
    assert not _asked(streams)


def test_a_hang_asks_the_ranks_it_names_for_stacks_and_no_reference(simulated):
    run_id, liveness, streams, _, _, steps = _live(simulated)
    hang = Finding(kind="hang", severity="critical", text="ranks 3 and 9 are missing from all_reduce #7", ranks=(3, 9))
    assert len(Escalation(Commands(liveness)).offer(run_id, [hang], steps)) == 1
    asked = _asked(streams)
    assert sorted(asked) == [3, 9] and {reqs[0].kind for reqs in asked.values()} == {"stacks"}


def test_a_run_not_streaming_here_asks_nobody(simulated):
    run_id, liveness, streams, _, found, steps = _live(simulated)
    for stream in streams.values():
        liveness.closed(stream)
    assert Escalation(Commands(liveness)).offer(run_id, found, steps) == []


def test_the_escalations_own_refresh_reads_nothing_while_no_run_streams_here(tmp_path):
    """``collect`` without --metrics-port or --alert-webhook refreshes findings for the escalation only:
    a running run in the data dir whose ranks stream elsewhere (or nowhere) is not computed."""
    from collector.server.metrics import MetricsEndpoint
    from collector.testing.collectors import live_collector

    data_dir = fake_runs.write_data_dir(tmp_path / "data", fake_runs.LIVE)
    with live_collector(data_dir) as collector:
        for streaming_only, computed in ((True, set()), (False, {fake_runs.LIVE.run_id})):
            metrics = MetricsEndpoint(collector.state, None, refresh_s=3600, streaming_only=streaming_only)
            try:
                metrics.refresh()
                assert set(metrics._computed) == computed
            finally:
                metrics.close()


@pytest.mark.parametrize("flags, on", [((), True), (("--no-auto-profile",), False), (("--auto-profile",), True)])
def test_collect_escalates_by_default_and_no_auto_profile_switches_it_off(tmp_path, flags, on):
    """Issue 32: automatic escalation is on unless ``collect --no-auto-profile`` (the findings refresh
    runs either way since issue 45: the Health RPC answers from it)."""
    import argparse

    from collector.tools.commands import collect

    parser = argparse.ArgumentParser()
    collect.add_arguments(parser)
    metrics = collect.settings_from_args(parser.parse_args(["--data-dir", str(tmp_path), *flags])).metrics
    assert metrics.auto_profile is on
