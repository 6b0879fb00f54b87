import os
import tempfile

import pytest

from dispatcher.build.toolchain import Compiler, locate_compiler

# The suite's local agents lock CPUs in a directory of their own: a test session never waits
# for (or is refused by) a real master on this machine, nor another test session.
os.environ.setdefault("INLINING_ORCHESTRATOR_LOCK_DIR",
                      tempfile.mkdtemp(prefix="inlining-test-locks-"))


@pytest.fixture(scope="session")
def compiler() -> Compiler:
    """The patched compiler (built by compiler/build, or named by $INLINING_COMPILER_PREFIX)."""
    return locate_compiler()
