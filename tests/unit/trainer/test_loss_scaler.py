"""Loss scaling against DeepSpeed's DynamicLossScaler semantics, sequences derived
by hand in the comments (iterations counted from 0; the scale grows when
(iteration - last_overflow_iteration) is a multiple of the window, the first
overflow-free window starting at last_overflow_iteration = -1)."""

import pytest
import torch

from trainer.loss_scaler import (
    DynamicLossScaler,
    LossScaleAtMinimumError,
    NoOpLossScaler,
    ScaleDecision,
    StaticLossScaler,
    build_loss_scaler,
    has_inf_or_nan,
)


def _fp16(**kw):
    return {"enabled": True, **kw}


def _run(scaler, overflows):
    return [scaler.update(o) for o in overflows]


def test_defaults_are_deepspeeds():
    s = build_loss_scaler(_fp16())
    assert isinstance(s, DynamicLossScaler)
    assert s.loss_scale == 2.0**16
    assert (s.scale_window, s.delayed_shift, s.consecutive_hysteresis, s.min_scale, s.scale_factor) == (
        1000,
        2,
        False,
        1.0,
        2.0,
    )


def test_scale_grows_after_each_window_of_good_steps():
    s = build_loss_scaler(_fp16(initial_scale_power=4, loss_scale_window=3))
    got = [d.scale_after for d in _run(s, [False] * 7)]
    # iterations 2 and 5 close a window of 3: 16 -> 32 -> 64
    assert got == [16, 16, 32, 32, 32, 64, 64]
    d = s.update(False)  # iteration 7: not a multiple of 3 after -1
    assert (d.skipped, d.overflow, d.reason) == (False, False, "no_overflow")


def test_hysteresis_delays_the_backoff_and_the_window_restarts_after_overflow():
    s = build_loss_scaler(_fp16(initial_scale_power=4, loss_scale_window=3, hysteresis=2))
    d = _run(s, [True, True, True, False, False, False, True])
    # it0 overflow: hysteresis 2 -> 1, scale kept;  it1: counter at 1 -> 16/2 = 8;  it2: 8/2 = 4
    assert [x.scale_after for x in d[:3]] == [16, 8, 4]
    assert [x.hysteresis_left for x in d[:3]] == [1, 1, 1]
    assert [x.reason for x in d[:3]] == ["hysteresis", "backoff", "backoff"]
    assert all(x.skipped for x in d[:3])
    # last overflow at it2: it5 is 3 later -> scale 8 and the hysteresis refilled to 2
    assert [x.scale_after for x in d[3:6]] == [4, 4, 8]
    assert d[5].reason == "grow" and d[5].hysteresis_left == 2
    assert [x.skipped for x in d[3:6]] == [False] * 3
    # it6 overflow is absorbed again
    assert (d[6].scale_before, d[6].scale_after, d[6].hysteresis_left, d[6].skipped) == (8, 8, 1, True)


@pytest.mark.parametrize(
    "consecutive, want_scales",
    [
        # refilled on every good step: isolated overflows never lower the scale
        (True, [16, 16, 16, 16, 16, 16]),
        # not refilled: the second overflow finds the counter at 1 and halves, so does the third
        (False, [16, 16, 8, 8, 4, 4]),
    ],
)
def test_consecutive_hysteresis(consecutive, want_scales):
    s = build_loss_scaler(
        _fp16(initial_scale_power=4, loss_scale_window=100, hysteresis=2, consecutive_hysteresis=consecutive)
    )
    d = _run(s, [True, False, True, False, True, False])
    assert [x.scale_after for x in d] == want_scales
    if consecutive:
        assert [x.hysteresis_left for x in d] == [1, 2, 1, 2, 1, 2]


