"""MkDocs hook: the CLI reference and the config-key reference, generated at build time from the
code they describe, so they cannot drift from it.

* ``reference/cli.md``: every ``rankscope`` command from the argparse parsers of
  collector/tools/cli.py (``build_parser``): its help, its ``--help`` text and examples.
* ``reference/config.md``: every key of the training config from trainer.config.EngineConfig and
  the blocks nested in it (collector.data.config's ``ConfigBlock``): dotted key, type, default and
  what is allowed (``setting(ge=, choices=...)``).

Neither page exists in docs/: MkDocs is handed them as generated files (``on_files``). Lives outside
the packages because it imports both collector.tools and trainer, which must not import each other.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import typing

from mkdocs.structure.files import File

CLI_PAGE = "reference/cli.md"
CONFIG_PAGE = "reference/config.md"


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def on_files(files, config):
    for uri, render in ((CLI_PAGE, cli_reference), (CONFIG_PAGE, config_reference), ("benchmarks.md", benchmarks)):
        existing = files.get_file_from_path(uri)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, uri, content=render()))
    return files


def benchmarks() -> str:
    """BENCHMARKS.md of the repository root, as it is: measured figures live there, once."""
    with open(os.path.join(ROOT, "BENCHMARKS.md"), encoding="utf-8") as f:
        return f.read()


def cli_reference() -> str:
    os.environ.setdefault("COLUMNS", "100")  # argparse wraps help to the terminal: fix it for the page
    from collector.tools.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    out = [
        "# CLI reference",
        "",
        "Generated from the command's own parsers (`rankscope COMMAND --help` prints the same). "
        "Every command that reads or writes data takes `--data-dir D` (default `./rankscope-data`); "
        "those that talk to a collector find it from there (see [the CLI guide](../cli.md)).",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    out += [f"| [`{name}`](#{name}) | {helps.get(name, '')} |" for name in sub.choices]
    out += ["", "## rankscope", "", "```text", parser.format_help().rstrip(), "```", ""]
    for name, p in sub.choices.items():
        out += [f"## {name}", "", helps.get(name) or "", "", "```text", p.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def config_reference() -> str:
    from trainer.config import EngineConfig

    out = [
        "# Config keys",
        "",
        "Generated from the engine's config blocks (`trainer.config.EngineConfig` and the blocks in it): "
        "every key the engine reads, its type, its default and what it allows. DeepSpeed's `ds_config.json` "
        "schema; how unknown keys, aliases and DeepSpeed-only features are treated is in "
        "[the engine guide](../engine.md#config-keys-supported).",
        "",
        "| key | type | default | allowed |",
        "|---|---|---|---|",
    ]
    out += list(_rows(EngineConfig, ""))
    return "\n".join(out) + "\n"


def _rows(block, prefix: str):
    hints = typing.get_type_hints(block)
    for f in dataclasses.fields(block):
        if f.metadata.get("derived") or f.name.startswith("_"):
            continue
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        nested = _block_of(tp)
        if nested is not None:
            yield f"| `{key}` | block | {'none' if _default(f) is None else '(its keys below)'} | |"
            yield from _rows(nested, key + ".")
            continue
        yield f"| `{key}` | {_type(tp)} | {_show(_default(f))} | {_allowed(f.metadata)} |"


def _block_of(tp):
    for arg in (tp, *typing.get_args(tp)):
        if isinstance(arg, type) and dataclasses.is_dataclass(arg):
            return arg
    return None


def _type(tp) -> str:
    from collector.data.config import _describe

    return _describe(tp).replace("|", "\\|")


def _default(f):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _show(value) -> str:
    if value is dataclasses.MISSING:
        return "**required**"
    return f"`{value!r}`".replace("|", "\\|")


def _allowed(meta) -> str:
    parts = [f"{op} {meta[op]}" for op in ("ge", "gt", "le", "lt") if op in meta]
    parts = [p.replace("ge", "≥").replace("gt", ">").replace("le", "≤").replace("lt", "<") for p in parts]
    if "choices" in meta:
        parts.append("one of " + ", ".join(f"`{c!r}`" for c in meta["choices"]))
    return "; ".join(parts).replace("|", "\\|")


# -- pages others add -------------------------------------------------------------------------
# Topic pages written beside the guides (by whoever builds the feature) join the nav here, in this
# order, when present; any other page of docs/ the nav does not list joins after them, so a page
# added later never fails `mkdocs build --strict` as "not included in the nav".
TOPICS = (
    ("Live health", "live-health.md"),
    ("What-if: the cost of stragglers", "whatif.md"),
    ("Slow links", "slow-links.md"),
    ("Pipeline parallelism", "pipeline.md"),
    ("Flight Recorder", "flight-recorder.md"),
    ("Reliability", "reliability.md"),
)
GENERATED = {CLI_PAGE, CONFIG_PAGE, "benchmarks.md"}


def on_config(config):
    docs = os.path.abspath(config["docs_dir"])
    listed = set(_listed(config["nav"]))
    present = [
        os.path.relpath(os.path.join(root, name), docs).replace(os.sep, "/")
        for root, dirs, names in os.walk(docs)
        for name in names
        if name.endswith(".md") and "hooks" not in os.path.relpath(root, docs).split(os.sep)
    ]
    topics = [{title: page} for title, page in TOPICS if page in present and page not in listed]
    known = {page for _, page in TOPICS}
    others = sorted(p for p in present if p not in listed and p not in known and p not in GENERATED)
    topics += [{_title(docs, page): page} for page in others]
    if topics:
        config["nav"].insert(2, {"Topics": topics})
    return config


def _listed(nav):
    for item in nav or []:
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            for value in item.values():
                yield from _listed(value) if isinstance(value, list) else [value]


def _title(docs: str, page: str) -> str:
    with open(os.path.join(docs, page), encoding="utf-8") as f:
        for line in f:
            if line.startswith("# "):
                return line[2:].strip()
    return page.removesuffix(".md")


# -- links out of docs/ ---------------------------------------------------------------------------
# A page may point at a file of the repository outside docs/ (`../benches/RESULTS-x.md`, `../README.md`):
# not part of the site, so it is shown as the file's path; a target that does not exist stays a link,
# which `mkdocs build --strict` then reports.
_OUTSIDE = re.compile(r"\[([^\]]+)\]\((\.\./[^)#\s]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown, page, config, files):
    here = os.path.dirname(os.path.join(os.path.abspath(config["docs_dir"]), page.file.src_path))

    def outside(match):
        target = os.path.normpath(os.path.join(here, match.group(2)))
        if not os.path.exists(target) or not target.startswith(ROOT + os.sep):
            return match.group(0)
        path = os.path.relpath(target, ROOT)
        text = match.group(1)
        if text.strip("`") in (path, os.path.basename(path)):
            return f"`{path}`"
        return f"{text} (`{path}`)"

    return _OUTSIDE.sub(outside, markdown)
