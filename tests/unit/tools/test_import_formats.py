"""Each importer on the other variants of its format (older DeepSpeed releases,
rankscope's own comms logger), written here in those exact shapes, and its
(file, line) problems."""

from __future__ import annotations

import json
import textwrap

import pytest

from collector.tools.importers import comms_summary, comms_verbose, csv_monitor, flops_text, tensorboard
from collector.tools.importers.base import parse_metric, parse_size
from collector.tools.importers.dispatch import parse_path

# DeepSpeed <= 0.14 printed figures on the opening line, separated by commas (as in the tutorial).
OLD_FLOPS = textwrap.dedent("""\
    -------------------------- DeepSpeed Flops Profiler --------------------------
    Profile Summary at step 10:
    world size:                                                   1
    params per gpu:                                               336.23 M
    fwd flops per GPU:                                            6279.86 G
    bwd latency:                                                  108.02 ms
    ------------------------------ Detailed Profile per GPU ------------------------------
    Each module profile is listed after its name in the following order:
    params, percentage of total params, MACs, percentage of total MACs, fwd latency, percentage of total fwd latency, fwd FLOPS

    BertForPreTrainingPreLN(
      336.23 M, 100.00% Params, 3139.93 GMACs, 100.00% MACs, 76.39 ms, 100.00% latency, 82.21 TFLOPS,
      (bert): BertModel(
        335.15 M, 99.68% Params, 3092.96 GMACs, 98.50% MACs, 34.29 ms, 44.89% latency, 180.4 TFLOPS,
        (embeddings): BertEmbeddings(...)
        (encoder): BertEncoder(
          302.31 M, 89.91% Params, 3092.88 GMACs, 98.50% MACs, 33.45 ms, 43.79% latency, 184.93 TFLOPS,
          (query): Linear(1.05 M, 0.31% Params, 10.74 GMACs, 0.34% MACs, 182.39 us, 0.24% latency, 117.74 TFLOPS,...)
          (broken): Linear(lots of params, 0.31% Params)
        )
      )
    )
    ------------------------------------------------------------------------------
""")


def test_old_flops_profile_tree(tmp_path):
    path = tmp_path / "profile.txt"
    path.write_text(OLD_FLOPS)
    assert flops_text.detect(path)
    parsed = flops_text.parse(path)
    rows = {r["module"]: r for r in parsed.rows[("flops", 0)]}
    assert list(rows) == ["", "bert", "bert.embeddings", "bert.encoder", "bert.encoder.query", "bert.encoder.broken"]
    assert rows[""]["flops"] == 6_279_860_000_000 and rows[""]["bwd_latency_ns"] == 108_020_000
    assert rows["bert.encoder.query"]["parent"] == "bert.encoder" and rows["bert.encoder.query"]["depth"] == 3
    assert rows["bert.encoder.query"]["macs"] == 10_740_000_000
    assert rows["bert.encoder.query"]["flops"] == pytest.approx(117.74e12 * 182.39e-6, rel=1e-9)
    assert rows["bert.embeddings"]["params"] is None  # collapsed: no figures printed
    assert [str(p) for p in parsed.problems] == [
        f"{path}:line 19: cannot read the figures of module 'bert.encoder.broken': "
        "'lots of params, 0.31% Params)'; module figures left empty"
    ]


def test_verbose_line_variants_and_a_bad_line(tmp_path):
    path = tmp_path / "train.log"
    path.write_text(
        "[2022-06-26 01:39:55,722] [INFO] [] [Rank 0] rank=0 | comm op: reduce_scatter_tensor | time (ms): 9.46 "
        "| msg size: 678.86 MB | algbw (Gbps): 1204.52  | busbw (Gbps): 1129.23\n"
        "some other output\n"
        "[rankscope] [Rank 1] rank=1 | comm op: all_gather_into_tensor | time (ms): 0.50 | msg size: 8.0 KB "
        "| algbw (Gbps): 0.13  | busbw (Gbps): 0.07\n"
        "[2022-06-26 01:39:56,470] [INFO] [Rank 0] comm op: all_gather_into_tensor | time (ms): garbage\n"
    )
    parsed = comms_verbose.parse(path, world_size=2)
    (ds,) = parsed.rows[("comm", 0)]
    assert ds["op"] == "reduce_scatter_tensor" and ds["bytes"] == round(678.86 * 2**20)  # already the full input
    assert ds["end_ns"] - ds["start_ns"] == 9_460_000
    (ours,) = parsed.rows[("comm", 1)]
    assert ours["bytes"] == 8192 and ours["start_ns"] is None  # rankscope sizes are S already; no time stamp
    assert [(p.where, p.message) for p in parsed.problems] == [
        ("line 4", "a 'comm op:' line in an unknown format; skipped")
    ]


