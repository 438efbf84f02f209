"""`rankscope demo`: a collector, a live multi-rank CPU training run of the
example GPT streaming into it, and the dashboard, all on this machine."""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from collector.tools.launch import collector_command, dashboard_command, wait_for_collector

EXAMPLE_CONFIG = "zero2.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def run_demo(args: argparse.Namespace) -> int:
    data_dir = os.path.abspath(args.data_dir)
    os.makedirs(data_dir, exist_ok=True)
    endpoint = f"127.0.0.1:{args.port}"
    collector = dashboard = None
    try:
        print(f"[demo] collector on {endpoint}, data in {data_dir}", flush=True)
        collector = subprocess.Popen(collector_command(data_dir, port=args.port))
        wait_for_collector(endpoint)
        if not args.no_dashboard:
            dashboard = subprocess.Popen(dashboard_command(data_dir, port=args.dashboard_port),
                                         stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            print(f"[demo] dashboard: http://127.0.0.1:{args.dashboard_port}", flush=True)
        train = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
            # a bundled config's name: the example resolves it (the demo never looks inside the engine)
            "-m", "trainer.examples.gpt", "--config", args.config or EXAMPLE_CONFIG,
            "--steps", str(args.steps),
        ]
        # The run name travels by env: torchrun would take `--run` for its own --run-path.
        env = dict(os.environ, RANKSCOPE_ENDPOINT=endpoint, RANKSCOPE_RUN="demo", OMP_NUM_THREADS="1")
        print(f"[demo] training: {' '.join(train[2:])}", flush=True)
        rc = subprocess.call(train, env=env)
        print(f"[demo] training finished (exit {rc}); try:\n"
              f"  .venv/bin/rankscope sql --data-dir {args.data_dir} "
              f"\"select op, count(*) n, round(avg(busbw_gbs), 3) busbw from comm group by op\"", flush=True)
        if args.exit or dashboard is None:
            return rc
        print("[demo] collector and dashboard keep running; Ctrl-C to stop.", flush=True)
        dashboard.wait()
        return rc
    except KeyboardInterrupt:
        return 130
    finally:
        _stop(dashboard)
        _stop(collector)
