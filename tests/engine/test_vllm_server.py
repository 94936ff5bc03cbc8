"""The vLLM server launcher and response parsing, without a server (fast), plus a failed start."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from prorsa.config.pipeline import VllmSettings
from prorsa.engine.vllm.protocol import completion_body, gauge, parse_completion
from prorsa.engine.vllm.errors import EngineUnavailable
from prorsa.engine.vllm.command import ServerSpec, build_command, build_env, omp_bind
from prorsa.engine.vllm.server import VllmServer
from prorsa.sampling import Sampling


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_cpu_command_line():
    spec = ServerSpec.from_settings(VllmSettings(extra_args=("--max-num-seqs", "64")), Path("/m"), [1])
    cmd = build_command(spec, port=8123)
    assert cmd[1:3] == ["-m", "prorsa.engine.vllm._launch"]
    assert _flag(cmd, "--model") == "/m" and _flag(cmd, "--port") == "8123"
    assert _flag(cmd, "--kv-cache-memory-bytes") == str(128 * 2**20)
    for flag in ("--enforce-eager", "--enable-prefix-caching", "--enable-prompt-tokens-details"):
        assert flag in cmd
    kv = json.loads(_flag(cmd, "--kv-transfer-config"))
    assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}
    assert cmd[-2:] == ["--max-num-seqs", "64"]  # extra args last: they override ours


def test_cuda_command_line_and_compat_switch():
    settings = VllmSettings(device="cuda", tensor_parallel_size=2, nixl_compat_check=False)
    cmd = build_command(ServerSpec.from_settings(settings, Path("/m"), None), port=1)
    kv = json.loads(_flag(cmd, "--kv-transfer-config"))
    assert kv["kv_buffer_device"] == "cuda"
    assert kv["kv_connector_extra_config"] == {"enforce_handshake_compat": False}
    assert "--kv-cache-memory-bytes" not in cmd and _flag(cmd, "--tensor-parallel-size") == "2"


def test_env_pins_cores_and_ports():
    env = build_env(ServerSpec(Path("/m"), cores=(2, 3)), side_channel_port=5999, base={})
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5999"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "2,3"
    assert env["PRORSA_NIXL_PROGRESS_NICE"] == "19"
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["TORCHDYNAMO_DISABLE"] == "1"  # --enforce-eager: no lazy inductor compiles
    gpu = build_env(ServerSpec(Path("/m"), device="cuda", cores=(0,)), side_channel_port=1, base={})
    assert "VLLM_CPU_OMP_THREADS_BIND" not in gpu and "PRORSA_NIXL_PROGRESS_NICE" not in gpu


def test_a_server_keeps_vllms_info_lines_whatever_the_driver_imported():
    # the start's progress reads them; importing TRL sets VLLM_LOGGING_LEVEL=ERROR in the driver
    assert build_env(ServerSpec(Path("/m")), 1, base={"VLLM_LOGGING_LEVEL": "ERROR"})["VLLM_LOGGING_LEVEL"] == "INFO"
    assert build_env(ServerSpec(Path("/m")), 1, base={"VLLM_LOGGING_LEVEL": "debug"})["VLLM_LOGGING_LEVEL"] == "debug"
    assert build_env(ServerSpec(Path("/m")), 1, base={}).get("VLLM_LOGGING_LEVEL", "INFO") == "INFO"


def test_env_keeps_a_local_server_on_loopback():
    env = build_env(ServerSpec(Path("/m")), side_channel_port=1, base={})
    assert env["UCX_NET_DEVICES"] == "lo" and env["VLLM_HOST_IP"] == "127.0.0.1"
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    mine = build_env(ServerSpec(Path("/m")), side_channel_port=1, base={"UCX_NET_DEVICES": "ib0"})
    assert mine["UCX_NET_DEVICES"] == "ib0"  # set explicitly: wider on purpose
    reachable = build_env(ServerSpec(Path("/m"), nixl_host="10.0.0.5"), side_channel_port=1, base={})
    assert "UCX_NET_DEVICES" not in reachable and reachable["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.5"


def test_omp_bind_splits_cores_over_tp_ranks():
    assert omp_bind((0, 1, 2, 3), ranks=2) == "0,1|2,3"
    with pytest.raises(ValueError):
        omp_bind((0,), ranks=2)


def test_a_cpu_dp_engine_binds_a_core_per_rank_and_asks_for_the_dp_patch():
    dp = ServerSpec.from_settings(VllmSettings(data_parallel_size=2, enable_expert_parallel=True,
                                               cores_per_engine=2), Path("/m"), [0, 1])
    env = build_env(dp, side_channel_port=1, base={})
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1" and env["PRORSA_CPU_DP"] == "1"
    assert "PRORSA_CPU_DP" not in build_env(ServerSpec(Path("/m"), cores=(0,)), side_channel_port=1, base={})
    cuda = ServerSpec.from_settings(VllmSettings(device="cuda", data_parallel_size=2), Path("/m"), None)
    assert "PRORSA_CPU_DP" not in build_env(cuda, side_channel_port=1, base={})


def test_completion_body_sends_token_ids():
    body = completion_body((3, 4, 5), max_tokens=8, sampling=Sampling(temperature=0.7), seed=11)
    assert body["prompt"] == [3, 4, 5] and body["max_tokens"] == 8 and body["seed"] == 11
    assert body["temperature"] == 0.7 and not {"top_p", "top_k", "stop", "min_p", "presence_penalty",
                                                "frequency_penalty", "repetition_penalty"} & set(body)  # defaults unsent
    asked = completion_body((3,), max_tokens=8, sampling=Sampling(temperature=0.0, top_p=0.9, top_k=20, stop=("\n",)))
    assert (asked["temperature"], asked["top_p"], asked["top_k"], asked["stop"]) == (0.0, 0.9, 20, ["\n"])
    penalised = completion_body((3,), max_tokens=8, sampling=Sampling(min_p=0.1, presence_penalty=0.5,
                                                                      frequency_penalty=-0.5, repetition_penalty=1.2))
    assert [penalised[k] for k in ("min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")] == \
        [0.1, 0.5, -0.5, 1.2]
    assert body["return_token_ids"] is True and body["logprobs"] == 0 and body["ignore_eos"] is True
    assert "logprobs" not in completion_body((1,), max_tokens=1, logprobs=False)
    with pytest.raises(ValueError, match="token ids"):
        completion_body(None, max_tokens=1)


def test_completion_body_sends_priority_in_ms_only_when_set():
    """vLLM's priority is an int (lower sooner); ours is seconds. 0 is not sent: the body a
    server on the default fcfs policy gets is the one it always got."""
    assert "priority" not in completion_body((1,), max_tokens=1)
    assert "priority" not in completion_body((1,), max_tokens=1, priority=0.0)
    assert "priority" not in completion_body((1,), max_tokens=1, priority=0.0004)  # rounds to 0 ms
    body = completion_body((1,), max_tokens=1, priority=-12.3456)
    assert body["priority"] == -12346 and type(body["priority"]) is int
    assert completion_body((1,), max_tokens=1, priority=1_800_000_000.25)["priority"] == 1_800_000_000_250


def test_priority_policy_command_line():
    """--scheduling-policy priority only when asked; scheduling.priority asks for it on vLLM engines."""
    from prorsa.config.pipeline import EnginesConfig, PipelineConfig, SchedulingConfig
    from prorsa.engine.registry import hosted_engines

    assert "--scheduling-policy" not in build_command(ServerSpec(Path("/m")), port=1)
    spec = ServerSpec.from_settings(VllmSettings(scheduling_policy="priority"), Path("/m"), None)
    assert _flag(build_command(spec, port=1), "--scheduling-policy") == "priority"

    vllm = EnginesConfig(backend="vllm")
    on, off = SchedulingConfig(priority=True), SchedulingConfig()
    assert hosted_engines(PipelineConfig(name="p", engines=vllm, scheduling=on)).vllm.scheduling_policy == "priority"
    assert hosted_engines(PipelineConfig(name="p", engines=vllm, scheduling=off)).vllm.scheduling_policy == "fcfs"
    emulated = PipelineConfig(name="p", scheduling=on)
    assert hosted_engines(emulated) is emulated.engines  # emulated engines admit by priority anyway


def test_engine_sends_each_legs_priority():
    import asyncio

    from prorsa.engine.base import DecodeRequest, PrefillRequest
    from prorsa.engine.vllm import Placement, VllmEngine
    from prorsa.roles import Role

    engine = VllmEngine("E", Role.MIXED, VllmSettings(), Path("m"), Placement(), log_dir=Path("."))
    sent = []

    async def complete(body, leg, kv_tokens):
        sent.append(body.get("priority"))
        raise EngineUnavailable("stop here")

    engine._complete = complete
    dec = DecodeRequest("t", 0, context_tokens=3, max_tokens=1, token_ids=(1, 2, 3), priority=2.5)
    legs = (engine.prefill(PrefillRequest("t", 0, 3, 3, (1, 2, 3), priority=-1.5)), engine.decode(dec),
            engine.generate(dec), engine.generate(DecodeRequest("t", 0, 3, 1, token_ids=(1, 2, 3))))
    for leg in legs:
        with pytest.raises(EngineUnavailable):
            asyncio.run(leg)
    assert sent == [-1500, 2500, 2500, None]


def test_top_logprobs_are_asked_by_id_and_read_likeliest_first():
    body = completion_body((3,), max_tokens=2, sampling=Sampling(top_logprobs=2))
    assert body["logprobs"] == 2 and body["return_tokens_as_token_ids"] is True
    assert "return_tokens_as_token_ids" not in completion_body((3,), max_tokens=2)
    # vLLM 0.32 with logprobs=2 and return_tokens_as_token_ids: the 2 likeliest and the sampled one
    resp = {"choices": [{"token_ids": [5, 9], "finish_reason": "length",
                         "logprobs": {"token_logprobs": [-0.1, -2.5], "tokens": ["token_id:5", "token_id:9"],
                                      "top_logprobs": [{"token_id:5": -0.1, "token_id:7": -3.0},
                                                       {"token_id:8": -0.4, "token_id:4": -1.2,
                                                        "token_id:9": -2.5}]}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2}}
    r = parse_completion(resp, wall_s=0.1)
    assert r.top_logprobs == (((5, -0.1), (7, -3.0)), ((8, -0.4), (4, -1.2), (9, -2.5)))
    # asked for none (logprobs=0), vLLM still lists the sampled token, by its text: no alternatives
    resp["choices"][0]["logprobs"]["top_logprobs"] = [{"hel": -0.1}, {"lo": -2.5}]
    assert parse_completion(resp, wall_s=0.1).top_logprobs == ()


def test_parse_completion_response():
    # shape of a vLLM 0.32 /v1/completions response with return_token_ids, logprobs=0,
    # --enable-prompt-tokens-details and --enable-per-request-metrics
    resp = {
        "choices": [{"token_ids": [5, 6], "finish_reason": "length",
                     "logprobs": {"token_logprobs": [-1.5, -0.25], "tokens": ["a", "b"]}}],
        "usage": {"prompt_tokens": 300, "completion_tokens": 2,
                  "prompt_tokens_details": {"cached_tokens": 256}},
        "kv_transfer_params": {"do_remote_prefill": True, "remote_engine_id": "e"},
        "metrics": {"queue_time_ms": 2.0, "time_to_first_token_ms": 40.0, "generation_time_ms": 10.0},
    }  # fmt: skip
    r = parse_completion(resp, wall_s=0.1)
    assert r.token_ids == (5, 6) and r.logprobs == (-1.5, -0.25)
    assert (r.prompt_tokens, r.cached_tokens) == (300, 256)
    assert r.kv["remote_engine_id"] == "e"
    assert (r.queue_s, r.first_token_s, r.decode_s) == (0.002, 0.04, 0.01)
    bare = parse_completion({"choices": [{"text": "x"}], "usage": {}}, wall_s=0.1)
    assert bare.token_ids == () and bare.first_token_s == 0.1 and bare.kv is None


def test_gauge_reads_prometheus_text():
    text = (
        "# HELP vllm:num_requests_running x\n"
        'vllm:num_requests_running{engine="0",model_name="prorsa"} 3.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="prorsa"} 0.25\n'
    )
    assert gauge(text, "vllm:num_requests_running") == 3.0
    assert gauge(text, "vllm:kv_cache_usage_perc") == 0.25
    assert gauge(text, "vllm:num_requests_waiting") == 0.0


@pytest.mark.vllm
def test_failed_start_reports_the_log_fast(tmp_path):
    """A server that exits while starting fails start() at once with its last log lines."""
    server = VllmServer(ServerSpec(tmp_path / "no-such-model", cores=(0,)), tmp_path / "s.log")
    # "exited with code", not the start timeout's "not healthy after 300 s": seen as it exited
    with pytest.raises(EngineUnavailable, match="exited with code"):
        server.start()
    assert not server.alive()


def test_server_stops_itself_when_its_owner_dies():
    """The launcher's watchdog: an orphaned server takes its process group down."""
    import os
    import signal
    import subprocess
    import sys

    server = (
        "import os, time\n"
        "from prorsa.engine.vllm._launch import _watch_parent\n"
        "_watch_parent(int(os.environ['PRORSA_PARENT_PID']), poll_s=0.05, grace_s=1)\n"
        "time.sleep(60)\n"
    )
    owner = (
        "import os, subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', {server!r}], start_new_session=True,\n"
        "                      env={**os.environ, 'PRORSA_PARENT_PID': str(os.getpid())})\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", owner], stdout=subprocess.PIPE, text=True)
    pid = int(proc.stdout.readline())
    time.sleep(0.5)
    os.kill(pid, 0)  # the server runs while its owner lives
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 45  # a hang guard, under the server's own 60 s: not a speed bound
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return  # the whole group is gone
        if _exited(pid):
            return  # dead, left as a zombie by an init that does not reap orphans
        time.sleep(0.05)
    os.killpg(pid, signal.SIGKILL)
    pytest.fail("orphaned server still running 45 s after its owner died")