def test_deepspeed_gather_sizes_are_scaled_to_the_whole(tmp_path):
    path = tmp_path / "c.log"
    path.write_text(
        "[2026-01-01 00:00:00,000] [INFO] [x] [Rank 0] comm op: all_gather_into_tensor | time (ms): 1.00 "
        "| msg size: 1.0 KB | algbw (Gbps): 0.01 | busbw (Gbps): 0.01\n"
    )
    (row,) = comms_verbose.parse(path, world_size=4).rows[("comm", 0)]
    assert row["bytes"] == 4096 and row["algbw_gbs"] == pytest.approx(4096 / 1e6)
    assert row["busbw_gbs"] == pytest.approx(4096 / 1e6 * 3 / 4)


def test_rankscope_flat_summary_and_debug_names(tmp_path):
    path = tmp_path / "summary_rank3.json"
    path.write_text(
        json.dumps(
            {
                "all_reduce | [Caller Func: step]": {
                    "1024": {
                        "count": 3,
                        "total_latency_ms": 3.0,
                        "avg_latency_ms": 1.0,
                        "tput_avg_gbps": 1,
                        "busbw_avg_gbps": 1,
                    }
                },
                "log_summary_barrier": {"0": {"count": 1, "avg_latency_ms": 0.5}},
            }
        )
    )
    assert comms_summary.detect(path)
    parsed = comms_summary.parse(path, world_size=4)
    rows = parsed.rows[("comm", 3)]
    assert [r["op"] for r in rows] == ["all_reduce"] * 3 + ["barrier"]
    assert rows[0]["log_name"] == "all_reduce | [Caller Func: step]" and rows[0]["bytes"] == 1024
    assert all(r["start_ns"] is None and r["seq"] is None for r in rows)


def test_summary_with_a_bad_entry_keeps_the_others(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(
        json.dumps(
            {
                "summary": {"all_reduce": {"8": {"count": 2, "avg_latency_ms": 1.0}, "16": {"count": "two"}}},
                "metadata": {"rank": 0, "world_size": 2},
            }
        )
    )
    parsed = comms_summary.parse(path)
    assert len(parsed.rows[("comm", 0)]) == 2
    assert [p.where for p in parsed.problems] == ["summary['all_reduce']['16']"]


def test_csv_monitor_tags_and_bad_rows(tmp_path):
    (tmp_path / "Time_per_step.csv").write_text("step,Time per step\n8,0.5\n")
    assert csv_monitor.parse(tmp_path / "Time_per_step.csv").rows[("monitor", 0)][0]["tag"] == "Time per step"
    bad = tmp_path / "Train_Samples_loss.csv"
    bad.write_text("step,loss\n8,1.0\n16,2.0,3.0\nx,1\n32,4.0\n")
    parsed = csv_monitor.parse(bad)
    assert [(r["tag"], r["samples"], r["value"]) for r in parsed.rows[("monitor", 0)]] == [
        ("Train/Samples/loss", 8, 1.0),
        ("Train/Samples/loss", 32, 4.0),
    ]
    assert [p.where for p in parsed.problems] == ["line 3", "line 4"]


def test_unit_parsing():
    assert parse_size("678.86 MB") == round(678.86 * 2**20) and parse_size("0B") == 0
    assert parse_metric("1.8 Gs", "s") == 1.8e9 and parse_metric("0 MACs", "MACs") == 0
    with pytest.raises(ValueError):
        parse_metric("5 KFLOPS", "MACs")


def test_missing_path_is_a_problem(tmp_path):
    result = parse_path(tmp_path / "nope")
    assert [p.message for p in result.parsed.problems] == ["no such file or directory"]


@pytest.mark.parametrize("parser", [comms_summary, comms_verbose, csv_monitor, flops_text, tensorboard])
def test_a_file_that_cannot_be_read_is_one_problem_naming_it(parser, tmp_path):
    path = tmp_path / "not-a-file"
    path.mkdir()  # opening a directory fails with an OSError, even for root
    parsed = parser.parse(path)
    assert not parsed.rows
    assert [(p.path, p.where, p.message) for p in parsed.problems] == [(str(path), "", "cannot read: Is a directory")]


def test_hostile_csv_rows_are_file_line_problems_and_the_rest_is_imported(tmp_path, capsys):
    from collector.tools.importers.dispatch import parse_path

    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "Train_Samples_lr.csv").write_text("step,lr\n1,0.1\n2,0.2\n")
    (folder / "Train_Samples_loss.csv").write_text(
        "step,loss\n1,0.1\n9223372036854775808,0.2\n-9223372036854775809,1\n3,0.3\n"
    )
    (folder / "Train_Samples_big.csv").write_text('step,big\n1,0.5\n2,"' + "x" * (200 << 10) + '"\n3,0.7\n')
    parsed = parse_path(folder).parsed
    problems = sorted(str(p) for p in parsed.problems)
    assert problems == sorted(
        [
            f"{folder / 'Train_Samples_big.csv'}:line 3: field larger than field limit (131072); "
            "the rest of the file is skipped",
            f"{folder / 'Train_Samples_loss.csv'}:line 3: step = 9223372036854775808 does not fit in a "
            "64-bit integer; row skipped",
            f"{folder / 'Train_Samples_loss.csv'}:line 4: step = -9223372036854775809 does not fit in a "
            "64-bit integer; row skipped",
        ]
    )
    assert parsed.row_count("monitor") == 2 + 2 + 1
