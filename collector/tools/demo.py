"""`rankscope demo`: a collector, a live multi-rank CPU training run of the
example GPT streaming into it, and the dashboard, all on this machine.

The console is for a person trying the tool for the first time: where the
collector and the dashboard are, the training's progress, and each warning
once. Every rank of the run prints the same library warnings, so the training's
output goes through ``OnceFilter``, which drops a line identical to one already
shown, and shows a training progress line only every ``PROGRESS_EVERY`` steps.

It trains until Ctrl-C (or ``--steps``), on a collector port and a spool dir of its
own (a free port, a fresh temporary dir), so it neither receives nor resends other
processes' telemetry meant for the default endpoint. After a healthy start it stages
a fault (``--straggler``, by default rank 1 slowed by 40 ms per step from step 300),
so the first minute shows a finding appear live and its cost rise.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading

from collector.tools.launch import CollectorProcess, dashboard_command, free_port, stop_group, torchrun_command

EXAMPLE_CONFIG = "zero2.json"  # a bundled config of trainer.examples, named, not looked up
UNTIL_STOPPED = 10**9  # "--steps" when none is given: train until Ctrl-C
PROGRESS_EVERY = 50
_PROGRESS = re.compile(r"^\[\w+\] step (\d+) loss |^\[engine\] step=(\d+) ")
_ENGINE_TIMERS = "time (ms) |"  # the engine's breakdown line, printed right after its step line


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


class OnceFilter:
    """Copies lines to ``out``, each distinct non-blank line once."""

    def __init__(self, out, last_step: int | None = None) -> None:
        self.out = out
        self.seen: set[str] = set()
        self.muted = False  # after Ctrl-C: the ranks' and torchrun's KeyboardInterrupt tracebacks are noise
        self.last_step = last_step
        self.showing = True  # whether the last progress line was shown (its timers line follows it)

    def write_line(self, line: str) -> None:
        if self.muted:
            return
        progress = _PROGRESS.match(line)
        if progress:  # "[gpt] step N loss ...", "[engine] step=N ...": the first, every PROGRESS_EVERY-th and the last
            step = int(progress.group(1) or progress.group(2))
            self.showing = step in (1, self.last_step) or step % PROGRESS_EVERY == 0
            if not self.showing:
                return
        elif line.startswith(_ENGINE_TIMERS) and not self.showing:
            return
        key = line.rstrip()
        if key and key in self.seen:
            return
        self.seen.add(key)
        self.out.write(line)
        self.out.flush()

    def pump(self, stream) -> None:
        for line in iter(stream.readline, ""):
            self.write_line(line)


def parse_straggler(spec: str) -> tuple[int, float, int]:
    """``RANK:MS@STEP`` (``1:40@300``) -> (rank, ms, step); trainer.examples.gpt reads the same
    spec (the collector side does not import the trainer: the demo launches it as a process)."""
    try:
        rank, rest = spec.split(":", 1)
        ms, _, step = rest.partition("@")
        return int(rank), float(ms), int(step or 0)
    except ValueError:
        raise SystemExit(f"rankscope demo: --straggler {spec!r}: expected RANK:MS@STEP, e.g. 1:40@300") from None


def _port_or_free(port: int) -> int:
    """``port`` if nothing listens there now, else a free one."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return free_port()
    return port


def _drop_spool(spool_dir: str) -> None:
    """The demo's spool dir goes when empty; with envelopes left in it, it stays and is named."""
    leftover = [name for name in os.listdir(spool_dir) if name.endswith(".rsspool")] if os.path.isdir(spool_dir) else []
    if leftover:
        print(f"[demo] {len(leftover)} spool file(s) not sent are kept in {spool_dir}", flush=True)
    else:
        shutil.rmtree(spool_dir, ignore_errors=True)


class _Stopped(Exception):
    """SIGTERM or SIGHUP (a process manager, a closed terminal): stop as on Ctrl-C."""


def _stop_on(signum, _frame) -> None:
    raise _Stopped(signal.Signals(signum).name)


