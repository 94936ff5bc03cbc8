"""`prorsa serve`: a pipeline's engines behind an OpenAI-compatible endpoint, each conversation a
trajectory of the run folder.

    ServeRequest               the command's arguments as given
    serve_pipeline(request)    refuse what one endpoint cannot serve, listen, roll out until stopped
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from prorsa.commands.errors import fail
from prorsa.commands.inputs import check_engines, load_pipeline, with_options
from prorsa.commands.run_folder import new_run_folder, run_folder_at, write_pipeline
from prorsa.commands.stopping import roll_out
from prorsa.console.clocked import command_console, plain

if TYPE_CHECKING:
    from prorsa.rollout.context import RunContext


@dataclass(frozen=True)
class ServeRequest:
    pipeline: str
    overrides: tuple[str, ...]
    host: str
    port: int
    engine: str | None
    policy: str | None
    output: str | None
    idle_s: float  # a conversation with no request for this long ends
    max_tokens: int  # a reply's cap when a request sets none
    max_request_mb: float = 16.0  # a larger request body is refused before it is read
    api_key: str | None = None  # requests must send it as a bearer token (/health excepted)
    request_timeout_s: float | None = None  # a request not answered by then gets a 504


def serve_pipeline(request: ServeRequest) -> None:
    from prorsa.live.resume import open_journal
    from prorsa.live.run import run_live
    from prorsa.console.progress import summary_table
    from prorsa.serve.app import Guards
    from prorsa.serve.server import Endpoint, Limits, exposure_warning
    from prorsa.sim.run import lend

    resolved = _servable(request)
    cfg = resolved.cfg
    tokenizer, parser, sock = _tokenizer_and_socket(request, resolved)
    folder = run_folder_at(Path(request.output)) if request.output else new_run_folder(Path(cfg.output_dir), cfg.name)
    write_pipeline(folder, cfg)
    console = command_console()
    console.print(f"run directory: {folder.path}")
    if (warning := exposure_warning(request.host, request.api_key)) is not None:
        Console(stderr=True).print(warning, markup=False, highlight=False, soft_wrap=True)
    guards = Guards(int(request.max_request_mb * 2**20), request.api_key, request.request_timeout_s)
    endpoint = Endpoint(resolved, sock, tokenizer, Limits(request.idle_s, request.max_tokens, guards),
                        say=lambda line: plain(console, line), run_dir=folder.path, parser=parser)
    rollout = run_live(resolved, folder.path, console, journal=open_journal(cfg, folder.path), driver=endpoint.driver,
                       lend=lend)
    summary = roll_out(rollout, folder, request.pipeline, wind_down=endpoint.stop)
    console.print(summary_table(summary))
    console.print(f"wrote {folder.path}")
    if endpoint.stopped:  # as every stop by a signal ends: exit 2, here with nothing lost
        fail(f"interrupted; every conversation is saved in {folder.path}")


def _servable(request: ServeRequest) -> RunContext:
    resolved = load_pipeline(request.pipeline, with_options(request.overrides, **{"engines.backend": request.engine,
                                                                                  "policy": request.policy}))
    cfg, pipeline = resolved.cfg, request.pipeline
    if cfg.runtime.cells > 1:
        fail(f"{pipeline}: runtime.cells: prorsa serve serves one cell; set runtime.cells 1")
    if cfg.train is not None:
        fail(f"{pipeline}: prorsa serve rolls out for the client's own trainer; drop the train: section")
    if cfg.partial_rollout is not None:
        fail(f"{pipeline}: partial_rollout: prorsa serve has no steps, its clients' conversations are the "
             "trajectories; drop the partial_rollout: section")
    check_engines(cfg, pipeline)
    if cfg.runtime.output_flush_s > SAVED_WITHIN_S / 2:
        # a conversation the client ended is on disk within a second (a trainer may read it next):
        # the journal's timer ticks every output_flush_s and commits rows older than that
        runtime = cfg.runtime.model_copy(update={"output_flush_s": SAVED_WITHIN_S / 2})
        resolved = replace(resolved, cfg=cfg.model_copy(update={"runtime": runtime}))
    return resolved


SAVED_WITHIN_S = 1.0


def _tokenizer_and_socket(request: ServeRequest, resolved: RunContext) -> tuple[Any, Any, socket.socket]:
    from prorsa.serve.server import listen, load_tokenizer
    from prorsa.serve.tool_calls import ReplyParser

    try:
        tokenizer = load_tokenizer(resolved)
    except (OSError, ValueError) as e:
        fail(f"{request.pipeline}: engines.vllm.model: cannot load the model's tokenizer ({e})")
    try:
        parser = ReplyParser(resolved.cfg.engines.vllm.tool_call_parser, tokenizer)
    except ValueError as e:
        fail(f"{request.pipeline}: engines.vllm.tool_call_parser: {e}")
    try:
        sock = listen(request.host, request.port)
    except OSError as e:
        fail(f"--host/--port: cannot listen on {request.host}:{request.port} ({e.strerror or e})")
    return tokenizer, parser, sock
