"""The import rules of dispatcher/__init__.py, checked on the source.

Every import counts: at the top, inside functions, and under ``TYPE_CHECKING`` (a type-only
import that runs upwards still means a name lives in the wrong layer).  The modules are read
with ``ast``, never imported, so a violation is found even on a path no test runs.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from dispatcher import LAYERS

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("dispatcher", "workers", "analysis", "pipeline", "commands")
# What analysis/ may read of dispatcher/ besides ``core``: the build's file formats (a
# benchmark's manifest, a policy file), which it reads as data
BUILD_FORMATS = ("dispatcher.build.manifest", "dispatcher.build.policy_file")
# The commands every command may import; no command imports another
COMMAND_COMMON = ("commands", "commands.common", "commands.entry", "commands.registry")
MAX_COMMAND_FUNCTION = 60  # lines, def line to last line
MAX_COMMANDS_LINES = 2800

def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _internal(name: str) -> str | None:
    """The module of ours that importing ``name`` loads (its longest known prefix)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in MODULES:
            return candidate
    return None


def _imports(name: str) -> set[str]:
    """Every module of ours that ``name`` imports, anywhere in its source."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"), filename=str(MODULES[name]))
    package = name if _is_package(name) else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:  # ``from pkg import submodule`` imports the submodule
                sub = f"{module}.{alias.name}"
                targets.add(sub if sub in MODULES else module)
    found = {_internal(t) for t in targets}
    return {m for m in found if m is not None and m != name}


@functools.cache
def _graph() -> dict[str, set[str]]:
    """Every module's internal imports, parsed once per test process, when first asked
    (not at import: each of the suite's test processes collects this module)."""
    return {name: _imports(name) for name in MODULES}


def _layer(name: str) -> int:
    """The index of a dispatcher module's layer; the top modules are above every layer.
    ``dispatcher`` itself (the rule and LAYERS) is below all."""
    parts = name.split(".")
    if len(parts) == 1:
        return -1
    if parts[1] in LAYERS and (len(parts) > 2 or _is_package(name)):
        return LAYERS.index(parts[1])
    return len(LAYERS)


def _violations() -> list[tuple[str, str, str]]:
    found = []
    for importer, imported in sorted(_graph().items()):
        for target in sorted(imported):
            top, target_top = importer.split(".")[0], target.split(".")[0]
            why = None
            if top in ("dispatcher", "workers") and target_top in ("analysis", "pipeline",
                                                                   "commands"):
                why = f"{top}/ may not import {target_top}/"
            elif top == "analysis" and target_top in ("pipeline", "commands"):
                why = f"analysis/ may not import {target_top}/"
            elif top == "analysis" and target_top == "dispatcher" \
                    and target != "dispatcher.core" \
                    and not target.startswith("dispatcher.core.") \
                    and target not in BUILD_FORMATS:
                why = "analysis/ imports only dispatcher.core and the build's formats"
            elif top == "pipeline" and target_top == "commands":
                why = "pipeline/ may not import commands/"
            elif top == target_top == "commands" and target not in COMMAND_COMMON:
                why = "a command imports another (only commands.common, entry and registry)"
            elif top == "workers" and target_top == "dispatcher":
                why = "workers/ runs alone on worker machines: no dispatcher/"
            elif top == target_top == "dispatcher" and _layer(target) > _layer(importer):
                why = "imports a layer above its own"
            if why:
                found.append((importer, target, why))
    return found


def test_the_layers_are_the_subpackages_of_dispatcher():
    packages = {p.parent.name for p in (ROOT / "dispatcher").glob("*/__init__.py")}
    assert packages == set(LAYERS)


def test_no_import_runs_upwards():
    bad = [f"{a} imports {b}: {why}" for a, b, why in _violations()]
    assert not bad, "\n".join(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_no_modules_import_one_another_in_a_circle():
    assert _cycles(_graph()) == []


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"a"}, "c": set()}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
])
def test_circles_are_found(graph, expected):
    assert _cycles(graph) == expected


def test_imports_are_found_wherever_they_are():
    """Inside functions, under TYPE_CHECKING and relative: the cases the rules rely on."""
    assert "dispatcher.running.backend" in _graph()["dispatcher.running.local"]
    assert "workers.agent.spawn" in _graph()["workers.agent.runner"]
    assert "dispatcher.build.remote" in _graph()["dispatcher.running.backend"]  # TYPE_CHECKING


def test_analysis_reads_only_core_and_the_build_formats():
    """The rule by name, so that a change to it is seen here: what analysis/ imports of
    dispatcher/ today."""
    used = {t for name, targets in _graph().items() if name.startswith("analysis")
            for t in targets if t.startswith("dispatcher")}
    assert used <= {t for t in MODULES if t.startswith("dispatcher.core")} | set(BUILD_FORMATS)
    assert "dispatcher.core.comparison" in _graph()["analysis.result_files"]
    assert "dispatcher.core.sites" in _graph()["analysis.labels"]


def _functions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno is not None]


def test_commands_are_thin():
    """A command parses its arguments, calls one entry point and words the result: no
    function in commands/ over MAX_COMMAND_FUNCTION lines, counted from its def line (its
    decorators aside) to its last."""
    long = [f"{MODULES[m].relative_to(ROOT)}: {name} has {lines} lines"
            for m in sorted(MODULES) if m.split(".")[0] == "commands"
            for name, lines in _functions(MODULES[m]) if lines > MAX_COMMAND_FUNCTION]
    assert not long, "\n".join(long)


def test_commands_are_small():
    total = sum(len(MODULES[m].read_text(encoding="utf-8").splitlines())
                for m in MODULES if m.split(".")[0] == "commands")
    assert total < MAX_COMMANDS_LINES, f"commands/ has {total} lines"
