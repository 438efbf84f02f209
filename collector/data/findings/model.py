"""What a finding is: the unit of every diagnosis rankscope makes.

A finding names its ``kind`` (what was found: ``straggler``, ``hang``, ...), its
``severity``, the ranks and step range it concerns, one sentence for a person,
the evidence numbers behind the sentence, its estimated cost where one exists,
and the dashboard page (and filter) that proves it. ``health`` commands, the
Overview and alerting all show the same findings; ``to_json`` is their
machine-readable form (``rankscope health --json``).

Severities, most urgent first: ``critical`` (the job is stuck or broken: a hang,
a collective mismatch, a silent rank), ``warning`` (it runs, at a cost), ``info``
(worth knowing), ``ok`` (a check that passed, said in one line).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from collector.data.schema import rank_ranges

SEVERITIES = ("critical", "warning", "info", "ok")


@dataclass(frozen=True, kw_only=True)
class Finding:
    kind: str
    severity: str
    text: str
    ranks: tuple[int, ...] = ()
    steps: tuple[int, int] | None = None  # first and last step it covers
    cost_ms_per_step: float | None = None  # what it costs the whole job per step, where estimable
    evidence: dict = field(default_factory=dict)  # the numbers the sentence rests on
    page: str | None = None  # the dashboard page that proves it ("stragglers", ...)
    filters: dict = field(default_factory=dict)  # that page's filter, as query parameters

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {', '.join(SEVERITIES)}")

    @property
    def rank_order(self) -> tuple[int, float]:
        """Sort key: most severe first, then the costliest."""
        return SEVERITIES.index(self.severity), -(self.cost_ms_per_step or 0.0)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "ranks": list(self.ranks),
            "steps": list(self.steps) if self.steps else None,
            "text": self.text,
            "cost_ms_per_step": self.cost_ms_per_step,
            "evidence": self.evidence,
            "page": self.page,
            "filters": self.filters,
        }


def ranked(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: f.rank_order)


def exit_code(findings: list[Finding]) -> int:
    """For scripts and schedulers: 2 if anything is critical, 1 for warnings, else 0."""
    severities = {f.severity for f in findings}
    return 2 if "critical" in severities else 1 if "warning" in severities else 0


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def duration(ms: float) -> str:
    """A lead or wait for people: '41 ms', '0.4 ms', '2 µs'."""
    if ms >= 10:
        return f"{ms:.0f} ms"
    if ms >= 0.1:
        return f"{ms:.1f} ms"
    return f"{ms * 1e3:.0f} µs"


def ranks_label(ranks) -> str:
    """[0, 1, 2, 3, 8] -> 'ranks 0-3,8'; one rank -> 'rank 8': short for big contiguous sets."""
    ranks = list(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + rank_ranges(ranks)
