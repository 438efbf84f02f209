"""LR schedules against DeepSpeed's documented formulas, evaluated by hand here.

Convention (DeepSpeed's): after the k-th call of ``step()`` the schedule is at
``last_batch_iteration = k - 1``; before any step it is at -1."""

import math

import pytest
import torch

from trainer.lr_schedules import build_scheduler


def _adam(lr=0.5, groups=1):
    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(groups)]
    return torch.optim.Adam([{"params": [p]} for p in params], lr=lr, betas=(0.85, 0.999))


def _lrs_after_each_step(sched, n):
    out = []
    for _ in range(n):
        sched.step()
        out.append(sched.get_last_lr()[0])
    return out


def test_none_config_gives_no_scheduler():
    assert build_scheduler(_adam(), None) is None


def test_warmup_lr_linear_then_constant():
    opt = _adam()
    sched = build_scheduler(
        opt,
        {
            "type": "WarmupLR",
            "params": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.011, "warmup_num_steps": 10, "warmup_type": "linear"},
        },
    )
    assert opt.param_groups[0]["lr"] == pytest.approx(0.001)  # min lr before the first step
    got = _lrs_after_each_step(sched, 14)
    # iteration i < 10: 0.001 + 0.010 * i / 10; afterwards the max.
    want = [0.001 + 0.001 * i for i in range(10)] + [0.011] * 4
    assert got == pytest.approx(want)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.011)


def test_warmup_lr_log_is_the_default_type():
    sched = build_scheduler(_adam(), {"type": "WarmupLR", "params": {"warmup_max_lr": 0.02, "warmup_num_steps": 8}})
    got = _lrs_after_each_step(sched, 10)
    # gamma = ln(i + 1) / ln(8): 0 at i=0, 1/3 at i=1 (ln 2 / ln 8), 2/3 at i=3, 1 from i=7 on.
    assert got[0] == pytest.approx(0.0)
    assert got[1] == pytest.approx(0.02 / 3)
    assert got[3] == pytest.approx(0.02 * 2 / 3)
    assert got[7:] == pytest.approx([0.02] * 3)


def test_warmup_lr_per_group_values():
    opt = _adam(groups=2)
    sched = build_scheduler(
        opt,
        {
            "type": "WarmupLR",
            "params": {
                "warmup_min_lr": [0.0, 0.1],
                "warmup_max_lr": [1.0, 0.2],
                "warmup_num_steps": 4,
                "warmup_type": "linear",
            },
        },
    )
    sched.step()
    sched.step()
    sched.step()  # iteration 2: half way
    assert sched.get_last_lr() == pytest.approx([0.5, 0.15])
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.5, 0.15])


def test_warmup_decay_lr_linear_decay_to_zero():
    sched = build_scheduler(
        _adam(),
        {
            "type": "WarmupDecayLR",
            "params": {
                "warmup_min_lr": 0.0,
                "warmup_max_lr": 0.1,
                "warmup_num_steps": 4,
                "total_num_steps": 12,
                "warmup_type": "linear",
            },
        },
    )
    got = _lrs_after_each_step(sched, 15)
    # warmup i<4: 0.1*i/4; then 0.1 * (12 - i) / (12 - 4), floored at 0.
    want = [0.1 * i / 4 for i in range(4)] + [0.1 * (12 - i) / 8 for i in range(4, 13)] + [0.0, 0.0]
    assert got == pytest.approx(want)
    assert got[4] == pytest.approx(0.1) and got[12] == 0.0


def test_warmup_cosine_lr_scales_the_optimizer_lr():
    opt = _adam(lr=0.2)
    sched = build_scheduler(
        opt,
        {
            "type": "WarmupCosineLR",
            "params": {
                "total_num_steps": 10,
                "warmup_num_steps": 2,
                "warmup_min_ratio": 0.5,
                "cos_min_ratio": 0.1,
                "warmup_type": "linear",
            },
        },
    )
    got = _lrs_after_each_step(sched, 10)
    assert got[0] == pytest.approx(0.2 * 0.5)  # warmup start ratio
    assert got[1] == pytest.approx(0.2 * 0.75)  # half way 0.5 -> 1
    # after warmup: 0.1 + 0.9 * (1 + cos(pi * (i - 1) / 8)) / 2
    for i in range(2, 10):
        ratio = 0.1 + 0.9 * (1 + math.cos(math.pi * (i - 1) / 8)) / 2
        assert got[i] == pytest.approx(0.2 * ratio)
    assert got[9] == pytest.approx(0.2 * 0.1)  # ends at cos_min_ratio


def test_one_cycle_triangle_then_decay_and_momentum():
    opt = _adam()
    sched = build_scheduler(
        opt,
        {
            "type": "OneCycle",
            "params": {
                "cycle_min_lr": 0.01,
                "cycle_max_lr": 0.1,
                "cycle_first_step_size": 4,
                "cycle_second_step_size": 6,
                "decay_step_size": 2,
                "decay_lr_rate": 0.5,
                "cycle_min_mom": 0.8,
                "cycle_max_mom": 0.9,
                "decay_mom_rate": 0.1,
            },
        },
    )
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)
    assert opt.param_groups[0]["betas"] == pytest.approx((0.8, 0.999))
    for i in range(16):
        sched.step()
        b = i + 1  # batches seen
        if b <= 4:
            frac = b / 4  # rising edge
        elif b <= 10:
            frac = (10 - b) / 6  # falling edge
        if i < 10:
            want_lr = 0.01 + 0.09 * frac
            want_mom = 0.9 - 0.1 * frac
        else:
            d = i - 10 + 1
            want_lr = 0.01 / (1 + 0.5 * d / 2)
            want_mom = 0.9 * (1 + 0.1 * d / 2)
        assert sched.get_last_lr()[0] == pytest.approx(want_lr), i
        beta1, beta2 = opt.param_groups[0]["betas"]
        assert beta1 == pytest.approx(want_mom), i
        assert beta2 == 0.999  # the group's own beta2 is kept
    # peak and trough of the cycle
    sched.step(3)
    assert sched.get_last_lr()[0] == pytest.approx(0.1)
    sched.step(9)
    assert sched.get_last_lr()[0] == pytest.approx(0.01)


