"""Locating the patched Flambda compiler and naming its identity.

The compiler lives in a cache prefix built by ``compiler/build``; the identity (a hash of
the ocamlopt binary) goes into every compile-cache key so a rebuilt compiler never reuses
artifacts made by another one.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dispatcher.core.files import sha256_file
from dispatcher.core.lazy import cached

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "compiler" / "build"
PREFIX_ENV = "INLINING_COMPILER_PREFIX"


class CompilerNotFound(RuntimeError):
    """The patched compiler is neither built nor buildable here."""


@dataclass(frozen=True)
class Compiler:
    prefix: Path

    @property
    def bin_dir(self) -> Path:
        return self.prefix / "bin"

    @property
    def ocamlopt(self) -> Path:
        return self.bin_dir / "ocamlopt.opt"

    @cached
    def identity(self) -> str:
        """sha256 of the ocamlopt binary: changes whenever the compiler does."""
        return sha256_file(self.ocamlopt)


def locate_compiler(build: bool = True) -> Compiler:
    """The compiler named by $INLINING_COMPILER_PREFIX, else the one ``compiler/build`` makes.

    ``compiler/build`` returns at once when the cached build is current, so calling it is
    cheap; with ``build=False`` it only reports the prefix (``--print-prefix``).
    """
    env_prefix = os.environ.get(PREFIX_ENV)
    if env_prefix:
        compiler = Compiler(Path(env_prefix))
        if not compiler.ocamlopt.is_file():
            raise CompilerNotFound(f"${PREFIX_ENV}={env_prefix}: no bin/ocamlopt.opt there")
        return compiler
    args = [str(BUILD_SCRIPT)] + ([] if build else ["--print-prefix"])
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise CompilerNotFound(f"{BUILD_SCRIPT}: failed ({last})")
    prefix = Path(proc.stdout.strip().splitlines()[-1])
    compiler = Compiler(prefix)
    if not compiler.ocamlopt.is_file():
        raise CompilerNotFound(f"{prefix}: compiler not built (run {BUILD_SCRIPT})")
    return compiler
