"""`rankscope` command line.

Every command that reads or writes data takes ``--data-dir`` (default
``./rankscope-data``). Commands that need torch (the demo's training run,
nvme-tune) run it in a child process, so this module imports neither torch
nor the trainer: the collector side stays light.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap

DEFAULT_DATA_DIR = "rankscope-data"
DEFAULT_ENDPOINT = "127.0.0.1:50051"


def _data_dir_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data-dir",
        default=DEFAULT_DATA_DIR,
        metavar="D",
        help=f"data directory holding parquet/ and catalog.duckdb (default: ./{DEFAULT_DATA_DIR})",
    )


def _tls_ca_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tls-ca",
        default=None,
        metavar="PEM",
        help="verify a TLS collector against this CA file (default: $RANKSCOPE_TLS_CA; none: plaintext)",
    )


def _examples(text: str) -> str:
    return "examples:\n" + textwrap.indent(textwrap.dedent(text).strip(), "  ")


def cmd_collect(args: argparse.Namespace) -> int:
    from collector.data import security
    from collector.server.service import serve

    if args.raw_every and args.writer_id:
        print(
            "rankscope collect: --raw-every needs every rank of a run in one collector (its rollup compares "
            "ranks); it cannot be combined with --writer-id",
            file=sys.stderr,
        )
        return 2
    try:
        token = security.check_token(security.resolve_token(args.token))
        tls = security.ServerTLS.from_args(args.tls_cert, args.tls_key)
    except security.SecurityConfigError as exc:
        print(f"rankscope collect: {exc}", file=sys.stderr)
        return 2
    # serve() applies the bind policy (collector.data.security.check_bind) and prints its warnings.
    return (
        serve(
            args.data_dir,
            host=args.host,
            port=args.port,
            token=token,
            tls=tls,
            insecure=args.insecure,
            writer=args.writer_id,
            flush_interval=args.flush_interval,
            compaction_interval=args.compaction_interval,
            compaction_min_files=args.compaction_min_files,
            metrics_port=args.metrics_port,
            metrics_max_runs=args.metrics_max_runs,
            alert_webhook=args.alert_webhook,
            raw_every=args.raw_every,
            stream_idle_timeout=args.stream_idle_timeout,
            max_streams_per_peer=args.max_streams_per_peer,
            stream_rows_per_s=args.stream_rows_per_s,
            stream_bytes_per_s=args.stream_bytes_per_s,
            auto_profile=args.auto_profile,
        )
        or 0
    )


def _sql_limits(args: argparse.Namespace, command: str):
    """The SQL console's limits from --sql-memory-limit / --sql-time-limit, else the
    environment, else the defaults; None after printing why a value is bad."""
    from collector.data.catalog import SqlLimits

    try:
        return SqlLimits.resolve(args.sql_memory_limit, args.sql_time_limit)
    except ValueError as exc:
        print(f"rankscope {command}: {exc}", file=sys.stderr)
        return None


def _sql_limit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sql-memory-limit",
        default=None,
        metavar="SIZE",
        help="memory one query may use, e.g. 512MiB, 4GiB, or 'none' "
        "(default: $RANKSCOPE_SQL_MEMORY_LIMIT, else 1GiB); a query that needs more is stopped",
    )
    p.add_argument(
        "--sql-time-limit",
        default=None,
        metavar="S",
        help="seconds one query may run, or 'none' (default: $RANKSCOPE_SQL_TIME_LIMIT, else 30)",
    )


def cmd_sql(args: argparse.Namespace) -> int:
    from collector.tools.sql import run

    limits = _sql_limits(args, "sql")
    if limits is None:
        return 2
    return run(args.data_dir, args.query, limits=limits)


def cmd_dashboard(args: argparse.Namespace) -> int:
    from collector.data.catalog import SQL_MEMORY_LIMIT_ENV, SQL_TIME_LIMIT_ENV
    from collector.tools.launch import dashboard_command

    if _sql_limits(args, "dashboard") is None:
        return 2
    # the console reads its limits from the environment the dashboard process inherits
    for value, env in ((args.sql_memory_limit, SQL_MEMORY_LIMIT_ENV), (args.sql_time_limit, SQL_TIME_LIMIT_ENV)):
        if value is not None:
            os.environ[env] = value
    cmd = dashboard_command(args.data_dir, port=args.port, host=args.host)
    os.execv(cmd[0], cmd)


def cmd_demo(args: argparse.Namespace) -> int:
    from collector.tools.demo import run_demo

    return run_demo(args)


def cmd_import(args: argparse.Namespace) -> int:
    if args.watch:
        from collector.tools.watch import main as watch_main

        return watch_main(args)
    from collector.tools.importers.ingest import main as import_main

    return import_main(args)


def cmd_replay(args: argparse.Namespace) -> int:
    from collector.tools.replay import main as replay_main

    return replay_main(args)


def cmd_export(args: argparse.Namespace) -> int:
    from collector.tools.export import main as export_main

    return export_main(args)


def cmd_health(args: argparse.Namespace) -> int:
    from collector.tools.health import main as health_main

    return health_main(args)


def cmd_profile(args: argparse.Namespace) -> int:
    from collector.tools.profile import main as profile_main

    return profile_main(args, "profile")


def cmd_stacks(args: argparse.Namespace) -> int:
    from collector.tools.profile import main as profile_main

    return profile_main(args, "stacks")


def cmd_simulate(args: argparse.Namespace) -> int:
    from collector.tools.simulate import main as simulate_main

    return simulate_main(args)


def cmd_nvme_tune(args: argparse.Namespace) -> int:
    cmd = [sys.executable, "-m", "native.nvme_tune", "--dir", args.dir, *args.rest]
    os.execv(cmd[0], cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rankscope",
        description="Live observability for distributed PyTorch training.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=_examples("""
            rankscope demo                      # collector + live 4-rank run + dashboard
            rankscope collect --port 50051      # run the collector
            rankscope dashboard --data-dir sample_runs
            rankscope sql "select op, count(*) from comm group by op"
        """),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func, help: str, examples: str):
        p = sub.add_parser(
            name,
            help=help,
            description=help,
            epilog=_examples(examples),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(func=func)
        return p

    p = add(
        "collect",
        cmd_collect,
        "Run the gRPC collector that writes Parquet and the DuckDB catalog.",
        """
        rankscope collect
        rankscope collect --data-dir /scratch/rs --port 50051 --token "$RANKSCOPE_TOKEN"
        rankscope collect --host 0.0.0.0 --token "$RANKSCOPE_TOKEN" --tls-cert server.pem --tls-key server.key
        rankscope collect --metrics-port 9464 --alert-webhook https://hooks.slack.com/services/...
    """,
    )
    _data_dir_arg(p)
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
        action="store_true",
        help="ask the ranks a new live straggler/slow-link/hang/memory finding names (and a reference rank) for a "
        "profile, stacks or memory report, at most once per run per 5 min, per rank per 15 min (default: off; "
        "a profiled straggler can run much slower while its trace is exported: see README)",
    )
    p.add_argument(
        "--raw-every",
        type=int,
        default=None,
        metavar="N",
        help="retention: keep raw comm records only for every Nth step and the steps with findings; "
        "per-step rollups (comm_steps) keep every step (default: keep every raw record)",
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

    p = add(
        "dashboard",
        cmd_dashboard,
        "Serve the Streamlit dashboard over a data directory.",
        """
        rankscope dashboard
        rankscope dashboard --data-dir sample_runs --port 8502
    """,
    )
    _data_dir_arg(p)
    p.add_argument("--port", type=int, default=8501)
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    _sql_limit_args(p)  # the SQL console's

    p = add(
        "demo",
        cmd_demo,
        "Start a collector, a live multi-rank CPU training run streaming into it, and the dashboard.",
        """
        rankscope demo
        rankscope demo --nproc 2 --steps 50 --no-dashboard
        rankscope demo --straggler 3:80@100      # rank 3 slowed by 80 ms per step from step 100
    """,
    )
    _data_dir_arg(p)
    p.add_argument("--nproc", type=int, default=4, help="training ranks (default 4)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default: until Ctrl-C)")
    p.add_argument("--config", default=None, help="engine config JSON (default: the ZeRO-2 example config)")
    p.add_argument(
        "--port",
        type=int,
        default=0,
        help="collector port (default 0: a free one, not the default endpoint other runs on this host may use)",
    )
    p.add_argument("--dashboard-port", type=int, default=8501, help="dashboard port (a free one if 8501 is taken)")
    p.add_argument(
        "--straggler",
        default="1:40@300",
        metavar="RANK:MS@STEP",
        help="the fault staged after a healthy start: RANK busy-waits MS before each forward from STEP on "
        "(default 1:40@300; 'none' for a healthy run)",
    )
    p.add_argument(
        "--training-nice",
        type=int,
        default=10,
        metavar="N",
        help="CPU priority of the training ranks, as nice(1) (default 10: on a laptop the dashboard and the "
        "browser drawing it come first, and the training takes every cycle they leave; 0 for full priority)",
    )
    p.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    p.add_argument("--exit", action="store_true", help="stop everything when the training run ends")

    p = add(
        "sql",
        cmd_sql,
        "Run a read-only SQL query over the catalog and print the result.",
        """
        rankscope sql "select * from runs"
        rankscope sql --data-dir sample_runs "select rank, avg(busbw_gbs) from comm group by rank"
        rankscope sql --sql-memory-limit 4GiB --sql-time-limit 120 "select op, count(*) from comm group by op"
    """,
    )
    _data_dir_arg(p)
    _sql_limit_args(p)
    p.add_argument("query", help="a SELECT / WITH / DESCRIBE / SHOW query")

    p = add(
        "import",
        cmd_import,
        "Import DeepSpeed outputs (csv_monitor, tensorboard, log_summary JSON, verbose "
        "comms log, flops profile, exported Parquet) as a new run, or watch a folder for them.",
        """
        rankscope import ds_logs/                       # a DeepSpeed output folder, into ./rankscope-data
        rankscope import comms_summary_rank0.json --run bert-large --data-dir /scratch/rs
        rankscope import flops_profile.txt --endpoint 127.0.0.1:50051   # through a running collector
        rankscope import --watch incoming/ --run nightly  # ingest files (also spool files, archives) as they appear
    """,
    )
    _data_dir_arg(p)
    p.add_argument("path", nargs="?", help="a file or a folder (searched recursively)")
    p.add_argument("--run", default=None, help="run name (default: the file or folder name)")
    p.add_argument(
        "--world-size", type=int, default=None, help="ranks of the job (default: from the files, else the ranks seen)"
    )
    p.add_argument(
        "--endpoint",
        default=None,
        help="send through the collector at HOST:PORT instead of writing --data-dir yourself",
    )
    p.add_argument("--token", default=None, help="bearer token for --endpoint (default: $RANKSCOPE_TOKEN)")
    _tls_ca_arg(p)
    p.add_argument(
        "--watch",
        metavar="DIR",
        default=None,
        help="keep watching DIR and ingest every new file once, also across restarts",
    )
    p.add_argument(
        "--settle",
        type=float,
        default=1.0,
        help="watch: seconds a file must stay unchanged before it is ingested (default 1)",
    )
    p.add_argument("--once", action="store_true", help="watch: ingest what is there now and exit")

    p = add(
        "replay",
        cmd_replay,
        "Re-stream an archived run through a live collector as a new, linked run.",
        """
        rankscope replay run.rsarchive --speed 10           # 10x real time into 127.0.0.1:50051
        rankscope replay rankscope-data --run bert-large --speed 0 --endpoint 10.0.0.5:50051
        rankscope replay sample_runs/parquet/comm/run=demo-20260101-000000-abc123
    """,
    )
    p.add_argument(
        "path", help="an archive (rankscope export --archive), a data dir (with --run), or a run=<id> folder inside one"
    )
    p.add_argument("--run", default=None, help="run id or name, when PATH is a data dir")
    p.add_argument("--speed", type=float, default=1.0, help="times real time (default 1; 0 = as fast as possible)")
    p.add_argument("--endpoint", default=DEFAULT_ENDPOINT, help=f"collector address (default {DEFAULT_ENDPOINT})")
    p.add_argument("--token", default=None, help="bearer token (default: $RANKSCOPE_TOKEN)")
    _tls_ca_arg(p)
    p.add_argument("--name", default=None, help="name of the new run (default: the original's + '-replay')")

    p = add(
        "export",
        cmd_export,
        "Export a run: a Perfetto/Chrome trace, a self-contained archive, or Parquet files.",
        """
        rankscope export --perfetto bert-large trace.json   # open in ui.perfetto.dev or chrome://tracing
        rankscope export --archive bert-large bert.rsarchive  # replay it anywhere: rankscope replay bert.rsarchive
        rankscope export --parquet bert-large out/          # out/<table>.parquet, with run_id and rank
        rankscope export --flight-recorder hang-run fr/     # fr/rank_<r>: torch's fr_trace analyzer reads them
    """,
    )
    _data_dir_arg(p)
    kind = p.add_mutually_exclusive_group(required=True)
    kind.add_argument("--perfetto", nargs=2, metavar=("RUN", "OUT.json"), help="Chrome trace-event JSON")
    kind.add_argument("--archive", nargs=2, metavar=("RUN", "OUT"), help="one file: the run's Parquet and catalog rows")
    kind.add_argument("--parquet", nargs=2, metavar=("RUN", "OUTDIR"), help="one Parquet file per table")
    kind.add_argument(
        "--flight-recorder", nargs=2, metavar=("RUN", "DIR"), help="PyTorch Flight Recorder dumps, one per rank"
    )

    p = add(
        "health",
        cmd_health,
        "Print a run's current findings (exit 0 none, 1 warnings, 2 a hang, desync or silent rank).",
        """
        rankscope health demo                          # the newest run named demo
        rankscope health demo-20261123-101500-a1b2c3 --json
        rankscope health bert-large --data-dir /scratch/rs || notify-oncall
    """,
    )
    _data_dir_arg(p)
    p.add_argument("run", metavar="RUN", help="run id, or run name (the newest run of that name)")
    p.add_argument("--json", action="store_true", help="print the findings as a JSON list")
    p.add_argument("--all", action="store_true", help="print the notes (info findings) as well")

    for name, func, help_text, examples in (
        (
            "profile",
            cmd_profile,
            "Profile ranks of a live run over their next steps (torch.profiler, Python stacks) and diff them.",
            """
            rankscope profile demo --ranks 1 --reference 0 --steps 3 --out /tmp/evidence
            rankscope profile bert-large --ranks 3,517 --steps 3 --endpoint collector:50051 --data-dir /scratch/rs
            """,
        ),
        (
            "stacks",
            cmd_stacks,
            "Ask ranks of a live run for every Python thread's stack, and print the innermost frames.",
            """
            rankscope stacks demo --ranks 1-3
            """,
        ),
    ):
        p = add(name, func, help_text, examples)
        _data_dir_arg(p)
        p.add_argument("run", metavar="RUN", help="run id, or run name (resolved in --data-dir where readable)")
        p.add_argument("--ranks", required=True, metavar="R[,R-R]", help="ranks to ask: 3,517 or 0-3")
        p.add_argument("--endpoint", default=DEFAULT_ENDPOINT, help=f"collector address (default {DEFAULT_ENDPOINT})")
        p.add_argument("--token", default=None, help="the collector's bearer token (default: $RANKSCOPE_TOKEN)")
        _tls_ca_arg(p)
        p.add_argument(
            "--wait", type=float, default=120.0, metavar="S", help="wait S s for the answers in --data-dir (0: do not)"
        )
        if name == "profile":
            p.add_argument("--steps", type=int, default=3, help="steps to profile, 1-20 (default 3)")
            p.add_argument("--reference", type=int, default=None, metavar="R", help="the healthy rank to diff against")
            p.add_argument("--record-shapes", action="store_true", help="torch.profiler's record_shapes")
            p.add_argument("--out", default=None, metavar="DIR", help="write rank<R>.json and merged.json here")

    p = add(
        "simulate",
        cmd_simulate,
        "Generate a synthetic run of many ranks (a real ZeRO-2 step, repeated), into a data dir or a collector.",
        """
        rankscope simulate --ranks 1024 --steps 200 --straggler 517:40 --data-dir /tmp/sim
        rankscope simulate --ranks 256 --steps 1000 --endpoint 127.0.0.1:50051
        rankscope simulate --ranks 8192 --steps 100 --hosts 1024 --straggler 17:25@50 --data-dir /tmp/sim8k
        rankscope simulate --ranks 1024 --hosts 128 --steps 120 --slow-link 17:4@60-90 --data-dir /tmp/simlink
    """,
    )
    _data_dir_arg(p)
    p.add_argument("--ranks", type=int, required=True, help="world size")
    p.add_argument("--steps", type=int, required=True, help="training steps per rank")
    p.add_argument(
        "--collectives-per-step",
        type=int,
        default=0,
        metavar="C",
        help="collectives a step (default: one template step, ZeRO-2's 7); more repeats the pattern",
    )
    p.add_argument("--hosts", type=int, default=0, help="hosts the ranks are spread over (default: 8 ranks a host)")
    p.add_argument(
        "--straggler",
        action="append",
        default=[],
        metavar="RANK:MS[@STEP]",
        help="RANK's forward pass is MS slower (from STEP on); may be given several times",
    )
    p.add_argument(
        "--hang",
        default=None,
        metavar="RANK:STEP",
        help="RANK stops before STEP's first collective while the others enter it and wait (a hang, current now)",
    )
    p.add_argument(
        "--slow-link",
        action="append",
        default=[],
        metavar="HOST:FACTOR@STEP[-END]",
        help="host HOST's link is FACTOR times slower from STEP (to END, when it is restored); implies --host-groups",
    )
    p.add_argument(
        "--host-groups",
        action="store_true",
        help="each step also all_reduces inside each host and between neighbouring hosts (what --slow-link slows)",
    )
    p.add_argument("--name", default="simulated", help="run name (default: simulated)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--endpoint", default=None, help="stream through the collector at HOST:PORT instead of --data-dir")
    p.add_argument("--token", default=None, help="bearer token for --endpoint (default: $RANKSCOPE_TOKEN)")
    p.add_argument("--streams", type=int, default=128, help="--endpoint: rank streams open at once (default 128)")

    p = add(
        "nvme-tune",
        cmd_nvme_tune,
        "Sweep async I/O handle settings on a directory and print the best `aio` config block.",
        """
        rankscope nvme-tune --dir /local_nvme
        rankscope nvme-tune --dir /local_nvme --io-size 268435456 --loops 3
    """,
    )
    p.add_argument("--dir", required=True, help="a writable directory on the device to tune")
    p.add_argument(
        "rest", nargs=argparse.REMAINDER, help="more options for the tuner (see python -m native.nvme_tune --help)"
    )
    return parser


EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell tool killed by a closed pipe reports


def _stdout_gone() -> int:
    """The reader of stdout went away (``rankscope health RUN | head``): stop quietly. What is
    still buffered can never be delivered; pointing stdout at /dev/null keeps the interpreter's
    exit-time flush from printing a second BrokenPipeError."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout already closed or not a file: nothing left to flush
        pass
    return EXIT_BROKEN_PIPE


def main(argv: list[str] | None = None) -> int:
    """Every command's entry: a closed stdout (a pipe into ``head``) ends the command quietly,
    whichever command was printing; Ctrl-C exits 130 without a traceback."""
    try:
        args = build_parser().parse_args(argv)
        rc = int(args.func(args) or 0)
        sys.stdout.flush()  # a small output is still buffered: a closed pipe shows up here
        return rc
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _stdout_gone()


if __name__ == "__main__":
    sys.exit(main())
