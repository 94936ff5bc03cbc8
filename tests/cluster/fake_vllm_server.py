"""A stand-in for a vLLM server process, for tests of how engines are launched: it writes down
its environment and arguments (RECORD_DIR/<port>.json), then answers what VllmServer.start asks
(/health, /v1/models, the warm-up completion, /metrics). With --headless (a further node of an
engine spanning nodes) it serves nothing, as vLLM's headless node, and the leader serves only
once a headless node meets it; FAKE_HEADLESS_EXIT=n makes a headless one exit with code n
instead. It ends itself once the process that launched it is gone: a worker killed before it
could stop its server (a cancelled batch job's) must not leave the fake serving after the test.
"""

import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ARGS = sys.argv[1:]
PORT = int(ARGS[ARGS.index("--port") + 1])
METRICS = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="64"} 1.0\n'
COMPLETION = {"choices": [{"text": "", "token_ids": [1], "finish_reason": "length"}],
              "usage": {"prompt_tokens": 1, "completion_tokens": 1}}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, body: str, ctype: str = "application/json", code: int = 200) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self._send("")
        elif self.path == "/v1/models":  # the name it was told to serve, as vLLM lists it
            self._send(json.dumps({"data": [{"id": ARGS[ARGS.index("--served-model-name") + 1]}]}))
        elif self.path == "/metrics":
            self._send(METRICS, "text/plain")
        else:
            self._send("", code=404)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._send(json.dumps(COMPLETION))


def _joined(rpc_port: str) -> bool:
    """A headless node has been launched to meet us on rpc_port (as vLLM's API server waits for it)."""
    for name in os.listdir(RECORD):
        if not name.endswith(".json"):  # a launch still writing its record (.part): not met yet
            continue
        args = json.load(open(os.path.join(RECORD, name)))["args"]
        if "--headless" in args and args[args.index("--data-parallel-rpc-port") + 1] == rpc_port:
            return True
    return False


def _end_with(parent: int) -> None:
    while os.getppid() == parent:  # reparented once the launcher has died
        time.sleep(0.2)
    os._exit(0)


threading.Thread(target=_end_with, args=(os.getppid(),), daemon=True).start()
RECORD = os.environ["RECORD_DIR"]
if "--headless" in ARGS and os.environ.get("FAKE_HEADLESS_EXIT"):
    sys.exit(int(os.environ["FAKE_HEADLESS_EXIT"]))
with open(os.path.join(RECORD, f"{PORT}.json.part"), "w") as f:
    json.dump({"env": dict(os.environ), "args": ARGS, "pid": os.getpid()}, f)
os.replace(os.path.join(RECORD, f"{PORT}.json.part"), os.path.join(RECORD, f"{PORT}.json"))
if "--headless" in ARGS:
    signal.pause()
if "--data-parallel-rpc-port" in ARGS:
    while not _joined(ARGS[ARGS.index("--data-parallel-rpc-port") + 1]):
        time.sleep(0.1)
ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
