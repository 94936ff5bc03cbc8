"""The tiny model every trainer test loads, made once per session; torch on one thread, which is
many times faster for a model this small on a shared machine. --import-mode=importlib puts no
test directory on sys.path; the helpers in step_results.py need it."""

import sys
from pathlib import Path

import pytest
import torch

from prorsa.engine.tiny_model import ensure_tiny_model

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    cache = Path(".prorsa/models") if Path(".prorsa/models").is_dir() else tmp_path_factory.mktemp("models")
    return ensure_tiny_model(cache)


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
