"""Flight Recorder dumps of real gloo jobs (collector/testing/flight_recorder_corpus.py: hangs in the
world, in new_group, new_subgroups and a DP group, mismatched sizes and ops, a crashed rank, a wrapped
ring, a missing dump, host names and custom prefixes in the file names, a healthy job), each judged by
torch's analyzer (``torch.distributed.flight_recorder.fr_trace``) and by ``rankscope fr``: every
problem the analyzer names, rankscope names too -- the group, the seq, the op, the missing ranks with
their last stack, the mismatched ranks, the ranks without a dump -- and the fault the job injected. The
hangs again at 1,024 ranks, the cases' dumps expanded (collector/testing/flight_recorder_scale.py).

The corpus is generated once per test session (two gloo launches and one more for the size
mismatch, run at once: ~30 s of CPU in all, 10 processes; 150 s of wall clock at load 25-30 on 2 cores)."""

from __future__ import annotations

import json

import pytest

from collector.data.schema import rank_ranges
from collector.testing.flight_recorder_corpus import CASES, analyzer_verdicts, generate
from collector.testing.flight_recorder_scale import analyzer_verdicts as analyzer_on
from collector.testing.flight_recorder_scale import expand
from collector.tools.flight_recorder_verdict import judge
from collector.tools.importers.flight_recorder import OPS
from tests._import_util import rankscope


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    return generate(tmp_path_factory.mktemp("fr-corpus"))


def _group(facts: dict, ranks: list[int]) -> str:
    return "world" if facts.get("group") == "world" else f"g[{rank_ranges(ranks)}]"


def _by_kind(verdict, kind: str) -> list:
    return [f for f in verdict.findings if f.kind == kind]


@pytest.mark.parametrize("case", CASES)
def test_rankscope_names_every_problem_torchs_analyzer_names(corpus, case, tmp_path):
    facts = json.loads((corpus / case / "case.json").read_text())
    reference = analyzer_verdicts(corpus / case)
    verdict = judge(corpus / case / "dumps", tmp_path / "data", run=case)
    assert verdict is not None and not verdict.problems, verdict.problems
    said = "\n".join(f.text for f in verdict.findings)
    for ref in reference:
        if ref["kind"] == "hang":
            group = _group(facts, ref["expected"])
            hangs = [
                f
                for f in _by_kind(verdict, "hang")
                if (f.evidence["group_name"], f.evidence["seq"]) == (group, ref["seq"])
            ]
            assert hangs, f"fr_trace: {ref}; rankscope: {said}"
            assert hangs[0].evidence["missing_ranks"] == ref["missing"], (ref, said)
            assert hangs[0].evidence["op"] == OPS.get(ref["op"], ref["op"]), (ref, said)
            for r in ref["missing"]:  # where the missing rank was last seen: its stack from the dump
                assert r in verdict.stacks and "File " in verdict.stacks[r][0]["stack"], (r, verdict.stacks.keys())
        elif ref["kind"] == "mismatch":
            group = _group(facts, ref["expected"])
            desyncs = [
                f
                for f in _by_kind(verdict, "desync")
                if (f.evidence["group_name"], f.evidence["seq"]) == (group, ref["seq"])
            ]
            assert desyncs, f"fr_trace: {ref}; rankscope: {said}"
            named = {r for side in desyncs[0].evidence["sides"] for r in side["ranks"]}
            assert set(ref["culprits"]) <= named, (ref, said)
        else:
            without = {r for f in _by_kind(verdict, "missing_dump") for r in f.ranks}
            assert set(ref["ranks"]) <= without, (ref, said)
    # and the fault the job injected, which the analyzer may not see
    if facts["fault"] == "none":
        assert reference == [] and verdict.exit_code == 0, said
    elif facts["fault"] == "hang" and "fr_trace_args" not in facts:
        (hang,) = _by_kind(verdict, "hang")
        assert hang.evidence["missing_ranks"] == facts["missing"] and hang.evidence["seq"] == facts["seq"], said
        assert hang.evidence["group_name"] == _group(facts, facts["members"]) and verdict.exit_code == 2
    elif facts["fault"].endswith("mismatch"):
        (desync,) = _by_kind(verdict, "desync")
        odd = [r for side in desync.evidence["sides"][1:] for r in side["ranks"]]
        assert odd == facts["mismatched"] and verdict.exit_code == 2, said
    else:  # a rank that left no dump (crashed, or its file lost)
        assert {r for f in _by_kind(verdict, "missing_dump") for r in f.ranks} == set(facts["missing"]), said
        assert verdict.exit_code >= 1


