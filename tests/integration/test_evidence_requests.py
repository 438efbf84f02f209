"""The dashboard's "profile now", below the page: a request file left in the data dir
(collector.data.requests) is carried out by a real collector (collector.server.request_files)
on 4 real gloo ranks with the hook attached, rank 1 late in ``slow_loader``: the asked rank and a
reference the collector picks capture their next steps, and the diff names the function. A
request for a rank not streaming is refused with a row saying so; a malformed file is removed
and asks no one. Nothing is asked while no file is there (the same run, before the request).

Waits poll a definite condition with a generous deadline (the machine is shared)."""

from __future__ import annotations

import json

import pytest

from collector.data import requests, trace_diff
from collector.server.request_files import RequestFiles
from collector.testing.collectors import live_collector
from collector.testing.gloo import wait_for
from tests.integration._evidence_workers import WORLD
from tests.integration.test_evidence import _artifacts, _rows_where, _spawn, _step_of, _stop_and_join, _streaming


def test_a_request_file_profiles_the_rank_and_a_reference_and_the_diff_names_the_function(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with live_collector(tmp_path / "data") as collector:
        poller = RequestFiles(collector.state, interval_s=0.2)
        ctx = _spawn(collector.endpoint, out)
        try:
            run_id = wait_for(lambda: _streaming(collector), 300)
            assert run_id, "the 4 ranks never streamed"
            assert wait_for(lambda: _step_of(collector, run_id, 1) >= 10, 300)
            passes = poller.handled, len(collector.state.commands.sent)
            assert passes == ([], 0)  # no file: nobody asked

            bad = requests.folder(collector.data_dir) / ".profile-x.tmp"
            bad.parent.mkdir(parents=True, exist_ok=True)
            bad.write_text(json.dumps({"request_id": "profile-x", "run_id": run_id, "kind": "profile", "ranks": []}))
            bad.rename(bad.with_name("profile-x.json"))  # whole, as requests.write leaves one
            asked = requests.write(collector.data_dir, run_id, [1], kind="profile", steps=3, who="tester@host")
            missing = requests.write(collector.data_dir, run_id, [WORLD + 5], kind="stacks", who="tester@host")
            assert wait_for(lambda: len(poller.handled) >= 3, 60), poller.handled
            assert not requests.pending(collector.data_dir)  # every file handled and removed
            outcomes = dict(poller.handled)
            assert outcomes["profile-x"].startswith("refused: profile-x.json: ranks must be"), outcomes

            def captured():
                rows = _rows_where(collector.data_dir, run_id, request_id=asked, status="captured")
                return rows if rows is not None and len(rows) == 2 else None

            rows = wait_for(captured, 300)
            assert rows is not None, _artifacts(collector.data_dir, run_id)
            roles = dict(zip(rows["rank"], rows.role, strict=True))
            assert roles[1] == "suspect" and sorted(roles.values()) == ["reference", "suspect"], roles
            assert all(r == "asked from the dashboard by tester@host" for r in rows.reason)
            [found] = [e for e in trace_diff.evidence(collector.data_dir, rows) if e.get("request_id") == asked]
            assert found["suspect"] == 1 and "slow_loader" in found["headline"].split(";")[0], found

            def refused():
                rows = _rows_where(collector.data_dir, run_id, request_id=missing)
                return rows if rows is not None and len(rows) else None

            rows = wait_for(refused, 60)
            assert rows is not None, _artifacts(collector.data_dir, run_id)
            [row] = rows.itertuples()
            assert (row.rank, row.status) == (WORLD + 5, "refused")
            assert f"rank {WORLD + 5}: no stream of run" in row.detail, row.detail
            # the malformed file asked no one: only the profile's two ranks were sent anything
            assert sorted(r for _, _, r, *_ in collector.state.commands.sent) == sorted(roles)
        finally:
            poller.close()
            _stop_and_join(ctx, out)


@pytest.mark.parametrize(
    "changes, names",
    [
        ({"kind": "format-disk"}, "kind 'format-disk' is not one of profile, stacks, memory"),
        ({"steps": 21}, "steps 21 is outside 1..20"),
        ({"ranks": list(range(65))}, "65 ranks named; at most 64"),
        ({"run_id": "../etc"}, "run_id"),
        ({"reference": 1}, "reference 1 must be a non-negative rank not among the ranks"),
    ],
)
def test_a_request_out_of_bounds_is_refused_naming_what(tmp_path, changes, names):
    good = {"request_id": "profile-1", "run_id": "run-a", "kind": "profile", "ranks": [1], "steps": 3}
    with pytest.raises(requests.RequestError, match=names.replace("(", r"\(").replace(".", r"\.")):
        requests.check({**good, **changes})
    requests.check(good)  # the same request in bounds passes
