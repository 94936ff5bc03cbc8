"""--import-mode=importlib puts no test directory on sys.path; the helpers in runs.py need it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
