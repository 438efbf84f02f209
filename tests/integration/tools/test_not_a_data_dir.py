"""Commands that read a data dir refuse a folder that is not one, say so, and create nothing
there (``sql`` used to leave parquet/ placeholders and a catalog and answer "0 rows").
``import`` may start a data dir in a new or empty folder, never in some other folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "sample_runs"


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _rankscope(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "collector.tools.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


@pytest.fixture
def folder(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "readme.txt").write_text("not a data dir\n")
    return folder


@pytest.mark.parametrize(
    "command",
    [
        ["sql", "--data-dir", "{d}", "select 1"],
        ["export", "--data-dir", "{d}", "--parquet", "somerun", "{out}"],
        ["health", "somerun", "--data-dir", "{d}"],
        ["replay", "{d}", "--run", "somerun", "--endpoint", "127.0.0.1:1"],
    ],
    ids=lambda c: c[0],
)
def test_reading_commands_refuse_a_folder_that_is_not_a_data_dir(folder, tmp_path, command):
    before = _tree(folder)
    proc = _rankscope(*(a.format(d=folder, out=tmp_path / "out") for a in command))
    assert proc.returncode != 0
    assert "not a rankscope data dir" in proc.stderr or "not an archive, a data dir" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert _tree(folder) == before


def test_import_refuses_a_non_empty_folder_that_is_not_a_data_dir_and_starts_one_in_a_new_folder(folder, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "Train_Samples_lr.csv").write_text("step,lr\n1,0.1\n")
    before = _tree(folder)
    refused = _rankscope("import", src, "--data-dir", folder)
    assert refused.returncode == 1 and "not a rankscope data dir" in refused.stderr, refused.stderr
    assert _tree(folder) == before
    fresh = _rankscope("import", src, "--data-dir", tmp_path / "new")
    assert fresh.returncode == 0, fresh.stderr
    assert (tmp_path / "new" / "parquet").is_dir()


def test_replay_refuses_a_speed_that_is_not_a_number(tmp_path):
    for speed in ("nan", "inf", "-1"):
        proc = _rankscope("replay", SAMPLE, "--run", "x", "--speed", speed, "--endpoint", "127.0.0.1:1")
        assert proc.returncode == 1 and "--speed must be a finite number >= 0" in proc.stderr, proc.stderr
