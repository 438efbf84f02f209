"""The `rankscope` entry point: every command answers --help with examples."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

COMMANDS = ["collect", "dashboard", "demo", "sql", "calibrate", "nvme-tune", "fr"]


def rankscope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_top_level_help_lists_commands():
    out = rankscope("--help")
    assert out.returncode == 0, out.stderr
    for cmd in COMMANDS:
        assert cmd in out.stdout


@pytest.mark.parametrize("cmd", COMMANDS)
def test_each_command_has_help_with_examples(cmd):
    out = rankscope(cmd, "--help")
    assert out.returncode == 0, out.stderr
    assert "examples:" in out.stdout and f"rankscope {cmd}" in out.stdout


def test_unknown_command_is_a_clear_error():
    out = rankscope("frobnicate")
    assert out.returncode == 2
    assert "invalid choice: 'frobnicate'" in out.stderr


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--flush-interval", "10"], "store.flush_interval: must be <= 5 (got 10.0)"),
        (["--flush-interval", "0"], "store.flush_interval: must be > 0 (got 0.0)"),
        (["--compaction-interval", "-1"], "compaction.interval: must be > 0 (got -1.0)"),
        (["--compaction-min-files", "1"], "compaction.min_files: must be >= 2 (got 1)"),
    ],
)
def test_collect_rejects_a_bad_setting_naming_its_key(tmp_path, flags, message):
    out = rankscope("collect", "--data-dir", str(tmp_path / "data"), "--port", "0", *flags)
    assert out.returncode == 2
    assert f"rankscope collect: {message}" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was created


SAMPLES = str(Path(__file__).resolve().parents[3] / "sample_runs")


@pytest.mark.parametrize(
    "args",
    [
        ["health", "zero2-slow-rank3", "--data-dir", SAMPLES, "--all"],
        ["health", "zero2-slow-rank3", "--data-dir", SAMPLES, "--json"],
        ["sql", "--data-dir", SAMPLES, "select * from comm"],
    ],
    ids=["health", "health-json", "sql"],
)
def test_a_reader_that_went_away_ends_the_command_quietly(args):
    """`rankscope health RUN | head`: the reader closed the pipe, so every write fails with EPIPE.
    The read end is closed before the command starts, so the failure is certain, not a race."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "collector.tools.cli", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert out.stderr == "", out.stderr  # no BrokenPipeError traceback, no "Exception ignored" either
    assert out.returncode == 141  # 128 + SIGPIPE, as a shell tool killed by the closed pipe
