"""The Overview and the Stragglers page show captured evidence under the finding it explains: a fake run whose rank 3 is
late (collector.testing.fake_runs), and two profiles (rank 3 suspect, rank 0 reference) sent as
Artifact envelopes to a real collector over that data dir. The straggler finding gets the diff's
headline and a download of both traces; the same finding of a run without captures shows none."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from collector.testing.collectors import live_collector
from collector.testing.fake_runs import FINISHED, LIVE, envelope, hello, write_data_dir
from collector.testing.streams import RawStream
from proto import pb
from tests.integration.app._pages import open_page

SUSPECT = FINISHED.late_rank if FINISHED.late_rank != -1 else FINISHED.world_size - 1


def _trace(slow_ms: float) -> bytes:
    """Three 100 ms steps; the slow rank spends ``slow_ms`` of each in slow_loader."""
    events = []
    for k in range(3):
        t = k * 100_000.0
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": 1, "ts": t, "dur": 20_000})
        if slow_ms:
            args = {"Python id": k + 1, "Python parent id": None}
            name = "train.py(30): slow_loader"
            events.append(
                {
                    "ph": "X",
                    "cat": "python_function",
                    "name": name,
                    "tid": 1,
                    "ts": t,
                    "dur": slow_ms * 1e3,
                    "args": args,
                }
            )
    return gzip.compress(json.dumps({"traceEvents": events}).encode())


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    data = write_data_dir(tmp_path_factory.mktemp("evidence-app"), FINISHED, LIVE)
    with live_collector(data, grace_s=0) as collector:
        for rank, role, slow in ((SUSPECT, "suspect", 40.0), (0, "reference", 0.0)):
            cid = f"evidence-{rank}"
            artifact = pb.Artifact(
                run_id=FINISHED.run_id, rank=rank, request_id="profile-app", kind="profile",
                first_step=10, last_step=12, data=_trace(slow), role=role, finding="rank 3 costs ...",
            )  # fmt: skip
            stream = RawStream(collector.channel())
            stream.send(hello(cid, 1, FINISHED.run_id, rank, FINISHED.world_size), envelope(cid, 2, artifact=artifact))
            stream.finish()
            assert stream.acked == {1, 2}, stream.error
    return data


def _overview(data_dir, monkeypatch, run_id) -> AppTest:
    return open_page(data_dir, monkeypatch, "views/overview.py", [run_id])


def test_the_straggler_finding_shows_the_evidence_and_both_traces_to_download(data_dir, monkeypatch):
    at = _overview(data_dir, monkeypatch, FINISHED.run_id)
    captions = [c.value for c in at.caption]
    assert any(
        c.startswith("Evidence (profiled steps 10-12): ") and f"rank {SUSPECT} spends +40.0 ms/step in slow_loader" in c
        for c in captions
    ), captions
    [button] = at.get("download_button")
    assert button.proto.label == "Download both traces (Perfetto JSON)"


def test_a_run_without_captures_shows_no_evidence(data_dir, monkeypatch):
    at = _overview(data_dir, monkeypatch, LIVE.run_id)
    assert any(f"rank {SUSPECT}" in w.value for w in at.warning)  # the same finding, nothing captured for it
    assert not [c.value for c in at.caption if c.value.startswith("Evidence")]
    assert not at.get("download_button")


def test_the_stragglers_page_shows_the_evidence_under_its_sentences(data_dir, monkeypatch):
    at = open_page(data_dir, monkeypatch, "views/stragglers.py", [FINISHED.run_id])
    assert not at.exception
    captions = [c.value for c in at.caption]
    assert any(f"rank {SUSPECT} spends +40.0 ms/step in slow_loader" in c for c in captions), captions
    [button] = at.get("download_button")
    assert button.proto.label == "Download both traces (Perfetto JSON)"
    without = open_page(data_dir, monkeypatch, "views/stragglers.py", [LIVE.run_id])
    assert not [c.value for c in without.caption if c.value.startswith("Evidence")]
    assert not without.get("download_button")


def test_profile_now_beside_a_live_finding_leaves_a_request_for_the_collector(data_dir, monkeypatch):
    from collector.data import requests

    at = _overview(data_dir, monkeypatch, LIVE.run_id)
    [button] = [b for b in at.button if b.label == f"Profile rank {SUSPECT} now"]
    assert not requests.pending(data_dir)
    at = button.click().run()
    assert not at.exception
    [path] = requests.pending(data_dir)
    try:
        request = requests.read(path)
        assert (request["run_id"], request["ranks"], request["kind"], request["steps"]) == (
            LIVE.run_id, [SUSPECT], "profile", 3,
        )  # fmt: skip
        assert request["reference"] is None  # the collector picks one among the ranks streaming to it
        captions = [c.value for c in at.caption]
        assert f"Asked: {request['request_id']}: waiting for the collector" in " ".join(captions), captions
    finally:
        path.unlink()


def test_a_finished_run_offers_no_profile_button(data_dir, monkeypatch):
    at = _overview(data_dir, monkeypatch, FINISHED.run_id)
    assert not [b for b in at.button if b.label.startswith("Profile rank")]
    stragglers = open_page(data_dir, monkeypatch, "views/stragglers.py", [FINISHED.run_id])
    assert not [b for b in stragglers.button if b.label.startswith("Profile rank")]


def test_the_stragglers_drill_down_offers_profile_now_for_its_rank_of_a_live_run(data_dir, monkeypatch):
    from collector.data import requests

    at = open_page(data_dir, monkeypatch, "views/stragglers.py", [LIVE.run_id])
    assert not at.exception
    [rank_box] = [s for s in at.selectbox if s.label == "Rank"]
    rank = rank_box.value
    [button] = [b for b in at.button if b.label == f"Profile rank {rank} now"]
    at = button.click().run()
    [path] = requests.pending(data_dir)
    try:
        assert requests.read(path)["ranks"] == [rank]
    finally:
        path.unlink()