def test_min_scale_floor_then_deepspeed_stops_the_run():
    s = build_loss_scaler(_fp16(initial_scale_power=2, hysteresis=1, min_loss_scale=3))
    d = s.update(True)
    assert (d.scale_before, d.scale_after, d.reason) == (4, 3, "backoff")  # max(4/2, 3)
    with pytest.raises(LossScaleAtMinimumError, match=r"fp16\.min_loss_scale \(3\)") as err:
        s.update(True)
    assert err.value.decision == ScaleDecision(3.0, 3.0, True, 1, True, "at_min_scale")
    assert s.loss_scale == 3


def test_min_scale_floor_without_raising():
    s = DynamicLossScaler(init_scale=4, min_scale=2, delayed_shift=1, raise_error_at_min_scale=False)
    d = _run(s, [True, True, True])
    assert [x.scale_after for x in d] == [2, 2, 2]
    assert [x.reason for x in d] == ["backoff", "at_min_scale", "at_min_scale"]


def test_state_dict_round_trip_continues_identically():
    cfg = _fp16(initial_scale_power=5, loss_scale_window=2, hysteresis=2)
    seq = [True, False, True, True, False, False, False, True, False, False, True, True]
    reference = _run(build_loss_scaler(cfg), seq)

    first = build_loss_scaler(cfg)
    _run(first, seq[:5])
    resumed = build_loss_scaler(cfg)
    resumed.load_state_dict(first.state_dict())
    assert _run(resumed, seq[5:]) == reference[5:]


def test_static_scale_skips_overflowing_steps_and_keeps_its_scale():
    s = build_loss_scaler(_fp16(loss_scale=128))
    assert isinstance(s, StaticLossScaler)
    d = _run(s, [False, True, False])
    assert [(x.scale_after, x.skipped) for x in d] == [(128, False), (128, True), (128, False)]
    assert d[1].reason == "static_overflow"


@pytest.mark.parametrize("fp16, bf16", [(None, False), ({"enabled": False}, True), (None, True)])
def test_fp32_and_bf16_never_scale_or_skip(fp16, bf16):
    s = build_loss_scaler(fp16, bf16_enabled=bf16)
    assert isinstance(s, NoOpLossScaler)
    d = s.update(True)
    assert (s.loss_scale, d.scale_after, d.skipped) == (1.0, 1.0, False)


@pytest.mark.parametrize(
    "cfg, key",
    [
        ({"hysteresis": 0}, "fp16.hysteresis"),
        ({"loss_scale_window": "often"}, "fp16.loss_scale_window"),
        ({"initial_scale_power": 2.5}, "fp16.initial_scale_power"),
        ({"min_loss_scale": 0}, "fp16.min_loss_scale"),
        ({"loss_scale": -1}, "fp16.loss_scale"),
        ({"consecutive_hysteresis": "yes"}, "fp16.consecutive_hysteresis"),
        ({"initial_scale_power": 1, "min_loss_scale": 4}, "fp16.min_loss_scale"),
    ],
)
def test_bad_values_name_the_key(cfg, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        build_loss_scaler(_fp16(**cfg))


def test_fp16_with_bf16_is_rejected_and_unknown_keys_warn():
    with pytest.raises(ValueError, match=r"fp16\.enabled and bf16\.enabled"):
        build_loss_scaler(_fp16(), bf16_enabled=True)
    with pytest.warns(UserWarning, match=r"fp16\.loss_scale_windw"):
        build_loss_scaler(_fp16(loss_scale_windw=10))


def test_has_inf_or_nan_is_a_device_tensor():
    finite = [torch.ones(3), None, torch.full((4,), 60000.0, dtype=torch.float16)]  # sum overflows fp16, values don't
    flag = has_inf_or_nan(finite)
    assert isinstance(flag, torch.Tensor) and flag.dtype == torch.bool and flag.dim() == 0
    assert not flag.item()
    assert has_inf_or_nan([*finite, torch.tensor([1.0, float("inf")])]).item()
    assert has_inf_or_nan([torch.tensor([[float("nan")]], dtype=torch.bfloat16), torch.ones(2)]).item()
    assert not has_inf_or_nan([]).item()
