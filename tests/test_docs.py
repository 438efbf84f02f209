"""The docs as a site (mkdocs.yml; `make docs` builds it with --strict inside `make test`): the README
stays a short front page, and the generated references cover every command and config block."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 250


def _reference():
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "docs" / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move detail into docs/"
    for link in re.findall(r"\]\(((?:docs/)?[\w./-]+\.(?:md|png))(?:#[\w-]+)?\)", "\n".join(lines)):
        assert (ROOT / link).exists(), f"README.md links {link}, which does not exist"


def test_the_cli_reference_has_every_command_and_its_flags():
    from collector.tools.cli import COMMANDS

    page = _reference().cli_reference()
    for command in COMMANDS:
        assert f"\n## {command.NAME}\n" in page, f"the CLI reference lacks `rankscope {command.NAME}`"
    assert "--data-dir" in page and "--endpoint" in page


def test_the_config_reference_has_every_block():
    page = _reference().config_reference()
    for key in ("`zero_optimization.stage`", "`telemetry.endpoint`", "`fp16.initial_scale_power`", "`scheduler.type`"):
        assert key in page, f"the config-key reference lacks {key}"
    assert "one of `0`, `1`, `2`, `3`" in page  # a setting's range is shown
