"""`rankscope demo`: a collector, a live multi-rank CPU training run of the
example GPT streaming into it, and the dashboard, all on this machine."""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

from collector.tools.launch import collector_command, dashboard_command, free_port, wait_for_collector

REPO_EXAMPLE_CONFIG = "zero2.json"


def _example_config() -> str:
    import importlib.util

    spec = importlib.util.find_spec("trainer")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("rankscope demo: the `trainer` package is not installed")
    return str(Path(list(spec.submodule_search_locations)[0]) / "examples" / "configs" / REPO_EXAMPLE_CONFIG)


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
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
            "-m", "trainer.examples.gpt", "--config", args.config or _example_config(),
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
