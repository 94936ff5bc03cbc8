"""`prorsa serve`'s command line: loopback by default, bad input one error line before anything starts."""

import socket
from pathlib import Path

from click.testing import CliRunner

from prorsa.cli import main, serve
from prorsa.serve.server import listen

REPO = Path(__file__).resolve().parents[2]
PIPELINE = str(REPO / "pipelines" / "serve.yaml")


def test_it_listens_on_loopback_unless_told():
    [host] = [p for p in serve.params if p.name == "host"]
    assert host.default == "127.0.0.1"
    sock = listen(host.default, 0)
    try:
        assert sock.getsockname()[0] == "127.0.0.1"
    finally:
        sock.close()


def test_the_api_key_may_come_from_the_environment():
    [key] = [p for p in serve.params if p.name == "api_key"]
    assert key.envvar == "PRORSA_API_KEY"


def test_a_taken_port_is_one_error_line_and_no_run_folder(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = taken.getsockname()[1]
        r = CliRunner().invoke(main, ["serve", PIPELINE, "--engine", "emulated", "--port", str(port),
                                      "--output", str(tmp_path / "run")])
    finally:
        taken.close()
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: --host/--port: cannot listen on 127.0.0.1:") and "Traceback" not in r.output
    assert not (tmp_path / "run").exists()


def test_a_pipeline_with_a_trainer_is_refused(tmp_path):
    r = CliRunner().invoke(main, ["serve", str(REPO / "pipelines" / "rl-toy.yaml"), "--output", str(tmp_path / "run")])
    assert r.exit_code == 2 and "drop the train: section" in r.output, r.output


def test_a_model_folder_without_a_tokenizer_is_one_error_line(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    r = CliRunner().invoke(main, ["serve", PIPELINE, "--engine", "emulated", f"engines.vllm.model={model}",
                                  "--output", str(tmp_path / "run")])
    assert r.exit_code == 2 and "cannot load the model's tokenizer" in r.output, r.output
    assert not (tmp_path / "run").exists()


def test_serving_beyond_loopback_without_a_key_warns_and_serves(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    # vLLM made unimportable in the served process: its tool-call parsers (which serve loads where
    # vLLM is installed, ~6 s of CPU to import) have no part in the warning or the clean stop, and
    # prorsa's own hermes parser serves instead (config/engines.py check_tool_parser)
    (tmp_path / "no-vllm" / "vllm").mkdir(parents=True)
    (tmp_path / "no-vllm" / "vllm" / "__init__.py").write_text("raise ImportError('vllm left out')\n")
    path = os.pathsep.join(filter(None, [str(tmp_path / "no-vllm"), os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen([sys.executable, "-m", "prorsa.cli", "serve", PIPELINE, "--engine", "emulated",
                             "--host", "0.0.0.0", "--port", "0", "--output", str(tmp_path / "run")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=os.environ | {"PYTHONPATH": path})
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.split("] ", 1)[-1].startswith("serving ") or "Traceback" in line:
                break
        proc.send_signal(signal.SIGINT)
        text = "".join(lines) + proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "warning: serving on 0.0.0.0, beyond this machine, with no API key" in text, text
    assert "Traceback" not in text and proc.returncode == 2, text
