"""RESULTS-<area>.md holds one `# ` section per benchmark; each run replaces only its own."""

from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, text: str) -> None:
    """Put ``text`` (starting with its `# Title` line) in ``path`` in place of the section
    with the same title, or at the end if there is none."""
    text = text.strip("\n")
    title = text.splitlines()[0]
    old = path.read_text() if path.exists() else ""
    sections = ["# " + s.strip("\n") for s in ("\n" + old).split("\n# ") if s.strip()]
    if any(s.splitlines()[0] == title for s in sections):
        sections = [text if s.splitlines()[0] == title else s for s in sections]
    else:
        sections.append(text)
    path.write_text("\n\n".join(sections) + "\n")
