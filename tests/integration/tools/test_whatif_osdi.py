"""``rankscope import`` of the OSDI'25 traces into a real data dir (Parquet segments, DuckDB
catalog), then ``rankscope whatif --json`` and ``rankscope health --json`` on the stored run:
the figures survive the round trip through rankscope's tables within the issue's tolerances
(3% slowdown / by_stage / by_dp_rank, 10% M_W / M_S of the authors' files), health says AR's
slowed worker alone and SE's slowdown as moving across workers, and the Stragglers page shows the
verdict above the worker x step heatmap."""

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


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """AR and SE imported with ``rankscope import`` (the meta yaml beside each trace) into one data dir."""
    tmp = tmp_path_factory.mktemp("osdi")
    data = tmp / "data"
    for name in ("AR", "SE"):
        src = tmp / name
        src.mkdir()
        for f in (f"trace-{name}.parquet", f"meta-{name}.yaml"):
            shutil.copy(DATA / f, src / f)
        assert rankscope("import", src / f"trace-{name}.parquet", "--run", name, "--data-dir", data) == 0
    return data


@pytest.mark.parametrize("name", ["AR", "SE"])
def test_whatif_json_matches_the_authors(imported, capsys, name):
    rc, ours = _json_of(capsys, "whatif", name, "--data-dir", imported, "--json")
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


@pytest.mark.parametrize("name", ["AR", "SE"])
def test_health_names_the_cause(imported, capsys, name):
    capsys.readouterr()
    assert rankscope("health", name, "--data-dir", imported, "--json") == 1  # warnings
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


def test_stragglers_page_shows_the_heatmap(imported, monkeypatch):
    from collector.data import catalog
    from tests.integration.app._pages import open_page

    con = catalog.connect(imported)
    try:
        (run_id,) = con.execute("SELECT run_id FROM runs WHERE name = 'AR'").fetchone()
    finally:
        con.close()
    at = open_page(imported, monkeypatch, "views/stragglers.py", [run_id], timeout=120)
    assert any("What-if" in h.value for h in at.subheader), [h.value for h in at.subheader]
    text = " ".join(m.value for m in at.markdown)
    assert "S = **1.97x**" in text and "one worker explains" in text, text


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
