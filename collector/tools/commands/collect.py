"""``rankscope collect``: its flags, the collector settings they make, and its exit codes
(2: a setting the collector cannot run with, 1: the machine's or the data dir's refusal)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

from collector.tools.commands.common import data_dir_arg

if TYPE_CHECKING:
    from collector.server.serve import Listening

NAME = "collect"
HELP = "Run the gRPC collector that writes Parquet and the DuckDB catalog."
EXAMPLES = """
    rankscope collect
    rankscope collect --data-dir /scratch/rs --port 50051 --token "$RANKSCOPE_TOKEN"
    rankscope collect --host 0.0.0.0 --token "$RANKSCOPE_TOKEN" --tls-cert server.pem --tls-key server.key
    rankscope collect --metrics-port 9464 --alert-webhook https://hooks.slack.com/services/...
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    data_dir_arg(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=50051, help="port to bind (default 50051; 0 picks a free one)")
    p.add_argument("--token", default=None, help="require 'authorization: Bearer TOKEN' (default: $RANKSCOPE_TOKEN)")
    p.add_argument(
        "--tls-cert",
        default=None,
        metavar="PEM",
        help="serve TLS with this certificate chain (clients then need --tls-ca / $RANKSCOPE_TLS_CA)",
    )
    p.add_argument("--tls-key", default=None, metavar="PEM", help="the private key of --tls-cert")
    p.add_argument(
        "--insecure", action="store_true", help="allow a non-loopback --host without a token (prints a warning)"
    )
    p.add_argument(
        "--writer-id",
        default=None,
        metavar="W",
        help="share --data-dir with other collectors, each with its own id ([a-z][a-z0-9_]*); "
        "route each rank to one of them (see docs/SCALING.md)",
    )
    p.add_argument(
        "--flush-interval",
        type=float,
        default=None,
        metavar="S",
        help="commit buffered records at least this often, in (0, 5] s (default 0.25): "
        "lower means fresher dashboards and more small files",
    )
    p.add_argument(
        "--compaction-interval",
        type=float,
        default=None,
        metavar="S",
        help="seconds between scans for small segments to merge (default 5)",
    )
    p.add_argument(
        "--compaction-min-files",
        type=int,
        default=None,
        metavar="N",
        help="merge once this many small segments wait in one partition (default 8)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="P",
        help="serve Prometheus /metrics on --host:P (per run and rank: step time, exposed comm share, busbw per op, "
        "last-arrival share, findings; the collector's ingest counters)",
    )
    p.add_argument(
        "--metrics-max-runs",
        type=int,
        default=None,
        metavar="N",
        help="export at most N runs on /metrics: those streaming here first, then the newest (default 64); "
        "rankscope_runs_omitted counts the others",
    )
    p.add_argument(
        "--alert-webhook",
        default=None,
        metavar="URL",
        help="POST each new finding once to URL as JSON with a Slack-compatible 'text' (at most one post per 2 s)",
    )
    p.add_argument(
        "--auto-profile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ask the ranks a new live straggler/slow-link/hang/memory finding names (and a reference rank) for a "
        "profile (3 steps, sampled Python stacks), stacks or memory report, at most once per run per 5 min, per "
        "rank per 15 min (default: on; --no-auto-profile: never ask unprompted)",
    )
    p.add_argument(
        "--auto-probe",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="when a live slow-link finding cannot tell which host's link it is, time those hosts' links at once "
        "(rankscope probe: 4 MiB each way per pair, one pair at a time; default: off)",
    )
    p.add_argument(
        "--raw-every",
        type=int,
        default=None,
        metavar="N",
        help="retention: keep raw comm records only for every Nth step and the steps with findings; "
        "per-step rollups (comm_steps) keep every step; a run's older captures and its telemetry arrival times "
        "away from slow links go too (default: keep every raw record)",
    )
    p.add_argument(
        "--stream-idle-timeout",
        type=float,
        default=None,
        metavar="S",
        help="close a rank stream that sends nothing for S seconds; the rank reconnects when it has more "
        "(default 300, longer than any heartbeat period)",
    )
    p.add_argument(
        "--max-streams-per-peer",
        type=int,
        default=None,
        metavar="N",
        help="streams one client address may hold open; more are refused with RESOURCE_EXHAUSTED and retried "
        "(default 8192: every rank of a host shares its address)",
    )
    p.add_argument(
        "--stream-rows-per-s",
        type=float,
        default=None,
        metavar="R",
        help="rows per second one stream may send; above it the collector reads that stream more slowly "
        "(default 4000000)",
    )
    p.add_argument(
        "--stream-bytes-per-s",
        type=float,
        default=None,
        metavar="B",
        help="bytes per second one stream may send, on the wire (default 268435456 = 256 MiB)",
    )
    p.add_argument(
        "--no-resends",
        action="store_true",
        help="refuse the spool files of earlier runs that ranks resend once they reach this collector (they stay "
        "in the ranks' spool); by default they are taken, and the log, /metrics and health say how many",
    )


