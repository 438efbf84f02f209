"""``rankscope import`` of the OSDI'25 traces into a real data dir (Parquet segments, DuckDB
catalog), then ``rankscope whatif --json`` and ``rankscope health --json`` on the stored run:
the figures survive the round trip through rankscope's tables within the issue's tolerances
(3% slowdown / by_stage / by_dp_rank, 10% M_W / M_S of the authors' files), and health says
AR's slowed worker alone and SE's slowdown as moving across workers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests._import_util import rankscope

DATA = Path(__file__).resolve().parents[2] / "fixtures" / "osdi25_whatif"


def _json_of(capsys, *args) -> tuple[int, object]:
    capsys.readouterr()
    rc = rankscope(*args)
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", ["AR", "SE"])
def test_import_whatif_health(tmp_path, capsys, name):
    src = tmp_path / "in"
    src.mkdir()
    for f in (f"trace-{name}.parquet", f"meta-{name}.yaml"):
        shutil.copy(DATA / f, src / f)
    data = tmp_path / "data"
    assert rankscope("import", src / f"trace-{name}.parquet", "--run", name, "--data-dir", data) == 0
    rc, ours = _json_of(capsys, "whatif", name, "--data-dir", data, "--json")
    assert rc == 0
    result = json.loads((DATA / f"result-{name}.json").read_text())
    mw = json.loads((DATA / f"mw-{name}.json").read_text())["Mw"]
    ms = json.loads((DATA / f"ms-{name}.json").read_text())["Ms"]
    assert ours["slowdown"] == pytest.approx(result["blocking_slowdown"], rel=0.03)
    for key in ("by_stage", "by_dp_rank"):
        theirs = result[f"blocking_decompose_{key}"]
        assert ours[key] == pytest.approx(theirs, rel=0.03), key
    assert ours["m_w"] == pytest.approx(mw, rel=0.10, abs=0.01)
    assert ours["m_s"] == pytest.approx(ms, rel=0.10, abs=0.01)
    assert {"by_optype", "by_worker", "per_step"} <= set(ours)

    capsys.readouterr()
    assert rankscope("health", name, "--data-dir", data, "--json") == 1  # warnings
    found = json.loads(capsys.readouterr().out)
    kinds = {f["kind"] for f in found}
    if name == "AR":
        (worker,) = [f for f in found if f["kind"] == "whatif_worker"]
        assert worker["ranks"] == [0] and "dp_rank 0, stage 0" in worker["text"]
        others = {r for f in found if f["kind"] == "straggler" for r in f["ranks"]}
        assert others <= {0}, f"health names other ranks than the slowed worker: {others}"
    else:
        assert "whatif_moving" in kinds, kinds
        assert "straggler" not in kinds and "whatif_worker" not in kinds, kinds


def test_import_without_meta_says_what_is_missing(tmp_path, capsys):
    shutil.copy(DATA / "trace-AR.parquet", tmp_path / "trace-AR.parquet")
    capsys.readouterr()
    rc = rankscope("import", tmp_path / "trace-AR.parquet", "--data-dir", tmp_path / "data")
    err = capsys.readouterr().err
    assert rc == 1 and "meta-AR.yaml" in err, err


def test_whatif_on_a_run_without_ops_says_why(tmp_path, capsys):
    shutil.copytree(Path(__file__).resolve().parents[2] / "fixtures" / "deepspeed_run", tmp_path / "ds")
    data = tmp_path / "data"
    rankscope("import", tmp_path / "ds", "--run", "ds", "--data-dir", data)
    capsys.readouterr()
    assert rankscope("whatif", "ds", "--data-dir", data) == 3
    err = capsys.readouterr().err
    assert "no ops the what-if replay models" in err and "Traceback" not in err
