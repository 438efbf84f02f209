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
| ``rankscope_findings{kind,severity}`` | findings of the run as held at the scrape (collector.server.live_findings) |
| ``rankscope_ranks_omitted`` | ranks of the run whose per-rank series are left out (``max_ranks``) |
| ``rankscope_whatif_slowdown`` | the what-if replay's S over the stored steps (collector.data.whatif; runs it models) |
| ``rankscope_whatif_worker_slowdown{rank}`` | S with only that worker as run, the 5 worst workers |
| ``rankscope_whatif_stage_slowdown{stage}`` | S with only that stage as run |

and the collector's own counters: ``rankscope_collector_records_durable_total``,
``rankscope_collector_batches_rejected_total``, ``rankscope_collector_open_streams``,
``rankscope_collector_uptime_seconds``, ``rankscope_collector_resent_records_total`` /
``rankscope_collector_resent_runs`` (earlier runs' spool files resent to it, collector.server.resends),
``rankscope_collector_write_failing`` / ``rankscope_collector_commit_failures_total`` (a full disk:
collector.server.write_status),
and ``rankscope_metrics_refresh_seconds`` /
``rankscope_metrics_refresh_errors_total`` / ``rankscope_metrics_run_errors_total{run_id}``
for this endpoint's own work.

Access: with the collector's token, /metrics answers only a request carrying
``Authorization: Bearer <token>`` (401 otherwise), as every RPC does; Prometheus sends it with
``authorization: {credentials: <token>}`` in its scrape config.

Cardinality: at most ``max_runs`` runs are exported: those with a rank streaming to this collector
now first, then the most recently started; ``rankscope_runs_omitted`` says how many live runs were
left out (a data dir with 10,000 runs that never sent RunEnd exports ``max_runs`` of them, not
10,000). Per run, the per-rank series are those of the ``max_ranks`` worst ranks (most often
last to arrive, then slowest step; all of them for runs up to that size), and
``rankscope_ranks_omitted`` says how many were left out; the ``run`` and ``op`` labels are cut to
``MAX_LABEL_CHARS`` characters (run ids are at most 128 by the layout's rule).

Threads. Ingest never waits on this: the per-run figures are computed by a thread of their own
every ``refresh_s`` with read-only catalog queries (the same ones the dashboard runs) and kept
as a snapshot; a scrape only reads the snapshot and the collector's counters. A run's figures are
computed again when its data changed (its segments' ``queries.data_version``), when a rank of it
streams here (its silence or hang is a matter of time, not of data), after its last attempt
failed, or ``idle_refresh_s`` after they were computed; otherwise the previous ones stay, so an
idle collector's refresh is one ``runs`` query and a folder listing per exported run. A refresh that
fails (a segment compacted away under it, a bad run) is logged and counted, and the previous
snapshot stays. One run's failure stays with that run: its series keep their previous values,
``rankscope_metrics_run_errors_total{run_id}`` counts it (logged with its traceback the first time,
in one line after), and every other run is refreshed and alerted on as usual. Each refresh also
hands the runs' findings to the collector's held findings (collector.server.live_findings: what the
Health RPC answers), to the alert webhook, if one is set (collector.server.alerts), which posts
the new ones, and to the escalation, if one is set (collector.server.escalation), which asks the
ranks they name for evidence. The live part of the findings (stuck and hung collectives) reaches
the webhook from the liveness checker as it changes, and ``rankscope_findings`` at every scrape.
"""

from __future__ import annotations

import hmac
import logging
import socket
import threading
import time
from dataclasses import dataclass, field

from collector.data import findings, queries, trace_diff, whatif
from collector.data.findings.communication import recent_exposed_share
from collector.server.alerts import AlertWebhook

log = logging.getLogger("rankscope.metrics")

RUN_LABELS = ("run_id", "run")
MAX_LABEL_CHARS = 64  # a run's name or an op, as a label value
MAX_RANKS = 256  # per-rank series per run (the worst ranks)
MAX_RUNS = 64  # runs exported (streaming here first, then the newest)
IDLE_REFRESH_S = 300.0  # figures of a run with no new data and no stream here are computed again this often


def _counts(found) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for f in found:
        counts[(f.kind, f.severity)] = counts.get((f.kind, f.severity), 0) + 1
    return counts


def label(value, limit: int = MAX_LABEL_CHARS) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class Snapshot:
    """What the last refresh computed: metric name -> [(label values, value)]."""

    gauges: dict[str, list[tuple[tuple[str, ...], float]]] = field(default_factory=dict)

    def add(self, name: str, labels: tuple, value) -> None:
        try:
            number = float(value)
        except (TypeError, ValueError):  # None, pd.NA: unknown yet
            return
        if number != number:  # NaN: unknown yet; no sample rather than a made-up one
            return
        self.gauges.setdefault(name, []).append((tuple(str(v) for v in labels), number))


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
    "rankscope_ranks_omitted": ("Ranks of the run whose per-rank series are left out (max_ranks)", RUN_LABELS),
    "rankscope_whatif_slowdown": ("What-if replay: step time as run / with no stragglers (S)", RUN_LABELS),
    "rankscope_whatif_worker_slowdown": ("What-if replay: S with only this worker as run", (*RUN_LABELS, "rank")),
    "rankscope_whatif_stage_slowdown": ("What-if replay: S with only this stage as run", (*RUN_LABELS, "stage")),
}
WHATIF_WORKERS = 5  # the worst workers whose what-if score is exported


@dataclass
class _Computed:
    """One run's figures as last computed, and from which data."""

    version: str
    at: float  # time.monotonic()
    samples: Snapshot


class MetricsEndpoint:
    """Serves /metrics on ``host:port`` for the collector whose ``state`` it is given (``port`` None:
    no endpoint, only the refresh that feeds the alert webhook; 0 picks a free port). ``streaming_only``:
    refresh only the runs streaming here, and nothing (not even the runs query) while none does: what
    the escalation alone needs, so an idle collector stays idle."""

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
        escalation=None,
        token: str | None = None,
        max_ranks: int = MAX_RANKS,
        max_runs: int = MAX_RUNS,
        idle_refresh_s: float = IDLE_REFRESH_S,
        streaming_only: bool = False,
    ) -> None:
        self.state = state
        self.refresh_s, self.window, self.keep_ended_s = refresh_s, window, keep_ended_s
        self.webhook = webhook
        self.escalation = escalation
        self.streaming_only = streaming_only
        if max_runs < 1:
            raise ValueError(f"--metrics-max-runs must be at least 1, got {max_runs}")
        self.max_ranks, self.max_runs, self.idle_refresh_s = max_ranks, max_runs, idle_refresh_s
        self._computed: dict[str, _Computed] = {}  # run_id -> its figures as last computed
        self._evidence: dict[str, tuple] = {}  # run_id -> (its captures, their diffs): diffed once per capture
        self._failed: set[str] = set()  # runs whose last attempt failed: tried again at every refresh
        self._expected_auth = f"Bearer {token}".encode() if token else None
        self.snapshot = Snapshot()
        self.refresh_seconds = 0.0
        self.refresh_errors = 0
        self.runs_omitted = 0  # live runs the last refresh left out (max_runs)
        self.run_errors: dict[str, int] = {}  # run_id -> refreshes of that run that failed
        self._catalog: queries.Catalog | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()  # a new run streams here: refresh now, not at the next tick
        self._wake_after = 0.0  # monotonic: the refresh waits until the store has made rows submitted by then readable
        self._server = None
        self.port = None
        if port is not None:
            self._serve(host, port)
        self.held = getattr(state, "findings", None)  # collector.server.live_findings.LiveFindings
        liveness = getattr(state, "liveness", None)
        if liveness is not None:
            liveness.on_new_run = self.refresh_soon
            liveness.on_rank_gone = self.refresh_soon  # the stored part catches up with a crash's last rows
        if self.held is not None and webhook is not None:
            self.held.listen(webhook.offer)  # stuck, hung, cleared: posted as judged, not at the next refresh
        self._thread = threading.Thread(target=self._run, name="rankscope-metrics", daemon=True)
        self._thread.start()

    def _serve(self, host: str, port: int) -> None:
        try:
            from prometheus_client import CollectorRegistry, make_wsgi_app
            from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler
        except ImportError:
            raise RuntimeError(
                "--metrics-port needs the prometheus_client package: pip install 'rankscope[collector]'"
            ) from None
        from wsgiref.simple_server import make_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        app = make_wsgi_app(registry)

        def guarded(environ, start_response):
            if self._expected_auth is not None:
                sent = environ.get("HTTP_AUTHORIZATION", "").encode("latin-1", "replace")
                if not hmac.compare_digest(sent, self._expected_auth):
                    headers = [("Content-Type", "text/plain; charset=utf-8"), ("WWW-Authenticate", "Bearer")]
                    start_response("401 Unauthorized", headers)
                    return [b"missing or wrong bearer token: send 'Authorization: Bearer <the collector's token>'\n"]
            return app(environ, start_response)

        class Server(ThreadingWSGIServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        try:
            self._server = make_server(host, port, guarded, Server, handler_class=_SilentHandler)
        except OSError as exc:
            raise OSError(f"--metrics-port: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        threading.Thread(target=self._server.serve_forever, name="rankscope-metrics-http", daemon=True).start()
        self.port = self._server.server_address[1]

    # ---------------------------------------------------------------- scrape (prometheus_client calls this)

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.state
        writes = s.store.write_status
        own = (
            (CounterMetricFamily, "rankscope_collector_records_durable", "Records committed", s.store.records_durable),
            (CounterMetricFamily, "rankscope_collector_batches_rejected", "Batches refused", s.batches_rejected),
            (GaugeMetricFamily, "rankscope_collector_open_streams", "Rank streams open now", s.open_streams),
            (GaugeMetricFamily, "rankscope_collector_uptime_seconds", "Since start", time.monotonic() - s.started),
            (GaugeMetricFamily, "rankscope_metrics_refresh_seconds", "Last refresh's duration", self.refresh_seconds),
            (CounterMetricFamily, "rankscope_metrics_refresh_errors", "Refreshes that failed", self.refresh_errors),
            (GaugeMetricFamily, "rankscope_runs_omitted", "Live runs left out (max_runs)", self.runs_omitted),
            # earlier runs' spool files resent by ranks (collector.server.resends), since the data dir began
            (
                CounterMetricFamily,
                "rankscope_collector_resent_records",
                "Records of resent spool files",
                s.resends.records,
            ),
            (GaugeMetricFamily, "rankscope_collector_resent_runs", "Runs with resent spool files", len(s.resends.runs)),
            # 1 while commits fail (disk full: nothing is acked; collector.server.write_status)
            (GaugeMetricFamily, "rankscope_collector_write_failing", "Commits failing now", int(bool(writes.failing))),
            (CounterMetricFamily, "rankscope_collector_commit_failures", "Commits that failed", writes.failures),
        )
        for family, name, help_text, value in own:
            yield family(name, help_text, value=value)
        run_errors = CounterMetricFamily(
            "rankscope_metrics_run_errors", "Refreshes of a run's figures that failed", labels=("run_id",)
        )
        for run_id, n in list(self.run_errors.items()):
            run_errors.add_metric((run_id,), n)
        yield run_errors
        snapshot = self.snapshot
        if self.held is not None:  # the findings as held now (live judgment included), not as last refreshed
            snapshot = Snapshot({**snapshot.gauges, "rankscope_findings": self._held_counts()})
        for name, (help_text, labels) in GAUGES.items():
            family = GaugeMetricFamily(name, help_text, labels=labels)
            for label_values, value in snapshot.gauges.get(name, ()):
                family.add_metric(label_values, value)
            yield family

    def _held_counts(self) -> list:
        samples = Snapshot()
        for run_id in self.held.runs():
            run_labels = (run_id, label(self.held.name_of(run_id)))
            for (kind, severity), n in _counts(self.held.current(run_id)).items():
                samples.add("rankscope_findings", (*run_labels, kind, severity), n)
        return samples.gauges.get("rankscope_findings", [])

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
            self._wake.wait(self.refresh_s)
            self._wake.clear()
            self._until_readable(self._wake_after)

    def refresh_soon(self) -> None:
        """Refresh once the store has committed what was submitted until now (a new run's Hello): a
        run's findings are held, and Health answers from them, within a second of its start instead
        of at the next ``refresh_s`` tick (a desync or hang in a young run is told live)."""
        self._wake_after = time.monotonic()
        store = getattr(self.state, "store", None)
        if store is not None and hasattr(store, "flush_soon"):
            store.flush_soon()
        self._wake.set()

    def _until_readable(self, since: float, limit_s: float = 2.0) -> None:
        store = getattr(self.state, "store", None)
        deadline = time.monotonic() + limit_s
        while (
            store is not None
            and getattr(store, "visible_through", since) < since
            and time.monotonic() < deadline
            and not self._stop.is_set()
        ):
            time.sleep(0.02)

    def exported_runs(self):
        """(the live runs to export, how many were left out): streaming here first, then the newest."""
        liveness = getattr(self.state, "liveness", None)
        streaming = liveness.streaming_runs() if liveness is not None else set()
        if self.streaming_only and not streaming:
            return [], 0, streaming
        runs = queries.live_runs(self._catalog, self.keep_ended_s, streaming)  # newest first
        if self.streaming_only:
            runs = runs[runs.run_id.isin(list(streaming))]
        here = runs.run_id.isin(list(streaming))
        ordered = list(runs[here].itertuples()) + list(runs[~here].itertuples())
        return ordered[: self.max_runs], max(0, len(ordered) - self.max_runs), streaming

    def refresh(self) -> Snapshot:
        if self._catalog is None:
            self._catalog = queries.Catalog(self.state.data_dir)
        snapshot = Snapshot()
        chosen, self.runs_omitted, streaming = self.exported_runs()
        live = set()
        for run in chosen:
            live.add(run.run_id)
            last = self._computed.get(run.run_id)
            try:
                version = queries.data_version(self.state.data_dir, run.run_id)
                if (
                    last is not None
                    and last.version == version
                    and run.run_id not in streaming
                    and run.run_id not in self._failed
                    and time.monotonic() - last.at < self.idle_refresh_s
                ):
                    mine = last.samples  # nothing new: the figures stand (no new findings for the webhook either)
                else:
                    at = time.monotonic()
                    mine = self._refresh_run(run)
                    self._computed[run.run_id] = _Computed(version, at, mine)
                    self._failed.discard(run.run_id)
            except Exception:
                # one run's problem stays with it: its previous figures stay, the other runs go on
                self._failed.add(run.run_id)
                failures = self.run_errors[run.run_id] = self.run_errors.get(run.run_id, 0) + 1
                if failures == 1:
                    log.exception("rankscope: /metrics figures of run %s failed; its previous ones stay", run.run_id)
                else:
                    log.warning("rankscope: /metrics figures of run %s failed again (%d times)", run.run_id, failures)
                mine = last.samples if last is not None else Snapshot()
            for name, samples in mine.gauges.items():
                snapshot.gauges.setdefault(name, []).extend(samples)
        for known in (self.run_errors, self._computed, self._evidence):  # bounded by the exported runs
            for run_id in [r for r in known if r not in live]:
                del known[run_id]
        self._failed &= live
        if self.held is not None:
            self.held.keep(live)
        return snapshot

    def _refresh_run(self, run) -> Snapshot:
        """One run's figures, in a snapshot of their own (merged only once all are computed)."""
        cat = self._catalog
        as_of = getattr(getattr(self.state, "store", None), "visible_through", None)  # before any query pins D
        mine = Snapshot()
        run_labels = (run.run_id, label(run.name))
        per_rank: dict[str, dict[int, list]] = {}  # gauge -> rank -> [(extra labels, value)]

        def rank_sample(name: str, rank, value, *extra) -> None:
            per_rank.setdefault(name, {}).setdefault(int(rank), []).append((extra, value))

        for r in queries.recent_rank_steps(cat, run.run_id, self.window).itertuples():
            rank_sample("rankscope_step", r.rank, r.step)
            rank_sample("rankscope_step_time_seconds", r.rank, r.step_time_s)
        # Exposed communication is the Overview's (collector.data.findings.communication), from the
        # same per-step analysis the findings below read.
        steps = queries.step_analysis(cat, run.run_id)
        for r in recent_exposed_share(steps, self.window).itertuples():
            rank_sample("rankscope_exposed_comm_share", r.rank, r.exposed)
        for r in queries.recent_busbw(cat, run.run_id, self.window).itertuples():
            rank_sample("rankscope_busbw_gbytes_per_second", r.rank, r.busbw_gbs, label(r.op))
        rollup = queries.comm_rollup(cat, run.run_id)
        for r in queries.last_arrival_share(rollup).itertuples():
            rank_sample("rankscope_last_arrival_share", r.rank, r.share)
        ranks = {rank for samples in per_rank.values() for rank in samples}
        shown = self._worst(ranks, per_rank)
        for name, samples in per_rank.items():
            for rank in sorted(shown & samples.keys()):
                for extra, value in samples[rank]:
                    mine.add(name, (*run_labels, rank, *extra), value)
        mine.add("rankscope_ranks_omitted", run_labels, len(ranks) - len(shown))
        # one replay for the findings and the gauges: the run's data changes between two asks
        replay = whatif.replay_or_none(cat, run.run_id)
        found = findings.for_run(cat, run.run_id, int(run.world_size), rollup=rollup, steps=steps, replay=replay)
        self._whatif(replay, run_labels, mine)
        for (kind, severity), n in _counts(found).items():
            mine.add("rankscope_findings", (*run_labels, kind, severity), n)
        if self.held is not None:
            self.held.stored(run.run_id, run.name, found, as_of, self._captured(run.run_id))
            found = self.held.current(run.run_id)  # the live judgment in place of the stored one
        if self.webhook is not None:
            self.webhook.offer(run.run_id, run.name, found)
        if self.escalation is not None:
            self.escalation.offer(run.run_id, found, steps)
        return mine

    def _captured(self, run_id: str) -> list[dict]:
        """The run's captured evidence (trace_diff.run_evidence: what `rankscope health` prints as
        ``evidence:`` lines), its traces read and diffed again only when its captures change."""
        if not self._catalog.has_rows("artifacts", run_id):
            return []
        rows = trace_diff.captures(self._catalog, run_id)
        key = tuple(zip(rows.request_id, rows["rank"], rows.status))
        cached = self._evidence.get(run_id)
        if cached is None or cached[0] != key:
            cached = self._evidence[run_id] = (key, trace_diff.evidence(self.state.data_dir, rows))
        return cached[1]

    @staticmethod
    def _whatif(result: dict | None, run_labels: tuple, mine: Snapshot) -> None:
        """S and its decomposition by the worst workers and by stage, from the replay the findings
        read (None: the run has nothing it models): live, below the findings' 1.05 too."""
        if result is None:
            return
        mine.add("rankscope_whatif_slowdown", run_labels, result["slowdown"])
        for rank, value in list(result["by_worker"].items())[:WHATIF_WORKERS]:
            mine.add("rankscope_whatif_worker_slowdown", (*run_labels, rank), value)
        for stage, value in result["by_stage"].items():
            mine.add("rankscope_whatif_stage_slowdown", (*run_labels, stage), value)

    def _worst(self, ranks: set[int], per_rank: dict) -> set[int]:
        """The ``max_ranks`` ranks to export: most often last to arrive, then slowest steps."""
        if len(ranks) <= self.max_ranks:
            return ranks

        def value(name: str, rank: int) -> float:
            samples = per_rank.get(name, {}).get(rank)
            v = samples[0][1] if samples else None
            return -1.0 if v is None or v != v else float(v)

        def badness(rank: int) -> tuple:
            return (
                value("rankscope_last_arrival_share", rank),
                value("rankscope_step_time_seconds", rank),
                -rank,
            )

        return set(sorted(ranks, key=badness, reverse=True)[: self.max_ranks])

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(30)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self.webhook is not None:
            self.webhook.close()
        if self._catalog is not None and not self._thread.is_alive():
            # a refresh still running (a loaded machine: over 30 s) holds the connection: closing it
            # under that call aborts the process (DuckDB "connection is busy") before the store commits
            self._catalog.close()
