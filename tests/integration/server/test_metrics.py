"""The collector's Prometheus endpoint and alert webhook, end to end: a live 2-rank hook run
(rank 1 late to every all_reduce) streams into a real collector; a real Prometheus server
scrapes its /metrics and answers a ``rankscope_`` series per rank over its HTTP API; a local
HTTP server receives one webhook post per new finding, never the same finding twice.

Split by tier: the pure-function tests are in tests/unit/server/test_metrics.py."""

from __future__ import annotations

import json
import threading
import time

import pytest

from collector.server.alerts import AlertWebhook, check_url
from collector.server.metrics import MetricsEndpoint
from collector.testing.collectors import live_collector
from collector.testing.prometheus import PrometheusProcess, prometheus_installed
from collector.testing.webhook import WebhookReceiver
from tests.integration.rank import _hook_run_workers as script
from tests.integration.rank._rank_util import spawn

RUN = "metrics-job"
TOKEN = "metrics-token-" + "x" * 20


@pytest.fixture
def webhook_server():
    with WebhookReceiver() as receiver:
        yield receiver.url, receiver.bodies


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@pytest.mark.skipif(
    not prometheus_installed(), reason="Debian's prometheus is not installed (apt-get install prometheus)"
)
def test_prometheus_scrapes_a_live_run_and_the_webhook_gets_each_finding_once(tmp_path, webhook_server):
    url, posts = webhook_server
    with live_collector(tmp_path / "data") as collector:
        webhook = AlertWebhook(url, min_interval_s=0.1)
        metrics = MetricsEndpoint(collector.state, 0, refresh_s=0.5, webhook=webhook, token=TOKEN)
        ranks = threading.Thread(
            target=spawn, args=(script.straggler_until_stopped_worker, script.WORLD, collector.endpoint, tmp_path)
        )
        try:
            with PrometheusProcess([f"127.0.0.1:{metrics.port}"], tmp_path / "prometheus", bearer_token=TOKEN) as prom:
                ranks.start()
                series = _wait(
                    lambda: (r := prom.query(f'rankscope_step_time_seconds{{run="{RUN}"}}')) and len(r) == 2 and r,
                    120,
                    "a step-time series per rank in Prometheus",
                )
                assert collector.data_dir.exists() and not (tmp_path / "rank0.json").exists()  # still live
                assert sorted(s["metric"]["rank"] for s in series) == ["0", "1"]
                assert all(float(s["value"][1]) >= script.STRAGGLE_S * 0.5 for s in series)
                # The share settles above 0.9 as steps accumulate: under load the run's first collective can
                # find rank 0 later than the straggler (CI once read 8 of 9 at the first scrape).
                late_share = f'rankscope_last_arrival_share{{run="{RUN}",rank="{script.STRAGGLER_RANK}"}}'
                _wait(
                    lambda: (r := prom.query(late_share)) and float(r[0]["value"][1]) > 0.9,
                    60,
                    "the late rank's last-arrival share above 0.9",
                )
                found = _wait(
                    lambda: prom.query(f'rankscope_findings{{run="{RUN}",kind="straggler"}}'), 60, "a straggler finding"
                )
                assert found[0]["metric"]["severity"] == "warning"
                busbw = prom.query(f'rankscope_busbw_gbytes_per_second{{run="{RUN}",op="all_reduce"}}')
                assert sorted(s["metric"]["rank"] for s in busbw) == ["0", "1"]
                ingest = prom.query("rankscope_collector_records_durable_total")
                assert float(ingest[0]["value"][1]) > 0
                (tmp_path / "stop").touch()
                ranks.join(120)
                assert not ranks.is_alive()
            run_id = json.loads((tmp_path / "rank0.json").read_text())["run_id"]
            _wait(lambda: any(p["finding"]["kind"] == "straggler" for p in posts), 30, "the straggler post")
            time.sleep(2.0)  # four more refreshes: nothing is posted again
        finally:
            metrics.close()
    keys = [(p["run_id"], p["finding"]["kind"], p["finding"]["severity"], tuple(p["finding"]["ranks"])) for p in posts]
    assert len(keys) == len(set(keys)), f"a finding was posted twice: {keys}"
    straggler = [p for p in posts if p["finding"]["kind"] == "straggler"]
    assert len(straggler) == 1 and straggler[0]["run_id"] == run_id and straggler[0]["run"] == RUN
    assert straggler[0]["finding"]["ranks"] == [script.STRAGGLER_RANK]
    assert straggler[0]["text"].startswith(f"rankscope [warning] {RUN} ({run_id}): rank {script.STRAGGLER_RANK}")
    assert all(p["finding"]["severity"] != "ok" for p in posts)


