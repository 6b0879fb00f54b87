"""Compile to bytecode what the project imports, and nothing else.

Run by ``scripts/bootstrap`` with ``PYTHONDONTWRITEBYTECODE`` unset, after a venv is made:
where that variable is set (this machine sets it) nothing is cached as it is imported, so
every command, worker and test process would compile pandas, scikit-learn or Ray again as it
starts.  Compiling the whole of site-packages did it for 51 CPU-s on 2 CPUs (Ray alone is
2,565 files, most never imported); importing what the project imports, its modules and every
module named in an import statement of theirs (a function's import too: scikit-learn, Optuna
and Ray are imported where they are used), writes the same cache for about a third of that.
The test runner's own packages are compiled whole (they are small, and pytest loads its
plugins by entry point, which no import statement names).  A module missed (one a library
imports lazily) is compiled when it is imported, as before.
"""
from __future__ import annotations

import ast
import compileall
import importlib
import importlib.util
import pkgutil
import sys
from pathlib import Path

PACKAGES = ("analysis", "commands", "dispatcher", "pipeline", "workers")
TEST_RUNNER = ("_pytest", "pytest", "pluggy", "iniconfig", "execnet", "xdist", "hypothesis",
               "_hypothesis_pytestplugin", "sortedcontainers")


def imported_names(path: Path) -> set[str]:
    """The absolute module names the file's import statements name."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root))
    names: set[str] = set()
    for package in PACKAGES:
        module = importlib.import_module(package)
        names.update(info.name for info in pkgutil.walk_packages(module.__path__, package + ".")
                     if not info.name.endswith("__main__"))
        for path in (root / package).rglob("*.py"):
            names.update(imported_names(path))
    for path in (root / "tests").glob("*.py"):  # what the tests import beside the project
        names.update(n for n in imported_names(path) if n.split(".")[0] != "tests")
    for name in sorted(names):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional extra not installed: nothing to cache
            pass
    for name in TEST_RUNNER:  # installed with the extra "test" only
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is not None:
            where = Path(spec.origin)
            if where.name == "__init__.py":
                compileall.compile_dir(where.parent, quiet=2)
            else:
                compileall.compile_file(where, quiet=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
