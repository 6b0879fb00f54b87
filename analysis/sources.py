"""``<rewards>/<benchmark>/sources.json``: which benchmark and rundirs a benchmark's rewards
were fitted to.  ``assign-rewards`` writes it; ``run-all-benchmarks`` and ``train-policy`` read
it to find the benchmark to compile.  Light on imports: the commands that only read it start
without scipy."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from dispatcher.build.manifest import Benchmark, load_benchmark, resolve_benchmark
from dispatcher.core.files import write_json_atomic

SOURCES = "sources.json"


class SourcesError(RuntimeError):
    """A sources.json that cannot be used; the message is one line."""


def write_sources(bench_dir: Path, benchmark: str, directory: str | None,
                  rundirs: Sequence[str]) -> None:
    write_json_atomic(bench_dir / SOURCES, {"benchmark": benchmark, "directory": directory,
                                            "rundirs": list(rundirs)})


def benchmark_of(rewards: Path, name: str) -> tuple[Benchmark, tuple[str, ...]]:
    """The benchmark whose rewards are ``<rewards>/<name>`` (the directory its rundirs
    recorded; the bundled benchmark of that name when none was recorded) and those rundirs.
    SourcesError or ManifestError, in one line, otherwise."""
    sources = rewards / name / SOURCES
    try:
        data = json.loads(sources.read_text())
    except FileNotFoundError:
        data = {}
    except (OSError, ValueError) as exc:
        raise SourcesError(f"{sources}: unreadable ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("rundirs", []), list) \
            or not isinstance(data.get("directory"), (str, type(None))):
        raise SourcesError(f"{sources}: expected an object with a directory and a list of "
                           "rundirs")
    rundirs = tuple(str(r) for r in data.get("rundirs", []))
    directory = data.get("directory")
    if directory is None:  # written before sources.json recorded it: the bundled one
        return resolve_benchmark(name), rundirs
    if not Path(directory).is_dir():
        raise SourcesError(f"{name}: the benchmark directory {directory} (from {sources}) no "
                           "longer exists")
    return load_benchmark(directory), rundirs