def test_import_then_health_exits_2_on_the_world_hang_and_names_the_subgroup(corpus, tmp_path, capsys):
    """The issue's two first findings as a user meets them: `rankscope import` of gloo dumps whose
    pg_config lists only the default group, then `rankscope health`, whatever the dumps' age."""
    for case, group in (("world_hang", "world"), ("subgroup_hang", "g[0-2]")):
        data = tmp_path / case
        assert rankscope("import", corpus / case / "dumps", "--data-dir", data, "--run", case) == 0
        capsys.readouterr()
        assert rankscope("health", case, "--data-dir", data, "--no-live") == 2
        out = capsys.readouterr().out
        assert f"all_reduce #{5 if case == 'world_hang' else 3} of {group}" in out and "waiting for rank 2" in out


def test_rankscope_fr_prints_the_verdict_with_the_missing_ranks_stack(corpus, tmp_path, capsys):
    code = rankscope("fr", corpus / "dp_group_hang" / "dumps", "--data-dir", tmp_path / "d")
    out = capsys.readouterr().out
    assert code == 2
    assert "all_reduce #3 of g[1,3], waiting for rank 3" in out
    assert "rank 3 (hang):" in out and "last seen: all_reduce #3 of g[2-3]" in out and "_main_launch" in out
    assert "taken as the ranks whose dumps hold its entries: 1,3" in out  # inferred membership, said so


@pytest.mark.parametrize("case", ["world_hang", "dp_group_hang"])
def test_1024_ranks_expanded_from_the_corpus_get_the_verdict_torchs_analyzer_gives(corpus, case, tmp_path):
    """Issue 44 at scale: a corpus case's real dumps expanded to 1,024 ranks
    (collector/testing/flight_recorder_scale.py: 256 copies of the 4-rank job side by side, the world spanning
    them, subgroups one per copy, the fault kept in one copy), judged by torch's analyzer and by rankscope on
    the same files: the same hung group, seq, op and missing rank. 9-11 s each at load 12 on 2 cores; speed is
    measured in benches/flight_recorder_fr.py, not here."""
    facts = expand(corpus / case / "fr_trace", tmp_path / "dumps", 1024)
    assert len(list((tmp_path / "dumps").iterdir())) == 1024 and facts["blocks"] == 256
    reference = analyzer_on(tmp_path / "dumps")
    verdict = judge(tmp_path / "dumps", tmp_path / "data", run=case)
    assert verdict is not None and not verdict.problems, verdict.problems
    said = "\n".join(f.text for f in verdict.findings)
    (ref,) = reference
    assert ref["kind"] == "hang" and ref["missing"] == facts["missing"] and len(facts["missing"]) == 1, ref
    (hang,) = _by_kind(verdict, "hang")
    group = "world" if len(ref["expected"]) == 1024 else f"g[{rank_ranges(ref['expected'])}]"
    assert hang.evidence["group_name"] == group and hang.evidence["seq"] == ref["seq"] == facts["seq"], said
    assert hang.evidence["missing_ranks"] == ref["missing"] and hang.evidence["op"] == OPS.get(ref["op"], ref["op"])
    assert ref["missing"][0] in verdict.stacks and verdict.exit_code == 2, said
