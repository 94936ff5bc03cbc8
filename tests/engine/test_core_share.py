"""vLLM CPU engines on one small host slow each other only while they compute at the same time:
pinned engines take turns on a shared core, and sequences in flight load the rest of the host."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from prorsa.config.load import load_pipeline
from prorsa.costmodel import CostModel, load_gpu
from prorsa.costmodel.live_fit import LiveFit
from prorsa.engine.base import DecodeRequest
from prorsa.engine.core_share import CoreShare
from prorsa.engine.emulated import EmulatedEngine
from prorsa.roles import Role
from prorsa.sim.clock import run_virtual
from prorsa.sim.run import host_cores

ENGINES = ["e0", "e1", "e2"]


@pytest.fixture(scope="module")
def cost() -> CostModel:
    return CostModel.from_names("cpu", "tiny")


def test_engines_wrap_around_the_cores_as_the_live_runtime_pins_them():
    share = CoreShare.pinned(ENGINES, per_engine=1, n_cores=2)
    assert share.cores == {"e0": {0}, "e1": {1}, "e2": {0}}
    assert share.slowdown("e0") == 1.0
    with share.busy("e2") as factor:
        assert factor == 1.0
        assert share.slowdown("e0") == 2.0 and share.slowdown("e1") == 1.0
        with share.busy("e1"):
            assert share.slowdown("e0") == 2.0
    assert share.slowdown("e0") == 1.0


def test_a_wide_engine_waits_for_its_most_crowded_core():
    share = CoreShare.pinned(ENGINES, per_engine=2, n_cores=3)  # {0,1} {2,0} {1,2}
    with share.busy("e1"), share.busy("e2"):
        assert share.slowdown("e0") == 2.0  # cores 0 and 1 each have one neighbour


def test_sequences_in_flight_load_the_host_beyond_its_cores():
    share = CoreShare.pinned(ENGINES, per_engine=0, n_cores=2, load=0.25)  # unpinned: the host alone
    assert share.slowdown("e0", sequences=1) == 1.0  # 1 + 0.25 cores wanted of 2
    with share.busy("e2", sequences=12):
        assert share.slowdown("e0", sequences=4) == pytest.approx((2 + 0.25 * 16) / 2)
    assert share.slowdown("e0", sequences=4) == 1.0


def _alone_and_together(cost: CostModel, cores: CoreShare | None) -> tuple[float, float, float]:
    """Seconds for one long generation on e0 alone, then on e0 and e2 at once, and e1 meanwhile."""
    async def generate(engine: EmulatedEngine) -> float:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await engine.generate(DecodeRequest(engine.engine_id, 0, context_tokens=512, max_tokens=400, new_tokens=512))
        return loop.time() - t0

    async def main():
        engines = [EmulatedEngine(e, Role.MIXED, cost, slots=4, cores=cores) for e in ENGINES]
        for e in engines:
            await e.start()
        alone = await generate(engines[0])
        both = await asyncio.gather(*(generate(e) for e in engines))
        for e in engines:
            await e.stop()
        return alone, max(both[0], both[2]), both[1]

    return run_virtual(main())


def test_engines_sharing_a_core_slow_each_other_only_while_both_compute(cost):
    alone, together, neighbourless = _alone_and_together(cost, CoreShare.pinned(ENGINES, 1, 2))
    assert 1.85 < together / alone <= 2.0 + 1e-9
    assert neighbourless == pytest.approx(alone)
    unshared = _alone_and_together(cost, None)
    assert unshared[1] == pytest.approx(unshared[0]) and unshared[0] == pytest.approx(alone)


def test_the_simulator_puts_vllm_cpu_engines_on_the_profiles_host(tmp_path):
    cfg = load_pipeline("pipelines/quickstart.yaml")  # 3 engines, one core each, a 2-core profile
    names = ["engine-0", "engine-1", "engine-2"]
    share = host_cores(cfg, names)
    assert share.cores == {"engine-0": {0}, "engine-1": {1}, "engine-2": {0}} and share.n_cores == 2
    assert share.load == load_gpu("cpu").host_load_per_sequence
    loaded = tmp_path / "cpu-loaded.yaml"
    loaded.write_text(LiveFit(dataclasses.replace(load_gpu("cpu"), host_load_per_sequence=0.4), 1, 0, 0).profile_yaml())
    with_load = cfg.model_copy(update={"engines": cfg.engines.model_copy(update={"gpu": str(loaded)})})
    assert host_cores(with_load, names).load == 0.4
    emulated = cfg.model_copy(update={"engines": cfg.engines.model_copy(update={"backend": "emulated"})})
    assert host_cores(emulated, names) is None