def test_one_cycle_without_decay_stays_at_min_and_cycles_sgd_momentum():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0, momentum=0.5)
    sched = build_scheduler(
        opt, {"type": "OneCycle", "params": {"cycle_min_lr": 0.2, "cycle_max_lr": 1.0, "cycle_first_step_size": 2}}
    )
    got = _lrs_after_each_step(sched, 6)
    # second step size defaults to the first: 0.6, 1.0, 0.6, 0.2 then min lr (no decay).
    assert got == pytest.approx([0.6, 1.0, 0.6, 0.2, 0.2, 0.2])
    assert opt.param_groups[0]["momentum"] == pytest.approx(0.9)


def test_lr_range_test_continuous_and_staircase():
    params = {"lr_range_test_min_lr": 0.001, "lr_range_test_step_size": 4, "lr_range_test_step_rate": 5}
    cont = build_scheduler(_adam(), {"type": "LRRangeTest", "params": params})
    stair = build_scheduler(_adam(), {"type": "LRRangeTest", "params": {**params, "lr_range_test_staircase": True}})
    assert cont.get_last_lr() == pytest.approx([0.001])
    c, s = _lrs_after_each_step(cont, 9), _lrs_after_each_step(stair, 9)
    # lr = 0.001 * (1 + 5 * (i + 1) / 4), the interval floored for staircase.
    assert c == pytest.approx([0.001 * (1 + 5 * (i + 1) / 4) for i in range(9)])
    assert s == pytest.approx([0.001 * (1 + 5 * ((i + 1) // 4)) for i in range(9)])
    assert s[2] == pytest.approx(0.001) and s[3] == pytest.approx(0.006)


@pytest.mark.parametrize(
    "cfg",
    [
        {"type": "WarmupLR", "params": {"warmup_num_steps": 5, "warmup_max_lr": 0.1}},
        {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 3, "total_num_steps": 9}},
        {
            "type": "OneCycle",
            "params": {
                "cycle_min_lr": 0.1,
                "cycle_max_lr": 1.0,
                "cycle_first_step_size": 3,
                "decay_step_size": 1,
                "decay_lr_rate": 0.2,
            },
        },
        {"type": "LRRangeTest", "params": {"lr_range_test_step_size": 2}},
    ],
)
def test_state_dict_round_trip_resumes_the_same_curve(cfg):
    reference = build_scheduler(_adam(), cfg)
    want = _lrs_after_each_step(reference, 12)

    first = build_scheduler(_adam(), cfg)
    _lrs_after_each_step(first, 5)
    state = first.state_dict()
    assert state == {"last_batch_iteration": 4}

    opt = _adam()
    resumed = build_scheduler(opt, cfg)
    resumed.load_state_dict(state)
    assert resumed.get_last_lr() == pytest.approx([want[4]])
    assert opt.param_groups[0]["lr"] == pytest.approx(want[4])
    assert _lrs_after_each_step(resumed, 7) == pytest.approx(want[5:])


def test_unknown_type_names_key_and_allowed_values():
    with pytest.raises(ValueError, match=r"scheduler\.type.*WarmupDecayLR.*'Cosine'"):
        build_scheduler(_adam(), {"type": "Cosine", "params": {}})


@pytest.mark.parametrize(
    "cfg, key",
    [
        ({"type": "WarmupLR", "params": {"warmup_type": "cubic"}}, "warmup_type"),
        ({"type": "WarmupLR", "params": {"warmup_max_lr": "fast"}}, "warmup_max_lr"),
        ({"type": "WarmupLR", "params": {"warmup_num_steps": -1}}, "warmup_num_steps"),
        ({"type": "WarmupDecayLR", "params": {}}, "total_num_steps"),
        ({"type": "OneCycle", "params": {"cycle_max_lr": 0.1}}, "cycle_min_lr"),
        (
            {"type": "OneCycle", "params": {"cycle_min_lr": 0.1, "cycle_max_lr": 1, "cycle_first_step_size": 0}},
            "cycle_first_step_size",
        ),
        ({"type": "LRRangeTest", "params": {"lr_range_test_staircase": "yes"}}, "lr_range_test_staircase"),
        ({"type": "LRRangeTest", "params": {"lr_range_test_step_rate": -1}}, "lr_range_test_step_rate"),
        ({"type": "WarmupLR", "params": {"warmup_min_lr": [0.1, 0.2]}}, "warmup_min_lr"),  # 1 param group
    ],
)
def test_bad_params_name_the_dotted_key(cfg, key):
    with pytest.raises(ValueError, match=rf"scheduler\.params\.{key}"):
        build_scheduler(_adam(), cfg)


def test_unknown_params_warn_by_name_and_are_ignored():
    with pytest.warns(UserWarning, match=r"scheduler\.params\.warmup_steps"):
        sched = build_scheduler(_adam(), {"type": "WarmupLR", "params": {"warmup_steps": 10}})
    assert sched.warmup_num_steps == 1000  # the default, the misspelt key had no effect
