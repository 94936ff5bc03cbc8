"""`prorsa.Rollout`: a live run's cluster and engines kept up across calls from another program.

    with Rollout(pipeline, **overrides) as r     start the cluster, engines, router and control
                                                 loop once (live/run.py open_live: the assembly
                                                 `prorsa run` uses), stop them on exit
    r.generate(tasks) -> [Trajectory]            one batch, synchronously: every task's group
    r.submit(tasks) -> [Future[Trajectory]]      the same batch, started; futures complete one by
                                                 one (concurrent.futures.as_completed)
    r.stream(tasks) -> Iterator[Trajectory]      the batch's trajectories as each finishes
    r.update_weights(source) -> int              new weights into every engine (a model directory,
                                                 a state dict, or a callable returning one): the
                                                 RL loop's in-place reload; the new policy version
    r.version                                    updates pushed so far; each trajectory carries
                                                 the version it started under

`tasks`: Task records (their prompt, answer and reference calls; the pipeline's environment runs
the tools and the reward), or a count of prompts drawn from the pipeline's own environment or
workload, or None for the pipeline's `workload.prompts`. Each task is one GRPO group of
`workload.group_size` trajectories; batch b's are "s<b>-p<i>-g<j>". The turns' shape (lengths,
tool latencies in replay) comes from the pipeline's workload, as in `prorsa run`.

Batches may overlap (submit, then submit again before the first ends: the async RL pattern); they
share the engines, router, lifecycle tracker and policy. The asyncio loop that drives them runs
in a thread of its own, so the caller's code stays synchronous.

With the pipeline's `partial_rollout:` section, generate() is a partial rollout's step
(rollout/partial.py): it starts (1 + over_sample) x workload.prompts groups, returns the first
workload.prompts of them to be whole, and carries the rest into the next call (under the weights
of that call: turns are tagged with the version they ran under), or cancels them without carry.
Carried groups that lag the caller's version by more than max_staleness are dropped
(`Rollout.dropped`, status stale or cancelled). Such steps run one at a time and draw their
groups from the pipeline's environment or workload: generate() only, with no task list.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import logging
import queue
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from rich.console import Console

from prorsa.agent.datasets.base import Task
from prorsa.agent.loop import TrajectoryResult
from prorsa.agent.workload import TrajectorySpec, Workload
from prorsa.api.records import Trajectory, trajectory_of
from prorsa.api.weights import WeightSource, model_dir_for
from prorsa.cluster.tool_host import driver_environment
from prorsa.config.cluster import ClusterSpec
from prorsa.config.load import ConfigError, describe, load_pipeline
from prorsa.config.pipeline import PipelineConfig
from prorsa.engine.registry import backend_of
from prorsa.live.run import LiveSession, open_live
from prorsa.rl.training import push_weights
from prorsa.rollout.assemble import beside
from prorsa.rollout.context import RunContext, resolve
from prorsa.rollout.drivers import Hooks, play_spec
from prorsa.rollout.partial import PartialPlan, Steps
from prorsa.sim.run import lend

Tasks = Sequence[Task] | int | None


def _config(pipeline: str | Path | PipelineConfig | RunContext, overrides: dict[str, Any]) -> RunContext:
    dotted = {k.replace("__", "."): v for k, v in overrides.items()}  # workload__prompts= or **{"workload.prompts": }
    if isinstance(pipeline, RunContext):
        if dotted:
            raise ConfigError("overrides: give them with the pipeline file or config, not a resolved RunContext")
        run = pipeline
    elif isinstance(pipeline, PipelineConfig):
        data = pipeline.model_dump(mode="json")
        for key, value in dotted.items():
            node = data
            *parents, leaf = key.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
        try:
            run = resolve(PipelineConfig.model_validate(data))
        except ValidationError as e:  # one line naming the field, as a pipeline file's would be
            raise ConfigError(describe(e.errors()[0])) from None
    else:
        run = resolve(load_pipeline(pipeline, dotted), pipeline)
    if run.cfg.train is not None:
        raise ConfigError("train: the Python API takes its weights from the caller's trainer "
                          "(Rollout.update_weights); remove the train section")
    if run.cfg.scheduling.oracle:
        raise ConfigError("scheduling.oracle reads the workload's future: the simulator's alone (prorsa sim)")
    return run


class Rollout:
    """Prorsa's rollout called from another program: the cluster, engines, router and control
    loop started once and kept up across batches, so a trainer pays vLLM's start-up only once.

        with Rollout("pipelines/quickstart.yaml", workload__group_size=8) as rollout:
            batch = rollout.generate(4)             # 4 tasks x 8 samples -> [Trajectory]
            version = rollout.update_weights(model) # the trainer's new weights, in every engine

    generate(tasks) returns a batch when it is whole; submit(tasks) returns futures that complete
    one by one; stream(tasks) yields trajectories as they finish. Batches may overlap (async RL);
    each Trajectory carries the policy version it started under. start() and close() are what
    the `with` block calls; close() stops every engine and process it started.
    """

    def __init__(self, pipeline: str | Path | PipelineConfig | RunContext, *, run_dir: str | Path | None = None,
                 cluster: ClusterSpec | None = None, console: Console | None = None, **overrides: Any) -> None:
        """`overrides`: pipeline fields, dotted (`**{"workload.group_size": 4}`) or with double
        underscores (`workload__group_size=4`); `run_dir`: where engine logs and pushed weights go
        (default: a temporary directory, removed on exit); `console`: where start-up and progress
        are told (default: nowhere). The start-up (each engine's steps, minutes for vLLM on CPU,
        and any restart with its cause) goes to the `prorsa.start` logger at INFO as well, for
        the host application to route: logging.getLogger("prorsa.start").setLevel(logging.INFO)
        with a handler (logging.basicConfig) shows it."""
        self.run = _config(pipeline, overrides)
        self.cfg = self.run.cfg
        self._own_dir = run_dir is None
        self.run_dir = None if run_dir is None else Path(run_dir)  # a temporary one is made at start
        self._cluster = cluster
        self._console = console or Console(quiet=True)
        if console is None:  # a library says nothing unasked; Dask's workers log every start at INFO
            for name in ("distributed", "tornado", "bokeh"):
                logging.getLogger(name).setLevel(max(logging.getLogger(name).level, logging.ERROR))
        self._workload = Workload.from_config(self.cfg.workload, self.cfg.seed)
        self._lock = threading.Lock()  # batch numbers and what is in flight, from any caller thread
        self._updating = threading.Lock()
        self._batches = 0
        self._version = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._session: cf.Future | None = None
        self._live: LiveSession | None = None
        self._stop: asyncio.Event | None = None
        self._in_flight: set[cf.Future] = set()
        self._partial = PartialPlan.of(self.cfg)
        self._steps: Steps | None = None  # a partial rollout's groups, carried across generate() calls
        self.dropped: list[Trajectory] = []  # partial rollouts: groups cut stale, or cancelled without carry

    # --- lifetime -----------------------------------------------------------------------------

    def __enter__(self) -> Rollout:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        """Cluster and engines up; returns once they serve (raises what kept them from starting)."""
        if self._loop is not None:
            raise RuntimeError("this Rollout has started already")
        if self._own_dir:
            self.run_dir = Path(tempfile.mkdtemp(prefix=f"prorsa-{self.cfg.name}-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="prorsa-rollout", daemon=True)
        self._thread.start()
        ready: cf.Future = cf.Future()
        self._session = asyncio.run_coroutine_threadsafe(self._hold(ready), self._loop)
        cf.wait([ready, self._session], return_when=cf.FIRST_COMPLETED)
        if not ready.done():  # the session ended before it was up: its error is the start's
            try:
                self._session.result()
            finally:
                self._shut_loop()

    async def _hold(self, ready: cf.Future) -> None:
        self._stop = asyncio.Event()
        async with open_live(self.run, self.run_dir, self._console, cluster=self._cluster, lend=lend) as live, \
                beside(live.body):
            self._live = live
            ready.set_result(None)
            await self._stop.wait()

    def close(self) -> None:
        """Engines, cluster and the loop's thread stopped; trajectories still running are cancelled."""
        if self._loop is None:
            return
        try:
            for f in list(self._in_flight):  # before the engines go, or their legs would wait on them
                f.cancel()
            if self._session is not None and not self._session.done():
                self._loop.call_soon_threadsafe(self._stop.set)
                self._session.result()
        finally:
            self._shut_loop()

    def _shut_loop(self) -> None:
        loop, self._loop, self._live = self._loop, None, None
        asyncio.run_coroutine_threadsafe(_cancel_all(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join()
        loop.close()
        if self._own_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    # --- batches ------------------------------------------------------------------------------

    def submit(self, tasks: Tasks = None) -> list[cf.Future]:
        """Start one batch; a future per trajectory, resolving to its Trajectory."""
        self._whole_batches_only("submit")
        return self._start(tasks)

    def _whole_batches_only(self, call: str) -> None:
        if self._partial is not None:
            raise ValueError(f"{call}: a partial rollout's steps end early and carry their tail into the next, "
                             "so they run one at a time: use generate()")

    def _start(self, tasks: Tasks, report: Callable[[Any], None] | None = None) -> list[cf.Future]:
        """`report`: called on the loop with each Trajectory (or exception) as it ends, in that order."""
        live = self._up()
        prompts, given = self._prompts(tasks)
        environment = driver_environment(self.cfg, live.client, tasks=given, prompts=prompts)
        episodes = None if environment is None else environment.episode
        with self._lock:
            step, self._batches = self._batches, self._batches + 1
            # nothing in flight is a step boundary, where a policy that plans between steps
            # (prorsa) sets the roles for the next, as it does between `prorsa run`'s steps
            opening = None if self._in_flight else asyncio.run_coroutine_threadsafe(
                live.controller.before_step(step), self._loop)
            futures = [asyncio.run_coroutine_threadsafe(self._play(spec, episodes, live, opening, report), self._loop)
                       for spec in self._workload.trajectories_for_step(step, prompts=prompts)]
            self._in_flight.update(futures)
        for f in futures:
            f.add_done_callback(self._in_flight.discard)
        return futures

    def generate(self, tasks: Tasks = None) -> list[Trajectory]:
        """One batch to its end: its trajectories in batch order (prompt-major); with
        partial_rollout, the step's workload.prompts first whole groups, in the order they were."""
        if self._partial is not None:
            return self._partial_step(tasks)
        return [f.result() for f in self.submit(tasks)]

    def _partial_step(self, tasks: Tasks) -> list[Trajectory]:
        live = self._up()
        if tasks is not None and tasks != self._partial.prompts:
            raise ValueError(f"tasks: a partial rollout's step trains workload.prompts ({self._partial.prompts}) "
                             "groups drawn from the pipeline (over-sampled ones included): give None")
        with self._lock:
            step, self._batches = self._batches, self._batches + 1
        return asyncio.run_coroutine_threadsafe(self._run_step(step, live), self._loop).result()

    async def _run_step(self, step: int, live: LiveSession) -> list[Trajectory]:
        vocab = live.runner.vocab_size if live.runner.needs_token_ids else 0
        trained: list[Trajectory] = []

        def on_done(result: TrajectoryResult) -> None:  # each trajectory once, when its fate is known
            live.rec.on_done(result)
            live.controller.trajectory_done(result)
            (trained if result.trained_step == step else self.dropped).append(trajectory_of(result, vocab))

        if self._steps is None:
            environment = driver_environment(self.cfg, live.client)
            self._steps = Steps(self._workload, live.runner, live.now,
                                Hooks(on_done, live.rec.on_turn, environment.episode if environment else None),
                                self._partial)
        self._steps.hooks = replace(self._steps.hooks, on_done=on_done)
        await live.controller.before_step(step)  # as between `prorsa run`'s steps
        self._steps.version = self._version
        await self._steps.run(step, last=False)
        return trained

    def stream(self, tasks: Tasks = None) -> Iterator[Trajectory]:
        """One batch, each trajectory as it finishes (in the order the loop saw them end, which
        as_completed would not keep for those that ended before it looked)."""
        self._whole_batches_only("stream")
        ended: queue.SimpleQueue = queue.SimpleQueue()
        futures = self._start(tasks, ended.put)
        for _ in futures:
            while True:
                try:
                    item = ended.get(timeout=0.5)
                    break
                except queue.Empty:  # one cancelled before it ran (close) never reports
                    if all(f.done() for f in futures) and ended.empty():
                        raise cf.CancelledError("the Rollout closed with this batch in flight") from None
            if isinstance(item, BaseException):
                raise item
            yield item

    @property
    def version(self) -> int:
        return self._version

    def update_weights(self, source: WeightSource) -> int:
        """Every engine reloads the new weights in place and drops its cached prefixes;
        trajectories started from now on carry the new version. Blocks until every engine has them."""
        live = self._up()
        with self._updating:  # one update at a time: versions are pushed in order
            version = self._version + 1
            base = backend_of(self.cfg.engines).model_dir()
            model_dir = model_dir_for(source, base, self.run_dir / "weights" / f"v{version}")
            push = push_weights(live.client, live.addresses)
            asyncio.run_coroutine_threadsafe(push(model_dir), self._loop).result()
            self._version = version
        return version

    def _up(self) -> LiveSession:
        if self._live is None or self._loop is None:
            raise RuntimeError("the Rollout is not running: use it as `with Rollout(...) as r:` or call start()")
        return self._live

    def _prompts(self, tasks: Tasks) -> tuple[int, list[Task] | None]:
        """-> the batch's prompt count, and its Task records when given."""
        given = list(tasks) if isinstance(tasks, Sequence) and not isinstance(tasks, str) else None
        if given is not None and not given:
            raise ValueError("tasks: the batch is empty")
        if given is not None and not all(isinstance(t, Task) for t in given):
            raise ValueError("tasks: expected Task records (prorsa.agent.datasets.Task)")
        if given is not None and self.cfg.environment is None:
            raise ValueError("tasks: Task records need the pipeline's environment: section (its tools and "
                             "reward); without one, give a count of prompts")
        prompts = len(given) if given is not None else tasks if tasks is not None else self.cfg.workload.prompts
        if not isinstance(prompts, int) or isinstance(prompts, bool) or prompts < 1:
            raise ValueError(f"tasks: expected Task records, a count >= 1 or None, got {tasks!r}")
        return prompts, given

    async def _play(self, spec: TrajectorySpec, episodes, live: LiveSession, opening: cf.Future | None,
                    report: Callable[[Any], None] | None) -> Trajectory:
        def on_done(result: TrajectoryResult) -> None:  # what `prorsa run` tells of each, less its journal
            live.rec.on_done(result)
            live.controller.trajectory_done(result)

        try:
            if opening is not None:
                await asyncio.wrap_future(opening)
            result = await play_spec(spec, live.runner, live.now, on_done, live.rec.on_turn, episodes,
                                     lambda: self._version)
            trajectory = trajectory_of(result, live.runner.vocab_size if live.runner.needs_token_ids else 0)
        except BaseException as e:
            if report is not None:
                report(e)
            raise
        if report is not None:
            report(trajectory)
        return trajectory


async def _cancel_all() -> None:
    """Trajectories still in flight when the Rollout closes: cancelled, so the loop can stop."""
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
