"""A running `rankscope collect` advertises itself in D/collector.json; `stacks`/`profile` find it
from --data-dir with no --endpoint and say which they used; a clean stop withdraws the file."""

import json
import re
import signal
import subprocess
import sys


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def test_commands_find_the_collector_of_their_data_dir(tmp_path):
    data = tmp_path / "data"
    collect = subprocess.Popen(
        [sys.executable, "-m", "collector.tools.cli", "collect", "--data-dir", str(data), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = collect.stdout.readline()  # "listening on ...": the file is written before it
        port = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        assert port, f"collect did not say where it listens: {line!r}"
        advertised = json.loads((data / "collector.json").read_text())
        assert advertised["endpoint"] == f"127.0.0.1:{port[1]}" and advertised["pid"] == collect.pid

        asked = _cli("stacks", "no-such-run", "--ranks", "0", "--wait", "0", "--data-dir", str(data))
        assert f"using the collector at 127.0.0.1:{port[1]}, from {data / 'collector.json'}" in asked.stderr, (
            asked.stderr
        )
        assert "UNAVAILABLE" not in asked.stdout + asked.stderr, "stacks did not reach the advertised collector"
        assert "Traceback" not in asked.stderr
    finally:
        collect.send_signal(signal.SIGTERM)
        _out, err = collect.communicate(timeout=60)
    assert collect.returncode == 0, err
    assert not (data / "collector.json").exists(), "a clean stop must withdraw D/collector.json"

    after = _cli("stacks", "no-such-run", "--ranks", "0", "--wait", "0", "--data-dir", str(data))
    assert "no running collector advertised in" in after.stderr and "--endpoint" in after.stderr, after.stderr
