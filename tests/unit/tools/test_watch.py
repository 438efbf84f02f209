"""`rankscope import --watch DIR` as a real process over a real data dir: 1,000 files
dropped while it runs and 100 dropped while it was stopped are each ingested exactly
once; corrupt files are named and skipped without being retried; a dropped archive
restores its run once.

Split by tier: what needs processes, sockets or seconds is in tests/integration/tools/test_watch.py."""

from __future__ import annotations

import pytest

from tests._import_util import rankscope


@pytest.mark.parametrize("bad", ["missing", "file"])
def test_watch_needs_a_folder(tmp_path, bad, capsys):
    target = tmp_path / "x"
    if bad == "file":
        target.write_text("")
    assert rankscope("import", "--watch", target, "--data-dir", tmp_path / "d") == 1
    assert "is not a folder" in capsys.readouterr().err
