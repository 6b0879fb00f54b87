"""Run a bench script under the project's virtualenv (made by scripts/bootstrap), whatever
python3 the shebang found, and make the repository importable."""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"

if Path(sys.prefix).resolve() != VENV.resolve():
    python = VENV / "bin" / "python"
    if not python.exists():
        sys.exit(f"{python}: missing; run scripts/bootstrap first")
    os.execv(str(python), [str(python), *sys.argv])
sys.path.insert(0, str(ROOT))
