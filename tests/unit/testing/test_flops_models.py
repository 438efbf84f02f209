"""collector.testing.flops_models: every model runs on its inputs, the analytic SDPA
count is the formula, and the rest of the kit never loads torch.

Split by tier: what needs processes, sockets or seconds is in tests/integration/testing/test_flops_models.py."""

from __future__ import annotations

import pytest
import torch

from collector.testing.flops_models import MODELS, B, D, H, L, sdpa_flops


@pytest.mark.parametrize("name", list(MODELS))
def test_each_model_runs_on_its_inputs(name):
    make, inputs = MODELS[name]
    torch.manual_seed(0)
    out = make()(*inputs())
    assert out.shape[0] == B and torch.isfinite(out).all()


def test_sdpa_flops_is_4_b_h_lq_lk_d():
    assert sdpa_flops() == 4 * B * H * L * L * (D // H)
    assert sdpa_flops(batch=3, heads=2, lq=5, lk=7, head_dim=8) == 4 * 3 * 2 * 5 * 7 * 8
