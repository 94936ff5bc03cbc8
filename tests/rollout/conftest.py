"""--import-mode=importlib puts no test directory on sys.path; second_per_turn.py needs it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
