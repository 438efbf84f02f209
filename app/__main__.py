"""``python -m app --data-dir D [--port 8501] [--host 127.0.0.1]``: serve the dashboard.

Streamlit runs an entry *file*; this module knows where the app's is, so the tools
start the dashboard as a process without looking inside the package."""

import argparse
import os
import sys
from pathlib import Path

ENTRY = Path(__file__).parent / "serve.py"  # main.py, served with preload.PlotlyEarly


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m app", description="Serve the rankscope dashboard.")
    p.add_argument("--data-dir", default="rankscope-data")
    p.add_argument("--port", type=int, default=8501)
    p.add_argument("--host", default="127.0.0.1")
    args = p.parse_args(argv)
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(ENTRY),
        "--server.port",
        str(args.port),
        "--server.address",
        args.host,
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        # a viewer of this app needs no "Deploy" button or developer menu
        "--client.toolbarMode",
        "viewer",
        # Streamlit runs a full gc.collect(2) after every script run, a live page's 1 s refreshes
        # included: a quarter of the server's CPU with one live Overview open (py-spy, issue 48).
        # Python's own generational collection still runs.
        "--runner.postScriptGC",
        "false",
        # nor does it reload the app when its source files change: no watcher threads polling them
        "--server.fileWatcherType",
        "none",
        "--",
        "--data-dir",
        os.path.abspath(args.data_dir),
    ]
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    main()
