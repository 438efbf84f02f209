"""The health summary (collector/data/findings): warnings first, durations as a reader says them,
and one story per rank (a hung rank is told by the hang only)."""

from __future__ import annotations

import pandas as pd

from collector.data import findings as health
from collector.testing.step_frames import step_rows
from tests.unit.data.findings.test_messages import summary


def test_summary_puts_warnings_first():
    scales = pd.DataFrame({"step": [0], "scale": [1.0], "overflow": [False]})
    steps = step_rows(4, 20, late_rank=3, late_ms=30.0)
    found = health.summarize(steps=steps, log_summary=summary([]), scales=scales, world_size=4)
    assert [f.severity for f in found] == ["warning", "info", "ok"]


def test_durations_read_naturally():
    assert [health.duration(ms) for ms in (41.2, 0.43, 0.002)] == ["41 ms", "0.4 ms", "2 µs"]


def test_a_hung_rank_is_told_once_by_the_hang_not_again_as_a_straggler():
    from collector.data.findings import Finding, _one_story

    hang = Finding(kind="hang", severity="critical", ranks=(1,), text="hang", evidence={"missing_ranks": [1]})
    late = Finding(kind="straggler", severity="warning", ranks=(1,), text="rank 1 costs", cost_ms_per_step=3.0)
    other = Finding(kind="straggler", severity="warning", ranks=(2,), text="rank 2 costs", cost_ms_per_step=3.0)
    assert _one_story([late, hang, other]) == [hang, other]
    assert _one_story([late, other]) == [late, other]


def test_a_whatif_verdict_on_the_slow_links_ranks_is_told_by_the_link():
    from collector.data.findings import Finding, _one_story

    link = Finding(kind="slow_link", severity="warning", ranks=(2,), text="host-2's link", steps=(20, 54),
                   evidence={"affected_ranks": [0, 2, 3]})  # fmt: skip
    # a pipeline's last stage (ranks 2, 3) long because its data-parallel all_reduce crossed the link
    stage = Finding(kind="whatif_stage", severity="warning", text="the last stage is long",
                    evidence={"top_workers": {"3": 6.6, "2": 6.5, "0": 1.5, "1": 1.5}})  # fmt: skip
    assert _one_story([link, stage]) == [link]
    # its slowest worker never used the link: another story, told
    other = Finding(kind="whatif_worker", severity="warning", ranks=(1,), text="rank 1",
                    evidence={"top_workers": {"1": 3.0, "0": 1.0}})  # fmt: skip
    assert _one_story([link, other]) == [link, other]
    assert _one_story([stage]) == [stage]  # no link: the replay's verdict stands
