"""What the browser tests share: their markers, where their screenshots go and a dashboard to point them at."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.testing.dashboard import CHROMIUM, DashboardProcess, chromium_installed

SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"  # the README's tour uses them

NEEDS_CHROMIUM = [
    pytest.mark.browser,
    pytest.mark.skipif(not chromium_installed(), reason=f"Debian's chromium is not installed at {CHROMIUM}"),
]


def serve_dashboard(data_dir):
    """A module fixture's body: a dashboard process over ``data_dir``, its URL yielded, stopped after
    the module's tests (``yield from serve_dashboard(data_dir)``)."""
    dashboard = DashboardProcess(data_dir)
    yield dashboard.url
    dashboard.stop(timeout=10)