def test_webhook_posts_are_rate_limited_and_a_bad_url_is_named(webhook_server):
    from collector.data.findings import Finding

    url, posts = webhook_server
    webhook = AlertWebhook(url, min_interval_s=0.3)
    found = [Finding(kind="straggler", severity="warning", text=f"rank {r} is late", ranks=(r,)) for r in range(3)] + [
        Finding(kind="comm_share", severity="ok", text="fine")
    ]
    assert webhook.offer("run-a", "a", found) == 3
    assert webhook.offer("run-a", "a", found) == 0  # seen: not again
    worse = Finding(kind="straggler", severity="critical", text="rank 0 is very late", ranks=(0,))
    assert webhook.offer("run-a", "a", [worse]) == 1  # worse is new
    started = time.monotonic()
    _wait(lambda: len(posts) == 4, 20, "four posts")
    assert time.monotonic() - started >= 0.3 * 3 * 0.9  # at most one post per min_interval_s
    webhook.close()
    assert [p["finding"]["ranks"] for p in posts] == [[0], [1], [2], [0]]
    with pytest.raises(ValueError, match=r"--alert-webhook: 'hooks.example.com/x' is not an http\(s\) URL"):
        check_url("hooks.example.com/x")


def test_each_stuck_collective_is_alerted_even_when_the_same_rank_holds_up_the_next(webhook_server):
    from collector.data.findings import Finding

    url, posts = webhook_server
    webhook = AlertWebhook(url, min_interval_s=0.0)

    def stuck(seq: int) -> Finding:
        evidence = {"group_name": "world", "seq": seq}
        return Finding(kind="stuck", severity="warning", text=f"stuck in #{seq}", ranks=(1,), evidence=evidence)

    assert webhook.offer("run-a", "a", [stuck(7)]) == 1
    assert webhook.offer("run-a", "a", [stuck(7)]) == 0  # the same collective, still stuck
    assert webhook.offer("run-a", "a", [stuck(9)]) == 1  # a later one: a new incident
    _wait(lambda: len(posts) == 2, 20, "two posts")
    webhook.close()
    assert [p["finding"]["evidence"]["seq"] for p in posts] == [7, 9]


def test_collect_refuses_a_taken_metrics_port(tmp_path):
    import socket

    from collector.tools.cli import main as rankscope

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = rankscope(["collect", "--data-dir", str(tmp_path / "data"), "--port", "0", "--metrics-port", str(port)])
    assert code == 2


def test_grafana_dashboard_queries_only_exported_metrics(tmp_path):
    """Every rankscope_ name docs/grafana-rankscope.json queries is one /metrics exports (families are
    listed, with their HELP, even before any run has data)."""
    import re
    import urllib.request
    from pathlib import Path

    dashboard = json.loads((Path(__file__).resolve().parents[3] / "docs" / "grafana-rankscope.json").read_text())
    queried = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"rankscope_\w+", target["expr"])
    }
    with live_collector(tmp_path / "data") as collector:
        metrics = MetricsEndpoint(collector.state, 0, refresh_s=0.2)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/metrics", timeout=10) as reply:
                text = reply.read().decode()
        finally:
            metrics.close()
    exported = set(re.findall(r"^# HELP (rankscope_\w+)", text, re.M))
    exported |= {f"{name}_total" for name in exported}
    assert queried and queried <= exported, queried - exported


def test_metrics_at_1024_ranks(tmp_path):
    """A live 1,024-rank run (the fake-run generator, rank 1023 late to every all_reduce): one series
    per rank for each per-rank metric, the late rank named by its last-arrival share and the finding."""
    from collector.testing.fake_runs import FakeRun, write_data_dir

    world = 1024
    run = FakeRun(run_id="big", name="n" * 300, world_size=world, steps=6, status="running", with_moe=False)
    write_data_dir(tmp_path / "data", run)
    with live_collector(tmp_path / "data") as collector:
        metrics = MetricsEndpoint(collector.state, None, refresh_s=3600, max_ranks=world)
        bounded = MetricsEndpoint(collector.state, None, refresh_s=3600)  # the default: the 256 worst ranks
        try:
            snapshot = metrics.refresh()
            worst = bounded.refresh()
        finally:
            metrics.close()
            bounded.close()
    for name, samples in worst.gauges.items():
        if name not in ("rankscope_findings", "rankscope_ranks_omitted"):
            ranks = {int(labels[2]) for labels, _ in samples}
            assert len(ranks) == 256 and world - 1 in ranks, name
    assert worst.gauges["rankscope_ranks_omitted"] == [(("big", "n" * 63 + "…"), world - 256.0)]
    assert snapshot.gauges["rankscope_ranks_omitted"] == [(("big", "n" * 63 + "…"), 0.0)]
    for name in (
        "rankscope_step",
        "rankscope_step_time_seconds",
        "rankscope_exposed_comm_share",
        "rankscope_last_arrival_share",
    ):
        ranks = sorted(int(labels[2]) for labels, _ in snapshot.gauges[name])
        assert ranks == list(range(world)), name
    assert all(0.0 <= value <= 1.0 for _, value in snapshot.gauges["rankscope_exposed_comm_share"])
    share = {int(labels[2]): value for labels, value in snapshot.gauges["rankscope_last_arrival_share"]}
    assert max(share, key=share.get) == world - 1
    kinds = {labels[2]: value for labels, value in snapshot.gauges["rankscope_findings"]}
    assert kinds.get("straggler", 0) >= 1  # one finding per op the late rank holds up


