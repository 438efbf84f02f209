"""Run a collector from its settings (collector.server.settings) until told to stop.

``serve`` neither prints nor decides an exit code. What keeps a collector from starting is
raised: a ValueError for the settings' fault (``ConfigError``, ``SecurityConfigError``: a TLS
file that cannot be read, ``SettingsError``: a taken --metrics-port, a bad webhook URL), an
OSError or ``DataDirBusy`` for the machine's (an address in use, another collector owning the data
dir). Its caller learns through callbacks when it listens (``Listening``) and when it begins to
stop; ``rankscope collect`` (collector/tools/commands/collect.py) turns all of these into its
messages and exit codes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from collector.data import live_collector
from collector.server.request_files import RequestFiles
from collector.server.service import create_server
from collector.server.settings import CollectorSettings, SettingsError

COMMIT_GRACE_S = 5  # s the open streams get to finish once the collector stops


@dataclass(frozen=True)
class Listening:
    """Where a started collector listens, and how."""

    host: str  # as in its address (an IPv6 host in brackets)
    port: int  # the one bound (a free one for port 0)
    tls: bool
    token_required: bool
    data_dir: Path
    metrics_port: int | None  # where /metrics is served, if it is


def serve(
    settings: CollectorSettings,
    stop: threading.Event,
    *,
    on_ready: Callable[[Listening], None] | None = None,
    on_stopping: Callable[[], None] | None = None,
    compact_now: threading.Event | None = None,
    on_compacted: Callable[[int], None] | None = None,
) -> None:
    """Run a collector until ``stop`` is set, then commit what is buffered and return.

    ``compact_now`` set (``rankscope collect`` sets it on SIGUSR1) runs one compaction pass on this
    thread, then ``on_compacted(merges)``: for an operator, and for tests that need a merge, a
    rollup or a retention pass to have happened rather than wait for the nice +10 thread's scan."""
    access = settings.security
    server, bound, state = create_server(
        settings.address,
        settings.data_dir,
        access.token,
        tls=access.tls,
        writer=settings.writer,
        store_config=settings.store,
        compaction_config=settings.compaction,
        stream_limits=settings.streams,
    )
    metrics = requested = advertised = None
    try:
        # always: the findings the Health RPC answers from (collector.server.live_findings); with no
        # --metrics-port nor webhook it follows only the runs streaming here, so an idle collector idles
        metrics = _start_metrics(settings, state)
        server.start()
        requested = RequestFiles(state)  # the dashboard's "profile now" (collector.data.requests)
        listening = Listening(
            host=settings.address.rsplit(":", 1)[0],
            port=bound,
            tls=access.tls is not None,
            token_required=access.token is not None,
            data_dir=state.data_dir,
            metrics_port=metrics.port if metrics is not None else None,
        )
        # D/collector.json: how the CLI's profile/stacks/replay/health find this collector with no flag
        advertised = live_collector.dialable(listening.host, bound)
        live_collector.write(state.data_dir, advertised, listening.token_required, os.getpid(), tls=listening.tls)
        if on_ready is not None:
            on_ready(listening)
        while not stop.wait(0.2):  # wakes now and then, so a signal handler in this thread runs
            if compact_now is not None and compact_now.is_set():
                compact_now.clear()
                merges = state.compactor.run_pass()
                if on_compacted is not None:
                    on_compacted(merges)
        if on_stopping is not None:
            on_stopping()
    finally:
        if advertised is not None:
            live_collector.remove(state.data_dir, os.getpid(), advertised)
        if requested is not None:
            requested.close()
        server.stop(grace=COMMIT_GRACE_S).wait()
        if metrics is not None:
            metrics.close()
        state.close()


def _escalation(asked, state):
    """What the collector asks unprompted: profiles (on by default), link probes (off by default)."""
    from collector.server.escalation import Escalation

    if not (asked.auto_profile or asked.auto_probe):
        return None
    return Escalation(state.commands, profile=asked.auto_profile, prober=state.prober if asked.auto_probe else None)


def _start_metrics(settings: CollectorSettings, state):
    """The findings refresh, with /metrics, the alert webhook and the escalation as asked."""
    # imported here, not at the top: the findings pull in pandas, the endpoint prometheus_client
    from collector.server.alerts import AlertWebhook
    from collector.server.metrics import MetricsEndpoint

    asked = settings.metrics
    webhook = None
    try:
        webhook = AlertWebhook(asked.alert_webhook) if asked.alert_webhook else None
        return MetricsEndpoint(
            state,
            asked.port,
            settings.host.strip("[]"),
            webhook=webhook,
            escalation=_escalation(asked, state),
            streaming_only=asked.port is None and not asked.alert_webhook,
            token=settings.security.token,
            **({"max_runs": asked.max_runs} if asked.max_runs is not None else {}),
        )
    except (ValueError, RuntimeError, OSError) as exc:
        if webhook is not None:
            webhook.close()
        raise SettingsError(str(exc)) from exc
