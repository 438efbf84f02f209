"""trainer.pipe.topology's layout: rank = stage * (dp * tp) + data_rank * tp + tp_rank, the group rank
lists every rank makes, and a clear error for each layout that cannot be (pure: no process group)."""

from __future__ import annotations

import pytest

from trainer.config import ConfigError
from trainer.pipe.topology import PipelineError, PipeTopology


def test_pp2_tp2_dp2_puts_tensor_parallel_innermost():
    places = [(t.stage, t.data_rank, t.tp_rank) for t in (PipeTopology.of(2, 2, 8, r) for r in range(8))]
    assert places == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    top = PipeTopology.of(2, 2, 8, 5)
    assert (top.num_stages, top.data_parallel, top.tensor_parallel) == (2, 2, 2)
    assert top.tensor_parallel_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert top.data_parallel_groups() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert top.pipelines() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # the neighbours of rank 5 (stage 1, data_rank 0, tp_rank 1) keep its data and tensor-parallel rank
    assert (top.rank_of(0), top.rank_of(1), top.rank_of(0, 1, 0)) == (1, 5, 2)
    assert top.pipelines(stages=[1]) == [[4], [5], [6], [7]]


def test_every_rank_is_in_exactly_one_group_of_each_kind():
    top = PipeTopology.of(3, 2, 24, 0)  # dp 4
    for groups in (top.tensor_parallel_groups(), top.data_parallel_groups(), top.pipelines()):
        assert sorted(r for g in groups for r in g) == list(range(24))
    for r in range(24):
        mine = PipeTopology.of(3, 2, 24, r)
        assert mine.rank_of(mine.stage) == r
        assert [g for g in top.pipelines() if r in g] == [[mine.rank_of(s) for s in range(3)]]


def test_without_tensor_parallelism_it_is_deepspeeds_pipe_data_layout():
    for r in range(6):
        top = PipeTopology.of(3, 1, 6, r)
        assert (top.stage, top.data_rank, top.tp_rank) == (r // 2, r % 2, 0)
        assert top.rank_of(top.stage) == top.stage * 2 + top.data_rank
    assert PipeTopology(3, 2, 3) == PipeTopology.of(3, 1, 6, 3)  # the positional form of before


@pytest.mark.parametrize(
    ("stages", "tp", "world", "error", "message"),
    [
        (3, 1, 8, PipelineError, r"^num_stages \(3\) must divide distributed world size \(8\)$"),
        (0, 1, 8, PipelineError, r"^PipelineModule: num_stages must be a positive integer$"),
        (
            2,
            3,
            8,
            ConfigError,
            r"^tensor_parallel\.tp_size: must divide the ranks of a stage \(world size 8 / num_stages 2 = 4\) "
            r"\(got 3\)$",
        ),
        (2, 0, 8, ConfigError, r"^tensor_parallel\.tp_size: must be >= 1 \(got 0\)$"),
    ],
    ids=["stages-not-dividing-the-world", "no-stages", "tp-not-dividing-a-stage", "tp-zero"],
)
def test_a_layout_that_cannot_be_names_the_key_and_the_numbers(stages, tp, world, error, message):
    with pytest.raises(error, match=message):
        PipeTopology.of(stages, tp, world, 0)
