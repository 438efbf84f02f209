"""collector.testing.flops_models: every model runs on its inputs, the analytic SDPA
count is the formula, and the rest of the kit never loads torch.

Split by tier: the pure-function tests are in tests/unit/testing/test_flops_models.py."""

from __future__ import annotations

import subprocess
import sys


def test_only_the_flops_models_import_torch():
    code = (
        "import sys, collector.testing, collector.testing.ports, collector.testing.collectors, "
        "collector.testing.streams, collector.testing.fake_runs, collector.testing.dashboard, "
        "collector.testing.pki; print('torch' in sys.modules, 'pytest' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]
