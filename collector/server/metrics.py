"""``rankscope collect --metrics-port P``: a Prometheus ``/metrics`` endpoint for live runs.

Per run (labels ``run_id`` and ``run``, the name) and rank, for runs still running and those
that ended in the last ``keep_ended_s``:

| metric | what |
|---|---|
| ``rankscope_step`` | the newest step the rank has sent comm records for |
| ``rankscope_step_time_seconds`` | mean step time over the last ``window`` finished steps |
| ``rankscope_exposed_comm_share`` | communication not beside compute / step time, same steps (timed runs) |
| ``rankscope_busbw_gbytes_per_second{op}`` | mean bus bandwidth per op over the last ``window`` steps |
| ``rankscope_last_arrival_share`` | share of the run's collective instances this rank arrived last to |
| ``rankscope_findings{kind,severity}`` | findings of the run (collector.data.findings), per run |

and the collector's own counters: ``rankscope_collector_records_durable_total``,
``rankscope_collector_batches_rejected_total``, ``rankscope_collector_open_streams``,
``rankscope_collector_uptime_seconds``, and ``rankscope_metrics_refresh_seconds`` /
``rankscope_metrics_refresh_errors_total`` for this endpoint's own work.

Threads. Ingest never waits on this: the per-run figures are computed by a thread of their own
every ``refresh_s`` with read-only catalog queries (the same ones the dashboard runs) and kept
as a snapshot; a scrape only reads the snapshot and the collector's counters. A refresh that
fails (a segment compacted away under it, a bad run) is logged and counted, and the previous
snapshot stays. Each refresh also hands the runs' findings to the alert webhook, if one is set
(collector.server.alerts), which posts the new ones.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from collector.data import findings, queries
from collector.data.findings.communication import recent_exposed_share
from collector.server.alerts import AlertWebhook

log = logging.getLogger("rankscope.metrics")

RUN_LABELS = ("run_id", "run")


@dataclass
class Snapshot:
    """What the last refresh computed: metric name -> [(label values, value)]."""

    gauges: dict[str, list[tuple[tuple[str, ...], float]]] = field(default_factory=dict)

    def add(self, name: str, labels: tuple, value) -> None:
        if value is None or value != value:  # unknown yet (NaN, NULL): no sample rather than a made-up one
            return
        self.gauges.setdefault(name, []).append((tuple(str(v) for v in labels), float(value)))


# name -> (help, label names); every per-run gauge the refresh fills
GAUGES = {
    "rankscope_step": ("Newest step with comm records", (*RUN_LABELS, "rank")),
    "rankscope_step_time_seconds": ("Mean step time over the recent finished steps", (*RUN_LABELS, "rank")),
    "rankscope_exposed_comm_share": (
        "Communication not overlapped with compute / step time, recent steps",
        (*RUN_LABELS, "rank"),
    ),
    "rankscope_busbw_gbytes_per_second": ("Mean bus bandwidth per op, recent steps", (*RUN_LABELS, "rank", "op")),
    "rankscope_last_arrival_share": ("Share of collective instances this rank arrived last to", (*RUN_LABELS, "rank")),
    "rankscope_findings": ("Findings of the run by kind and severity", (*RUN_LABELS, "kind", "severity")),
}


class MetricsEndpoint:
    """Serves /metrics on ``host:port`` for the collector whose ``state`` it is given (``port`` None:
    no endpoint, only the refresh that feeds the alert webhook; 0 picks a free port)."""

    def __init__(
        self,
        state,
        port: int | None,
        host: str = "127.0.0.1",
        *,
        refresh_s: float = 5.0,
        window: int = 10,
        keep_ended_s: float = 600.0,
        webhook: AlertWebhook | None = None,
    ) -> None:
        self.state = state
        self.refresh_s, self.window, self.keep_ended_s = refresh_s, window, keep_ended_s
        self.webhook = webhook
        self.snapshot = Snapshot()
        self.refresh_seconds = 0.0
        self.refresh_errors = 0
        self._catalog: queries.Catalog | None = None
        self._stop = threading.Event()
        self._server = None
        self.port = None
        if port is not None:
            self._serve(host, port)
        self._thread = threading.Thread(target=self._run, name="rankscope-metrics", daemon=True)
        self._thread.start()

    def _serve(self, host: str, port: int) -> None:
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            raise RuntimeError(
                "--metrics-port needs the prometheus_client package: pip install 'rankscope[collector]'"
            ) from None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        try:
            self._server, _ = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            raise OSError(f"--metrics-port: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self.port = self._server.server_address[1]

    # ---------------------------------------------------------------- scrape (prometheus_client calls this)

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.state
        own = (
            (CounterMetricFamily, "rankscope_collector_records_durable", "Records committed", s.store.records_durable),
            (CounterMetricFamily, "rankscope_collector_batches_rejected", "Batches refused", s.batches_rejected),
            (GaugeMetricFamily, "rankscope_collector_open_streams", "Rank streams open now", s.open_streams),
            (GaugeMetricFamily, "rankscope_collector_uptime_seconds", "Since start", time.monotonic() - s.started),
            (GaugeMetricFamily, "rankscope_metrics_refresh_seconds", "Last refresh's duration", self.refresh_seconds),
            (CounterMetricFamily, "rankscope_metrics_refresh_errors", "Refreshes that failed", self.refresh_errors),
        )
        for family, name, help_text, value in own:
            yield family(name, help_text, value=value)
        snapshot = self.snapshot
        for name, (help_text, labels) in GAUGES.items():
            family = GaugeMetricFamily(name, help_text, labels=labels)
            for label_values, value in snapshot.gauges.get(name, ()):
                family.add_metric(label_values, value)
            yield family

    # ---------------------------------------------------------------- refresh (its own thread)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.snapshot = self.refresh()
            except Exception:
                self.refresh_errors += 1
                log.exception("rankscope: refreshing the /metrics figures failed; the previous ones stay")
            self.refresh_seconds = time.monotonic() - started
            self._stop.wait(self.refresh_s)

    def refresh(self) -> Snapshot:
        if self._catalog is None:
            self._catalog = queries.Catalog(self.state.data_dir)
        cat = self._catalog
        snapshot = Snapshot()
        for run in queries.live_runs(cat, self.keep_ended_s).itertuples():
            run_labels = (run.run_id, run.name)
            for r in queries.recent_rank_steps(cat, run.run_id, self.window).itertuples():
                labels = (*run_labels, int(r.rank))
                snapshot.add("rankscope_step", labels, r.step)
                snapshot.add("rankscope_step_time_seconds", labels, r.step_time_s)
            # Exposed communication is the Overview's (collector.data.findings.communication), from the
            # same per-step analysis the findings below read.
            steps = queries.step_analysis(cat, run.run_id)
            for r in recent_exposed_share(steps, self.window).itertuples():
                snapshot.add("rankscope_exposed_comm_share", (*run_labels, int(r.rank)), r.exposed)
            for r in queries.recent_busbw(cat, run.run_id, self.window).itertuples():
                snapshot.add("rankscope_busbw_gbytes_per_second", (*run_labels, int(r.rank), r.op), r.busbw_gbs)
            rollup = queries.comm_rollup(cat, run.run_id)
            for r in queries.last_arrival_share(rollup).itertuples():
                snapshot.add("rankscope_last_arrival_share", (*run_labels, int(r.rank)), r.share)
            found = findings.for_run(cat, run.run_id, int(run.world_size), rollup=rollup, steps=steps)
            counts: dict[tuple[str, str], int] = {}
            for f in found:
                counts[(f.kind, f.severity)] = counts.get((f.kind, f.severity), 0) + 1
            for (kind, severity), n in counts.items():
                snapshot.add("rankscope_findings", (*run_labels, kind, severity), n)
            if self.webhook is not None:
                self.webhook.offer(run.run_id, run.name, found)
        return snapshot

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self.webhook is not None:
            self.webhook.close()
        if self._catalog is not None:
            self._catalog.close()
