import pytest

from dispatcher.compiler import Compiler, locate_compiler


@pytest.fixture(scope="session")
def compiler() -> Compiler:
    """The patched compiler (built by compiler/build, or named by $INLINING_COMPILER_PREFIX)."""
    return locate_compiler()