def _hook_log_only(collector, run_id: str) -> None:
    """A hook run that has only called ``hook.log`` so far: Hello and monitor rows, no comm."""
    from collector.data.codec import encode_batch
    from collector.testing.fake_runs import envelope, hello
    from collector.testing.streams import RawStream

    rank = RawStream(collector.channel())
    monitor = {"step": [1, 2], "tag": ["loss", "loss"], "value": [2.0, 1.5], "samples": [8, 8], "time_ns": [1, 2]}
    rank.send(hello(run_id, 1, run_id, 0, 1), envelope(run_id, 2, table=encode_batch("monitor", run_id, 0, monitor)))
    assert rank.wait_acked({1, 2})
    rank.finish()


def test_a_run_without_comm_rows_yet_freezes_neither_its_figures_nor_the_others(tmp_path):
    """The first seconds of every job (and a hook run that only logs): no comm rows. The refresh
    and ``rankscope health`` on it raised TypeError ('NAType' object is not iterable), so every
    run's series froze and the webhook stopped."""
    import subprocess
    import sys

    from collector.testing.fake_runs import FakeRun, stream

    busy = FakeRun(run_id="busy", world_size=2, steps=5, status="running", with_moe=False)
    with live_collector(tmp_path / "data") as collector:
        stream(collector.endpoint, busy)
        _hook_log_only(collector, "only-logs")
        metrics = MetricsEndpoint(collector.state, None, refresh_s=3600)
        try:
            snapshot = metrics.refresh()
        finally:
            metrics.close()
    assert metrics.run_errors == {}
    assert sorted(labels[2] for labels, _ in snapshot.gauges["rankscope_step"]) == ["0", "1"]
    assert {labels[0] for labels, _ in snapshot.gauges["rankscope_ranks_omitted"]} == {"busy", "only-logs"}
    health = subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", "health", "only-logs", "--data-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in health.stderr, health.stderr
    assert health.returncode in (0, 1), (health.returncode, health.stdout, health.stderr)
    assert health.stdout.startswith("only-logs: ")


def test_one_failing_run_keeps_its_previous_figures_and_counts_its_errors_the_others_go_on(tmp_path, monkeypatch):
    """A run whose figures cannot be computed (here its step analysis raises) keeps its previous
    series, is counted in rankscope_metrics_run_errors_total{run_id}, and the other run refreshes
    and still reaches the webhook."""
    import urllib.request

    from collector.data import queries
    from collector.testing.fake_runs import FakeRun, write_data_dir

    runs = [FakeRun(run_id=r, world_size=2, steps=6, status="running", with_moe=False) for r in ("good", "bad")]
    write_data_dir(tmp_path / "data", *runs)
    with live_collector(tmp_path / "data") as collector:
        # idle_refresh_s=0: every refresh computes every run again (the data here does not change)
        metrics = MetricsEndpoint(collector.state, 0, refresh_s=3600, idle_refresh_s=0)
        try:
            first = metrics.refresh()
            metrics.snapshot = first
            real = queries.step_analysis

            def failing_for_bad(cat, run_id):
                if run_id == "bad":
                    raise RuntimeError("a segment of run 'bad' cannot be read")
                return real(cat, run_id)

            monkeypatch.setattr(queries, "step_analysis", failing_for_bad)
            second = metrics.refresh()
            metrics.snapshot = second
            metrics.refresh()
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/metrics", timeout=10) as reply:
                text = reply.read().decode()
        finally:
            metrics.close()

    def of(snapshot, run_id):
        return sorted((n, labels, v) for n, s in snapshot.gauges.items() for labels, v in s if labels[0] == run_id)

    assert of(second, "bad") == of(first, "bad") and of(first, "bad")
    assert of(second, "good") and metrics.run_errors == {"bad": 2}
    assert 'rankscope_metrics_run_errors_total{run_id="bad"} 2.0' in text


def test_metrics_answer_only_with_the_collectors_token(tmp_path):
    """``rankscope collect --token T --metrics-port P``: /metrics wants ``Authorization: Bearer T``
    like every RPC (it answered anyone before)."""
    import urllib.error
    import urllib.request

    from collector.tools.launch import CollectorProcess

    with CollectorProcess(tmp_path / "data", "--token", TOKEN, "--metrics-port", "0") as collector:
        url = f"http://127.0.0.1:{collector.metrics_port}/metrics"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10)
            assert refused.value.code == 401
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            assert "rankscope_collector_records_durable_total" in reply.read().decode()
