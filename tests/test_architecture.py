"""The house rules of docs/ARCHITECTURE.md, checked on the source: no import circle
among the project's modules, dependencies only in the allowed directions, and a
training rank that loads none of the dashboard's or the collector's heavy parts."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "collector", "trainer", "native", "proto")
GENERATED = {"proto.rankscope_pb2", "proto.rankscope_pb2_grpc"}

# role -> the roles it may import (its own included). A module's role is the longest prefix listed.
TESTING_KIT = {"collector.testing", "collector.tools", "collector.server", "collector.data", "collector.rank", "proto"}
ALLOWED = {
    "proto": {"proto"},
    "collector.data": {"collector.data", "proto"},
    "collector.rank": {"collector.rank", "collector.data", "proto"},
    "collector.server": {"collector.server", "collector.data", "proto"},
    "collector.tools": {"collector.tools", "collector.server", "collector.data", "collector.rank", "proto"},
    "collector.testing": TESTING_KIT,
    # training scripts run under the hook as users write them: one may train on the bundled engine
    "collector.testing.workloads": TESTING_KIT | {"collector.testing.workloads", "trainer"},
    "collector.integrations": {"collector.integrations", "collector.rank", "collector.data", "proto"},
    "collector.hook": {"collector.rank"},
    "collector.catalog": {"collector.data"},
    "collector": set(),  # the package docstring
    "app": {"app", "collector.data"},
    "trainer": {"trainer", "collector.rank", "native"},  # its config base through collector.rank.config
    "native": {"native"},
}
# Third-party packages a role must never import (the heavy ones, or the wrong side's).
FORBIDDEN_THIRD_PARTY = {
    "collector.data": {"torch", "streamlit", "plotly"},
    "collector.server": {"torch", "streamlit", "plotly"},
    "collector.rank": {"streamlit", "plotly", "duckdb", "transformers", "lightning", "pytorch_lightning"},
    "collector.integrations": {"streamlit", "plotly", "duckdb"},
    "collector.tools": {"streamlit", "plotly"},
    "app": {"torch"},
}


def role_of(module: str) -> str:
    best = ""
    for role in ALLOWED:
        if (module == role or module.startswith(role + ".")) and len(role) > len(best):
            best = role
    return best


def modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join(parts)
            if name not in GENERATED:
                found[name] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, module: str, known: set[str], *, type_checking: bool = False) -> tuple[set[str], set[str]]:
    """(project modules, third-party top-level packages) that ``path`` imports anywhere; those under
    ``if TYPE_CHECKING:`` only with ``type_checking`` (a cycle of concepts is one in type hints too,
    but a type-only import loads nothing, so it never breaks a dependency direction)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    ours, theirs = set(), set()

    def resolve(name: str) -> None:
        top = name.split(".")[0]
        if top not in PACKAGES:
            theirs.add(top)
            return
        while name and name not in known:  # `from collector.rank import ops` -> collector.rank.ops
            name = name.rpartition(".")[0]
        if name:
            ours.add(name)

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child) and not type_checking:
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    resolve(alias.name)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parent = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    resolve(full if full in known else base)
            visit(child)

    visit(tree)
    ours.discard(module)
    return ours, theirs


def graph(*, type_checking: bool = False) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    mods = modules()
    known = set(mods) | GENERATED
    edges, third = {}, {}
    for name, path in mods.items():
        edges[name], third[name] = imports_of(path, name, known, type_checking=type_checking)
    return edges, third


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in edges:
        if v not in index:
            strong(v)
    return out


def test_no_import_cycles():
    """Across folders and inside one (collector/tools/simulate's hang -> simulation -> hang was
    one, hidden under TYPE_CHECKING), type-only imports included."""
    edges, _ = graph(type_checking=True)
    # A package importing its own submodules is not a circle of concepts: drop parent -> child edges.
    edges = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in edges.items()}
    assert cycles(edges) == []


def test_dependencies_point_one_way():
    edges, third = graph()
    wrong = []
    for module, deps in sorted(edges.items()):
        role = role_of(module)
        assert role, f"{module} has no role in ALLOWED: add its folder to docs/ARCHITECTURE.md and this test"
        for dep in sorted(deps):
            if role_of(dep) not in ALLOWED[role]:
                wrong.append(f"{module} ({role}) imports {dep} ({role_of(dep)})")
        for pkg in sorted(third[module] & FORBIDDEN_THIRD_PARTY.get(role, set())):
            wrong.append(f"{module} ({role}) imports {pkg}")
    assert wrong == []


def test_the_checker_sees_a_wrong_way_import_and_a_circle():
    # The rules above must be able to fail: a data module importing the server is caught,
    # and so is a two-module circle.
    assert role_of("collector.server.service") not in ALLOWED[role_of("collector.data.schema")]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    edges, _ = graph()
    assert "collector.rank.recorder" in edges["collector.rank.ops"]


def test_a_training_rank_loads_no_dashboard_or_database():
    code = (
        "import sys, collector.hook, collector.rank.comm; "
        "print(sorted(m for m in ('streamlit', 'plotly', 'duckdb', 'pandas', 'collector.server', 'app') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def imports_from_tests(source: str) -> set[str]:
    """The modules under tests. that ``source`` imports (absolute imports; the tests use no others)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("tests.")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
            found.add(node.module)
    return found


def test_the_unit_tier_imports_nothing_from_the_integration_tier():
    # tests/unit is pure functions (tests/unit/conftest.py enforces it at run time); the integration
    # tier's helpers start processes and collectors, so a unit test never needs them. The other way is fine.
    assert imports_from_tests("from tests.integration.rank import _rank_util\nimport tests.unit.x") == {
        "tests.integration.rank",
        "tests.unit.x",
    }
    wrong = {}
    for path in sorted((ROOT / "tests" / "unit").rglob("*.py")):
        modules = sorted(m for m in imports_from_tests(path.read_text()) if m.startswith("tests.integration"))
        if modules:
            wrong[str(path.relative_to(ROOT))] = modules
    assert wrong == {}


def test_the_time_guard_fails_a_slow_test_and_lists_the_slowest(tmp_path):
    """tests/_durations.py: a test over the limit fails the session (exit 1) and is named with its time;
    the same test marked slow, or under the limit, passes."""
    (tmp_path / "test_sleepy.py").write_text(
        "import time, pytest\n"
        "@pytest.fixture(scope='module')\n"
        "def shared():\n    time.sleep(0.3)\n"
        "def test_sleepy(shared):\n    time.sleep(0.6)\n"
        "@pytest.mark.slow\ndef test_sleepy_but_slow():\n    time.sleep(0.6)\n"
    )

    def run(limit: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "tests._durations", "-p", "no:cacheprovider", str(tmp_path)],
            cwd=ROOT,
            env={**os.environ, "RANKSCOPE_TEST_TIME_LIMIT_S": limit},
            capture_output=True,
            text=True,
            timeout=120,
        )

    over = run("0.5")
    assert over.returncode == 1, over.stdout + over.stderr
    assert "over the time limit" in over.stdout and "test_sleepy.py::test_sleepy:" in over.stdout, over.stdout
    assert "test_sleepy_but_slow:" not in over.stdout.split("over the time limit")[1], over.stdout
    assert "shared [module fixture of" in over.stdout, over.stdout  # listed on its own, not in the test's time
    within = run("30")
    assert within.returncode == 0 and "slowest" in within.stdout, within.stdout + within.stderr