def settings_from_args(args: argparse.Namespace):
    """The collector's settings (collector.server.settings) from the flags; a flag not given
    leaves its setting at the default. Raises ConfigError / SecurityConfigError naming what is bad."""
    from collector.data.security import ServerTLS, resolve_token
    from collector.server.compaction import CompactionConfig
    from collector.server.limits import StreamLimits
    from collector.server.settings import CollectorSettings, MetricsSettings, SecuritySettings
    from collector.server.store import StoreConfig

    return CollectorSettings(
        data_dir=args.data_dir,
        host=args.host,
        port=args.port,
        writer=args.writer_id,
        security=SecuritySettings(
            token=resolve_token(args.token),
            tls=ServerTLS.from_args(args.tls_cert, args.tls_key),
            insecure=args.insecure,
        ),
        store=StoreConfig(**_given(flush_interval=args.flush_interval)),
        compaction=CompactionConfig(
            **_given(interval=args.compaction_interval, min_files=args.compaction_min_files, raw_every=args.raw_every)
        ),
        streams=StreamLimits(
            **_given(
                idle_timeout_s=args.stream_idle_timeout,
                max_streams_per_peer=args.max_streams_per_peer,
                rows_per_s=args.stream_rows_per_s,
                bytes_per_s=args.stream_bytes_per_s,
                resends=False if args.no_resends else None,
            )
        ),
        metrics=MetricsSettings(
            port=args.metrics_port,
            max_runs=args.metrics_max_runs,
            alert_webhook=args.alert_webhook,
            auto_profile=args.auto_profile,
            auto_probe=args.auto_probe,
        ),
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM, then commit what is buffered (exit 0); SIGUSR1 runs a compaction pass now."""
    from collector.server.ledger import DataDirBusy
    from collector.server.serve import serve

    stop, compact_now = threading.Event(), threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, lambda *_: compact_now.set())
    try:
        settings = settings_from_args(args)
        for warning in settings.bind_warnings():
            _complain(warning)
        serve(
            settings,
            stop,
            on_ready=_listening,
            on_stopping=_stopping,
            compact_now=compact_now,
            on_compacted=_compacted,
        )
    except ValueError as exc:  # ConfigError, SecurityConfigError, SettingsError: a bad setting
        _complain(exc)
        return 2
    except (OSError, DataDirBusy) as exc:
        _complain(exc)
        return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _listening(at: Listening) -> None:
    scheme = "TLS" if at.tls else "plaintext"
    auth = "token required" if at.token_required else "no token"
    _say(f"rankscope collector listening on {at.host}:{at.port} ({scheme}, {auth}; data dir {at.data_dir})")
    if at.metrics_port is not None:
        _say(f"rankscope collector: Prometheus metrics on http://{at.host}:{at.metrics_port}/metrics")


def _compacted(merges: int) -> None:
    _say(f"rankscope collector: compaction pass done ({merges} merges)")  # what CollectorProcess.compact_now awaits


def _stopping() -> None:
    _say("rankscope collector: stopping, committing buffered records")


def _complain(problem) -> None:
    _say(f"rankscope collect: {problem}", to_stderr=True)


def _say(line: str, *, to_stderr: bool = False) -> None:
    """A line for whoever reads the collector's output. One that went away (a demo killed, a closed
    pipe) must not keep the collector from committing what it holds and stopping: the stream is
    then replaced by /dev/null, so neither a later line nor the interpreter's last flush raises."""
    name = "stderr" if to_stderr else "stdout"
    try:
        print(line, file=getattr(sys, name), flush=True)
    except OSError:  # BrokenPipeError, or the terminal gone
        setattr(sys, name, open(os.devnull, "w"))  # lives as long as the process


def _given(**settings):
    """The settings that were given (not None), for a config block to default the rest."""
    return {k: v for k, v in settings.items() if v is not None}
