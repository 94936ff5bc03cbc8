"""A script of benchmarks/ as a module, for the tests that check its logic and tables."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_script(file: str) -> ModuleType:
    """benchmarks/`file`, imported under a name of its own; the scripts import one another by
    bare name (`from paper import ...`), so benchmarks/ goes on the path first."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"benchmark_{Path(file).stem}", BENCHMARKS / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
