"""The OSDI'25 trace importer on bad input: every problem names the file and what is wrong, nothing
raises; and on a good trace, what it makes of the workers, steps and groups."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from collector.tools.importers import osdi_trace
from collector.tools.importers.dispatch import parse_path

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "osdi25_whatif"


@pytest.fixture
def st(tmp_path) -> Path:
    for f in ("trace-ST.parquet", "meta-ST.yaml"):
        shutil.copy(DATA / f, tmp_path / f)
    return tmp_path / "trace-ST.parquet"


def problems(path) -> list[str]:
    return [str(p) for p in parse_path(path).parsed.problems]


def test_a_good_trace(st):
    parsed = parse_path(st).parsed
    assert not parsed.problems
    assert parsed.world_size == 8 and parsed.ranks == set(range(8))  # DP 2 x PP 4 workers
    pipe = [r for (table, _), rows in parsed.rows.items() if table == "pipe" for r in rows]
    assert {(r["stage"], r["data_rank"]) for r in pipe} == {(s, d) for s in range(4) for d in range(2)}
    comm = [r for (table, _), rows in parsed.rows.items() if table == "comm" for r in rows]
    groups = {r["group_name"] for r in comm}
    assert {"world", "dp.stage0", "dp.stage3"} <= groups and any(g.startswith("p2p[") for g in groups)
    # steps laid end to end: every op of a step starts after the last op of the step before
    timers = pd.DataFrame([r for (table, _), rows in parsed.rows.items() if table == "timers" for r in rows])
    spans = (
        timers.assign(end=timers.start_ns + timers.dur_ns)
        .groupby("step")
        .agg(lo=("start_ns", "min"), hi=("end", "max"))
    )
    assert (spans.lo.to_numpy()[1:] > spans.hi.to_numpy()[:-1]).all()


def test_missing_meta_is_named(st):
    (st.parent / "meta-ST.yaml").unlink()
    (found,) = problems(st)
    assert "meta-ST.yaml" in found and "trace-ST.parquet" in found


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("dp_size: 2\npp_size: 4\nworld_size: 9\n", "world_size 9 is not dp x pp x tp x dsp = 8"),
        ("dp_size: two\npp_size: 4\nworld_size: 8\n", "dp_size must be a positive integer, not 'two'"),
        ("dp_size: 2\npp_size: 4\nvpp_size: 2\nworld_size: 8\n", "vpp_size > 1"),
        ("- 1\n- 2\n", "is not a mapping"),
        ("dp_size: [\n", "meta-ST.yaml"),
    ],
)
def test_bad_meta_is_named(st, text, says):
    (st.parent / "meta-ST.yaml").write_text(text)
    (found,) = problems(st)
    assert says in found and "meta-ST.yaml" in found, found


def test_rows_outside_the_meta_are_skipped_and_said(st):
    df = pd.read_parquet(st)
    df["optype"] = df.optype.astype(str)
    df.loc[df.index[:3], "stage"] = 9
    df.loc[df.index[3], "optype"] = "warp-drive"
    df.to_parquet(st)
    found = problems(st)
    assert any("warp-drive" in p for p in found) and any("3 rows with a dp_rank or stage outside" in p for p in found)


def test_detect_claims_only_its_schema(tmp_path, st):
    other = tmp_path / "comm.parquet"
    pd.DataFrame({"rank": [0], "step": [1]}).to_parquet(other)
    assert osdi_trace.detect(st) and not osdi_trace.detect(other)


def test_two_traces_in_one_folder_are_not_merged(st):
    for f in ("trace-ST.parquet", "meta-ST.yaml"):
        shutil.copy(DATA / f, st.parent / f.replace("ST", "ST2"))
    result = parse_path(st.parent)
    assert result.parsed.world_size == 8 and result.parsed.ranks == set(range(8))
    (found,) = [str(p) for p in result.parsed.problems]
    assert "a second OSDI'25 trace" in found and "import each on its own" in found
