"""`rankscope demo`: a collector, a live multi-rank CPU training run of the
example GPT streaming into it, and the dashboard, all on this machine.

The console is for a person trying the tool for the first time: where the
collector and the dashboard are, the training's progress, and each warning
once. Every rank of the run prints the same library warnings, so the training's
output goes through ``OnceFilter``, which drops a line identical to one already
shown (progress lines differ from step to step and always pass).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading

from collector.tools.launch import CollectorProcess, dashboard_command, torchrun_command

EXAMPLE_CONFIG = "zero2.json"  # a bundled config of trainer.examples, named, not looked up


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _stop_group(proc: subprocess.Popen | None) -> None:
    """Stops a child started in its own session (torchrun and its ranks) as Ctrl-C would."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


class OnceFilter:
    """Copies lines to ``out``, each distinct non-blank line once."""

    def __init__(self, out) -> None:
        self.out = out
        self.seen: set[str] = set()
        self.muted = False  # after Ctrl-C: the ranks' and torchrun's KeyboardInterrupt tracebacks are noise

    def write_line(self, line: str) -> None:
        if self.muted:
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


def run_demo(args: argparse.Namespace) -> int:
    data_dir = os.path.abspath(args.data_dir)
    os.makedirs(data_dir, exist_ok=True)
    collector = dashboard = train_proc = once = None
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
        print(f"[demo] collector: {endpoint} (data in {data_dir})", flush=True)
        if not args.no_dashboard:
            dashboard = subprocess.Popen(
                dashboard_command(data_dir, port=args.dashboard_port),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            print(f"[demo] dashboard: http://127.0.0.1:{args.dashboard_port}", flush=True)
        train = torchrun_command(
            args.nproc,
            "-m",
            "trainer.examples.gpt",
            "--config",
            args.config or EXAMPLE_CONFIG,
            "--steps",
            str(args.steps),
        )
        # The run name travels by env: torchrun would take `--run` for its own --run-path.
        env = dict(os.environ, RANKSCOPE_ENDPOINT=endpoint, RANKSCOPE_RUN="demo", OMP_NUM_THREADS="1")
        print(
            f"[demo] training: {args.nproc} ranks x {args.steps} steps of the example GPT (ZeRO-2), "
            "streaming into the collector",
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
        )
        once = OnceFilter(sys.stdout)
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
    except KeyboardInterrupt:
        # Ctrl-C is how a person ends the demo ("Ctrl-C to stop"): a normal end, exit 0, so that
        # `make demo` does not report "Error 130" for it.
        if once is not None:
            once.muted = True
        print("\n[demo] stopped (Ctrl-C); the run so far is in the data dir.", flush=True)
        return 0
    finally:
        _stop_group(train_proc)
        _stop(dashboard)
        if collector is not None:
            collector.stop()