def run_demo(args: argparse.Namespace) -> int:
    # Without these the demo would die at once and leave its collector (holding the data dir) and
    # dashboard running; with them, the finally below stops them as Ctrl-C does.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop_on)
    data_dir = os.path.abspath(args.data_dir)
    os.makedirs(data_dir, exist_ok=True)
    collector = dashboard = train_proc = once = None
    spool_dir = tempfile.mkdtemp(prefix="rankscope-demo-spool-")
    steps = args.steps or UNTIL_STOPPED
    try:
        try:
            collector = CollectorProcess(data_dir, port=args.port)
        except RuntimeError as exc:
            print(
                f"[demo] the collector did not start on port {args.port}: {exc}\n"
                f"[demo] is another collector running? pick another port with --port",
                file=sys.stderr,
            )
            return 1
        endpoint = collector.address
        print(f"[demo] collector: {endpoint} (a port of its own; data in {data_dir})", flush=True)
        print(f"[demo] spool dir: {spool_dir} (the ranks' own, for what the collector has not acked)", flush=True)
        if not args.no_dashboard:
            port = _port_or_free(args.dashboard_port)
            dashboard = subprocess.Popen(
                dashboard_command(data_dir, port=port),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            print(f"[demo] dashboard: http://127.0.0.1:{port}", flush=True)
        extra = []
        fault = args.straggler if args.straggler and args.straggler.lower() != "none" else None
        if fault:
            rank, ms, first = parse_straggler(fault)
            if rank >= args.nproc or first >= steps:
                fault = None
            else:
                extra = ["--straggler", fault]
        train = torchrun_command(
            args.nproc,
            "-m",
            "trainer.examples.gpt",
            "--config",
            args.config or EXAMPLE_CONFIG,
            "--steps",
            str(steps),
            *extra,
        )
        # The run name travels by env: torchrun would take `--run` for its own --run-path.
        env = dict(
            os.environ,
            RANKSCOPE_ENDPOINT=endpoint,
            RANKSCOPE_RUN="demo",
            RANKSCOPE_SPOOL_DIR=spool_dir,
            OMP_NUM_THREADS="1",
        )
        length = "until Ctrl-C" if steps == UNTIL_STOPPED else f"x {steps} steps"
        print(
            f"[demo] training: {args.nproc} ranks {length}, the example GPT (ZeRO-2), streaming into the collector",
            flush=True,
        )
        if args.training_nice:
            print(
                f"[demo] the ranks run at nice {args.training_nice}, so the dashboard stays responsive on a "
                "laptop while they train (--training-nice 0 for full priority)",
                flush=True,
            )
        if fault:
            print(
                f"[demo] staged fault: from step {first}, rank {rank} waits {ms:g} ms before each forward "
                "(a straggler); watch Overview's Health name it and its cost rise, and the Stragglers page",
                flush=True,
            )
        # Its own session: Ctrl-C reaches the demo alone, which stops the training quietly (the
        # ranks' KeyboardInterrupt tracebacks would bury the console) and exits 0.
        proc = train_proc = subprocess.Popen(
            train,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
            # the ranks (torchrun's children) inherit it; priority only, never speed the run cannot use
            preexec_fn=(lambda: os.nice(args.training_nice)) if args.training_nice else None,
        )
        once = OnceFilter(sys.stdout, last_step=None if steps == UNTIL_STOPPED else steps)
        pump = threading.Thread(target=once.pump, args=(proc.stdout,), daemon=True)
        pump.start()
        rc = proc.wait()
        pump.join(timeout=5)
        print(
            f"[demo] training finished (exit {rc}); try:\n"
            f"  .venv/bin/rankscope health demo --data-dir {args.data_dir}\n"
            f"  .venv/bin/rankscope sql --data-dir {args.data_dir} "
            f'"select op, count(*) n, round(avg(busbw_gbs), 3) busbw from comm group by op"',
            flush=True,
        )
        if args.exit or dashboard is None:
            return rc
        print("[demo] collector and dashboard keep running; Ctrl-C to stop.", flush=True)
        dashboard.wait()
        return rc
    except (KeyboardInterrupt, _Stopped) as stopped:
        # Ctrl-C is how a person ends the demo ("Ctrl-C to stop"), SIGTERM/SIGHUP how a machine does:
        # a normal end, exit 0, so that `make demo` does not report "Error 130" for it.
        if once is not None:
            once.muted = True
        how = stopped if isinstance(stopped, _Stopped) else "Ctrl-C"
        print(f"\n[demo] stopped ({how}); the run so far is in the data dir.", flush=True)
        return 0
    finally:
        stop_group(train_proc)
        _stop(dashboard)
        if collector is not None:
            collector.stop()
        _drop_spool(spool_dir)