def _exited(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_lost_port_race_is_retried_on_fresh_ports(tmp_path, monkeypatch):
    """A server that hangs after losing a port to a sibling (vLLM picks its ZMQ ports itself) is
    caught from its log within seconds and relaunched, not left to the start timeout."""
    import sys

    import prorsa.engine.vllm.server as server_mod

    hang = "print('zmq.error.ZMQError: Address already in use', flush=True); import time; time.sleep(60)"
    ports: list[int] = []

    def fake_command(spec, port):
        ports.append(port)
        return [sys.executable, "-c", hang]

    monkeypatch.setattr(server_mod, "build_command", fake_command)
    server = VllmServer(ServerSpec(tmp_path, cores=(0,), start_timeout_s=120), tmp_path / "s.log")
    # PortClash is raised only from the log; the start timeout, or the hung process ending after
    # its 60 s, would raise a plain EngineUnavailable
    with pytest.raises(server_mod.PortClash):
        server.start()
    assert len(ports) == server_mod.PORT_CLASH_ATTEMPTS and not server.alive()
    assert (tmp_path / "s.log").read_text().count(" starting: ") == server_mod.PORT_CLASH_ATTEMPTS


@pytest.mark.vllm
def test_engines_that_do_not_start_end_the_run_with_one_error_line(tmp_path):
    import subprocess
    import sys

    text = (Path(__file__).resolve().parents[2] / "pipelines" / "quickstart.yaml").read_text()
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(text.replace("    cores_per_engine: 1", "    cores_per_engine: 1\n    start_timeout_s: 1"))
    proc = subprocess.run([sys.executable, "-m", "prorsa.cli", "run", str(pipeline), f"output_dir={tmp_path}"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"error: {pipeline}: engines did not start: ") and \
        "not healthy after 1 s" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    # not a half-made run: marked failed, and the line points at the logs that say why
    (run_dir,) = [d for d in tmp_path.iterdir() if d.is_dir()]
    assert json.loads((run_dir / "failed.json").read_text())["stage"] == "start"
    assert proc.stderr.rstrip().endswith(f"(engine logs: {run_dir / 'engines'})")
    assert list((run_dir / "engines").glob("*.log"))


def test_weights_pushed_to_a_down_engine_are_kept_for_its_restart(tmp_path):
    """The RL loop pushes each version to every engine; one that is down (between a crash and
    its restart) refuses, but its next start loads that version, not the one it had."""
    import asyncio

    from prorsa.engine.vllm import Placement, VllmEngine
    from prorsa.roles import Role

    engine = VllmEngine("E", Role.MIXED, VllmSettings(), tmp_path / "v0", Placement(), log_dir=tmp_path)
    with pytest.raises(EngineUnavailable, match="not started"):
        asyncio.run(engine.load_weights(tmp_path / "v7"))
    assert engine._weights_dir == tmp_path / "v7"


def test_cpu_engines_send_no_seed():
    """A seeded request whose prefill vLLM splits kills a CPU engine core (its generator has no
    offset to rewind); the seed is dropped on CPU and kept on CUDA."""
    import asyncio

    from prorsa.engine.base import DecodeRequest
    from prorsa.engine.vllm import Placement, VllmEngine
    from prorsa.roles import Role

    sent = []
    for device in ("cpu", "cuda"):
        engine = VllmEngine("E", Role.MIXED, VllmSettings(device=device), Path("m"), Placement(), log_dir=Path("."))

        async def complete(body, leg, kv_tokens):
            sent.append(body.get("seed"))
            raise EngineUnavailable("stop here")

        engine._complete = complete
        with pytest.raises(EngineUnavailable):
            asyncio.run(engine.generate(DecodeRequest("t", 0, context_tokens=3, max_tokens=1, token_ids=(1, 2, 3),
                                                      seed=42)))
    assert sent == [None, 42]


def test_a_replayed_decode_asks_its_length_and_a_live_one_its_cap_and_kv_counts_contexts():
    """Replaying, the engine asks exactly the replayed length with EOS ignored (how a random tiny
    model is made to write it); a live turn asks the run's cap and stops at EOS. While they are in
    flight the client's KV figure is their contexts: what they will decode it cannot see."""
    import asyncio

    from prorsa.engine.base import DecodeRequest
    from prorsa.engine.vllm import Placement, VllmEngine
    from prorsa.roles import Role

    engine = VllmEngine("E", Role.MIXED, VllmSettings(), Path("m"), Placement(), log_dir=Path("."))
    sent, held = [], []

    async def complete(body, leg, kv_tokens):
        sent.append((body["max_tokens"], body["ignore_eos"]))
        held.append(kv_tokens)
        raise EngineUnavailable("stop here")

    engine._complete = complete
    replay = DecodeRequest("t", 0, context_tokens=3, max_tokens=4000, token_ids=(1, 2, 3), replay_tokens=37)
    live = DecodeRequest("t", 0, context_tokens=3, max_tokens=4000, token_ids=(1, 2, 3), ignore_eos=False)
    for req in (replay, live):
        with pytest.raises(EngineUnavailable):
            asyncio.run(engine.generate(req))
    assert sent == [(37, True), (4000, False)]
    assert held == [3, 3]


def _http_server(routes: dict[str, tuple[int, bytes]]):
    """A local HTTP server answering GET path -> (status, body); 404 elsewhere."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            status, body = routes.get(self.path, (404, b"<html><title>404: Not Found</title></html>"))
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("routes,ours", [
    ({"/health": (200, b"ok")}, False),  # a Dask worker's HTTP server on the port picked for vLLM
    ({"/health": (200, b""), "/v1/models": (200, json.dumps({"data": [{"id": "other"}]}).encode())}, False),
    ({"/health": (200, b""), "/v1/models": (200, json.dumps({"data": [{"id": "prorsa"}]}).encode())}, True),
    ({"/health": (200, b""), "/v1/models": (200, b"not json")}, False),
])  # fmt: skip
def test_a_start_waits_for_a_server_that_serves_our_model_not_any_health_answer(routes, ours):
    from prorsa.engine.vllm.server import serves_us

    server = _http_server(routes)
    try:
        assert serves_us(f"http://127.0.0.1:{server.server_address[1]}") is ours
    finally:
        server.shutdown()


def test_dp_ranks_get_consecutive_free_side_channel_ports(monkeypatch):
    """Each DP rank opens its NIXL side channel on the base port + its index: a base whose next
    ports are not all free is passed over."""
    from prorsa.engine.vllm import server

    bases = iter([1000, 2000])
    monkeypatch.setattr(server, "free_port", lambda: next(bases))
    monkeypatch.setattr(server, "_port_free", lambda port: port != 1002)
    assert server.free_ports(3) == 2000  # 1000..1002 holds a taken port
    monkeypatch.setattr(server, "free_port", lambda: 1000)
    with pytest.raises(EngineUnavailable, match="no 3 consecutive free local ports"):
        server.free_ports(3, attempts=4)
    assert server.free_ports(1) == 1000  # one rank: no neighbour to look at


class _DeadServer:
    """A server that is down until started; each check and start takes a moment, as a real one's
    do. Its address refuses connections, so a request sent once it is up fails as unavailable."""

    url = "http://127.0.0.1:9"
    kv_capacity_tokens = 0

    def __init__(self, log_path: Path) -> None:
        self.up, self.starts = False, 0
        self.log_path = log_path  # where a restart says why (engine.note_restart)

    def healthy(self, timeout_s: float = 5.0) -> bool:
        time.sleep(0.05)
        return self.up

    def alive(self) -> bool:
        return self.up

    def start(self) -> None:
        time.sleep(0.2)
        self.starts += 1
        self.up = True

    def stop(self) -> None:
        self.up = False


def _engine_on(server, tmp_path):
    from prorsa.engine.vllm import Placement, VllmEngine
    from prorsa.roles import Role

    return VllmEngine("E", Role.MIXED, VllmSettings(), Path("m"), Placement(), log_dir=tmp_path, server=server)


def test_the_health_watch_and_a_request_that_found_the_server_gone_share_one_restart(tmp_path):
    """The health watch began a restart; a request then found the server gone and asked for its
    own. The watch's stop cancelled the request's restart, and every leg waiting for it raised
    CancelledError, which no turn retry catches: the trajectories failed. Now both join one
    restart and the waiting legs go on to the new server (here one that refuses them)."""
    import asyncio

    from prorsa.roles import Role

    server = _DeadServer(tmp_path / "engine-0.log")
    engine = _engine_on(server, tmp_path)

    async def go():
        watch = asyncio.create_task(engine.ensure_healthy())
        await asyncio.sleep(0.01)  # the watch holds the restart lock, checking /health
        engine._server_lost()
        legs = [asyncio.create_task(engine._complete({}, Role.MIXED, kv_tokens=0)) for _ in range(3)]
        restarted = await watch
        ended = await asyncio.gather(*legs, return_exceptions=True)
        again = await engine.ensure_healthy()
        await engine.stop()
        return restarted, ended, again

    restarted, ended, again = asyncio.run(go())
    assert (restarted, again, server.starts) == (True, False, 1)
    assert [type(e) for e in ended] == [EngineUnavailable] * 3, ended
    assert all("ConnectError" in str(e) for e in ended), ended  # sent to the new server
    assert "restarting: the server's process died" in (tmp_path / "engine-0.log").read_text()  # the console's cause


def test_a_leg_waiting_for_a_restart_the_engine_stopped_finds_no_server_not_a_cancellation(tmp_path):
    import asyncio

    from prorsa.roles import Role

    engine = _engine_on(_DeadServer(tmp_path / "engine-0.log"), tmp_path)

    async def go():
        engine._server_lost()
        leg = asyncio.create_task(engine._complete({}, Role.MIXED, kv_tokens=0))
        await asyncio.sleep(0.01)
        await engine.stop()  # shutting down while the restart is under way
        return await leg

    with pytest.raises(EngineUnavailable, match="not started"):
        asyncio.run(go())
