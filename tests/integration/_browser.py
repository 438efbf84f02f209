"""What the browser tests share: their markers and where their screenshots go."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.testing.dashboard import CHROMIUM, chromium_installed

SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"  # the README's tour uses them

NEEDS_CHROMIUM = [
    pytest.mark.browser,
    pytest.mark.skipif(not chromium_installed(), reason=f"Debian's chromium is not installed at {CHROMIUM}"),
]
