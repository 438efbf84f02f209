"""Rebuild BENCHMARKS.md from benches/SUMMARY.md and every benches/RESULTS-*.md.

Each benchmark script writes its own RESULTS file (command, machine, figures,
baseline from the same run); this stitches them into the one page the README
links to. `make bench` runs it last; `python -m benches.assemble` alone works too.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "BENCHMARKS.md"
ORDER = ["hook", "ingest", "engine", "engine-ds", "checkpoint", "flops", "dashboard", "native", "moe", "security"]


def results_files() -> list[Path]:
    found = {p.stem.removeprefix("RESULTS-"): p for p in HERE.glob("RESULTS-*.md")}
    ordered = [found.pop(name) for name in ORDER if name in found]
    return ordered + [found[name] for name in sorted(found)]


def _demote(markdown: str) -> str:
    """Headings one level down, so each file sits under the page's own title."""
    return "\n".join("#" + line if line.startswith("#") else line for line in markdown.splitlines())


def main() -> None:
    parts = [(HERE / "SUMMARY.md").read_text().rstrip()]
    for path in results_files():
        parts.append(f"<!-- from {path.relative_to(HERE.parent)} -->\n" + _demote(path.read_text().strip()))
    OUT.write_text("\n\n".join(parts) + "\n")
    print(f"wrote {OUT} from {len(parts) - 1} result files")


if __name__ == "__main__":
    main()
