"""Each patch of the launcher checks the shape of its target in the installed vLLM: today's passes, and a
target renamed, re-signed or fixed upstream fails the check with one line naming the patch, the vLLM
found and what changed; the launcher then stops with that line (exit 2), and a start reports it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from prorsa.engine.vllm import patches
from prorsa.engine.vllm.errors import PatchBroken
from prorsa.engine.vllm.patches import BROKEN, PATCHES
from prorsa.engine.vllm.server import ServerSpec, VllmServer

pytest.importorskip("vllm")
pytest.importorskip("nixl")


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_each_patch_fits_the_installed_vllm(patch):
    assert patch.check() is None
    assert patch.written_for == patches.vllm_version() == "0.32.0"
    assert patch.upstream and patch.works_around and patch.target


def _changed_nixl(mp):
    from nixl._api import nixl_agent

    mp.setattr(nixl_agent, "__init__", lambda self, name, *, config=None: None)
    return "nixl_agent.__init__ takes (self, name, config)"


def _nixl_class_moved(mp):
    from vllm.distributed import nixl_utils

    mp.setattr(nixl_utils, "_load_nixl_attr", lambda name: None)
    return "no longer takes its NixlWrapper from nixl._api.nixl_agent"


def _collectives_upstream(mp):
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    mp.setattr(CpuCommunicator, "reduce_scatterv", lambda self, input_, dim=-1, sizes=None: input_, raising=False)
    return "CpuCommunicator now has its own reduce_scatterv: drop this patch"


def _collectives_resigned(mp):
    from vllm.distributed.device_communicators.base_device_communicator import DeviceCommunicatorBase

    mp.setattr(DeviceCommunicatorBase, "all_gatherv", lambda self, tensors, sizes, dim=0: tensors)
    return "DeviceCommunicatorBase.all_gatherv takes (self, tensors, sizes, dim)"


def _moe_resigned(mp):
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    mp.setattr(CPUUnquantizedExperts, "apply", lambda self, output, hidden_states, weights, *rest: None)
    return "CPUUnquantizedExperts.apply takes (self, output, hidden_states, weights, rest)"


def _shutdown_fixed(mp):
    from vllm.v1.engine.async_llm import AsyncLLM

    def shutdown(self, timeout=None):  # the order vllm#49000 would leave
        if handler := getattr(self, "output_handler", None):
            handler.cancel()
        if engine_core := getattr(self, "engine_core", None):
            engine_core.shutdown(timeout=timeout)

    mp.setattr(AsyncLLM, "shutdown", shutdown)
    return "now cancels its output_handler before the engine core: drop this patch"


def _shutdown_gone(mp):
    mp.setitem(sys.modules, "vllm.v1.engine.async_llm", None)
    return "vllm.v1.engine.async_llm.AsyncLLM cannot be imported"


def _serve_resigned(mp):
    from vllm.entrypoints.cli.serve import ServeSubcommand

    mp.setattr(ServeSubcommand, "cmd", staticmethod(lambda args, config: None))
    return "ServeSubcommand.cmd takes (args, config)"


CHANGES = {  # patch -> ways its target may change under it
    "nixl-progress-nice": (_changed_nixl, _nixl_class_moved),
    "cpu-dp-collectives": (_collectives_upstream, _collectives_resigned),
    "cpu-moe-expert-map": (_moe_resigned,),
    "shutdown-reader-first": (_shutdown_fixed, _shutdown_gone),
    "headless-serve": (_serve_resigned,),
}


def test_every_patch_has_a_changed_target_to_fail_on():
    assert set(CHANGES) == {p.name for p in PATCHES}


@pytest.mark.parametrize(("patch", "change"), [(p, c) for p in PATCHES for c in CHANGES[p.name]],
                         ids=lambda x: getattr(x, "name", getattr(x, "__name__", "")))
def test_a_changed_target_fails_its_check_in_one_line(patch, change, monkeypatch):
    what = change(monkeypatch)
    (line,) = patches.broken([patch])
    assert line.startswith(f"{BROKEN}{patch.name} (written for vLLM 0.32.0) does not fit vLLM 0.32.0: ")
    assert what in line and patch.upstream in line and "\n" not in line
    assert patches.broken([p for p in PATCHES if p is not patch]) == []  # the others' targets did not move


def test_a_server_applies_the_patches_its_environment_asks_for():
    names = lambda env, argv=(): [p.name for p in patches.selected(env, argv)]  # noqa: E731
    assert names({}) == ["shutdown-reader-first"]
    assert names({"PRORSA_NIXL_PROGRESS_NICE": "19", "PRORSA_CPU_DP": "1"}, ["--headless"]) == [
        "nixl-progress-nice", "cpu-dp-collectives", "cpu-moe-expert-map", "shutdown-reader-first", "headless-serve"]
    assert names({"PRORSA_NIXL_PROGRESS_NICE": "0"}) == ["shutdown-reader-first"]
    assert patches.applied_line(patches.selected({}, [])) == "prorsa patches applied (vLLM 0.32.0): shutdown-reader-first"


def test_the_launcher_stops_on_a_broken_patch_with_its_line_and_exit_2(monkeypatch, capsys):
    from prorsa.engine.vllm import _launch

    _launch._stop_if_broken([patches.SHUTDOWN])  # fits: goes on
    what = _shutdown_fixed(monkeypatch)
    with pytest.raises(SystemExit) as stop:
        _launch._stop_if_broken([patches.SHUTDOWN, patches.HEADLESS])
    assert stop.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"{BROKEN}shutdown-reader-first") and what in err[0]


def test_a_start_the_launcher_refused_fails_with_its_line_not_the_log_tail(tmp_path):
    """The server process (here a real one that exits as the launcher would) wrote the line: the
    start's error is that line, not 30 lines of log."""
    line = f"{BROKEN}shutdown-reader-first (written for vLLM 0.32.0) does not fit vLLM 9.9: it changed"
    server = VllmServer(ServerSpec(tmp_path), tmp_path / "engine-0.log")
    (tmp_path / "engine-0.log").write_text(f"{line}\n")  # an earlier start's: not this one's
    server._log_from = (tmp_path / "engine-0.log").stat().st_size
    server._proc = subprocess.Popen([sys.executable, "-c", "print('loading'); print('x'); raise SystemExit(1)"],
                                    stdout=open(tmp_path / "engine-0.log", "ab"), stderr=subprocess.STDOUT)
    server._proc.wait()
    with pytest.raises(Exception) as plain:
        server._check_running()
    assert not isinstance(plain.value, PatchBroken) and "exited with code 1" in str(plain.value)
    with open(tmp_path / "engine-0.log", "a") as log:
        log.write(f"INFO some vLLM line\n{line}\n")
    with pytest.raises(PatchBroken) as refused:
        server._check_running()
    assert str(refused.value) == f"{line} (log: {tmp_path / 'engine-0.log'})"


_LAUNCH_ON_CHANGED_VLLM = """
import runpy, sys
from vllm.v1.engine.async_llm import AsyncLLM
AsyncLLM.shutdown = lambda self: None  # a vLLM whose shutdown takes no timeout
sys.argv = ["_launch.py", "--model", "no-such-model"]
runpy.run_module("prorsa.engine.vllm._launch", run_name="__main__")
"""


@pytest.mark.vllm  # imports vLLM in a fresh process: seconds, minutes on a loaded machine
def test_the_real_launcher_on_a_changed_vllm_exits_2_with_one_line_and_starts_nothing():
    proc = subprocess.run([sys.executable, "-c", _LAUNCH_ON_CHANGED_VLLM], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = [line for line in proc.stderr.splitlines() if "prorsa" in line]
    assert err == [f"{BROKEN}shutdown-reader-first (written for vLLM 0.32.0) does not fit vLLM 0.32.0: "
                   f"AsyncLLM.shutdown takes (self), the patch expects (self, timeout); see {patches.SHUTDOWN.upstream}"]
    assert "Traceback" not in proc.stderr and patches.APPLIED not in proc.stdout
