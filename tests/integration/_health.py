"""`rankscope health RUN --json` as a user runs it (a fresh process), for the end-to-end tests."""

from __future__ import annotations

import json
import subprocess
import sys


def health(data_dir, run: str) -> list[dict]:
    out = subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", "health", run, "--data-dir", str(data_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)
