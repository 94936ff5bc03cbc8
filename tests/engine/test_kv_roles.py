"""Which KV connector role an engine starts with, and the path a role switch takes: detected from
the installed vLLM's own config source, shown in the launch plan, refused in one line where the
pipeline asks for what vLLM no longer has."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from prorsa.cli import main
from prorsa.cluster.launch_plan import launch_plan
from prorsa.config.load import load_pipeline
from prorsa.engine.vllm import kv_roles
from prorsa.engine.vllm.command import ServerSpec, build_command
from prorsa.engine.vllm.kv_roles import accepts_kv_both, kv_role, switch_path
from prorsa.config.engines import VllmSettings
from prorsa.roles import Role, restarts_kv

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = str(REPO / "pipelines" / "quickstart.yaml")

# vllm/config/kv_transfer.py's shape (0.32): the role literal made of the two sides' literals
WITH_BOTH = '''KVProducer = Literal["kv_producer", "kv_both"]
KVConsumer = Literal["kv_consumer", "kv_both"]
KVRole = Literal[KVProducer, KVConsumer]
'''
WITHOUT_BOTH = '''KVProducer = Literal["kv_producer"]
KVConsumer = Literal["kv_consumer"]
KVRole = Literal[KVProducer, KVConsumer]
'''


@pytest.fixture
def vllm_source(tmp_path):
    def write(text: str) -> Path:
        path = tmp_path / "kv_transfer.py"
        path.write_text(text)
        return path
    return write


def test_kv_both_is_read_off_the_role_literal_through_its_aliases(vllm_source):
    assert accepts_kv_both(vllm_source(WITH_BOTH))
    assert not accepts_kv_both(vllm_source(WITHOUT_BOTH))
    assert not accepts_kv_both(vllm_source("KVRole = str\n"))  # another shape: take the safe path


@pytest.mark.skipif(kv_roles._config_source() is None, reason="vLLM not installed")
def test_the_installed_vllm_is_read_as_its_own_parser_reads_it():
    from typing import get_args

    import vllm.config.kv_transfer as kv

    assert accepts_kv_both() == ("kv_both" in get_args(kv.KVRole))


def test_auto_keeps_kv_both_while_vllm_has_it_and_restarts_once_it_is_gone(vllm_source):
    with_both = vllm_source(WITH_BOTH)
    assert switch_path("auto", with_both) == "in_place"
    assert switch_path("restart", with_both) == "restart"
    without = vllm_source(WITHOUT_BOTH)
    assert switch_path("auto", without) == "restart"
    with pytest.raises(ValueError, match="engines.role_switch: in_place needs kv_role kv_both"):
        switch_path("in_place", without)


def test_without_vllm_auto_keeps_the_prices_as_they_were(monkeypatch):
    """A vLLM pipeline simulated where vLLM is not installed: nothing to detect, no engine starts."""
    monkeypatch.setattr(kv_roles, "_config_source", lambda: None)
    assert switch_path("auto") == switch_path("in_place") == "in_place"
    assert switch_path("restart") == "restart"


def test_prefill_exports_kv_and_decode_and_mixed_pull_it():
    assert [kv_role(r, "restart") for r in (Role.PREFILL, Role.DECODE, Role.MIXED)] == \
        ["kv_producer", "kv_consumer", "kv_consumer"]
    assert {kv_role(r, "in_place") for r in Role} == {"kv_both"}
    # only a switch across the producer/consumer line restarts
    assert restarts_kv(Role.PREFILL, Role.DECODE) and restarts_kv(Role.MIXED, Role.PREFILL)
    assert not restarts_kv(Role.DECODE, Role.MIXED) and not restarts_kv(Role.PREFILL, Role.PREFILL)


def test_the_server_is_launched_with_its_specs_kv_role():
    spec = ServerSpec.from_settings(VllmSettings(), Path("/m"), [0], kv_role="kv_consumer")
    cmd = build_command(spec, port=1)
    kv = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])
    assert kv["kv_role"] == "kv_consumer" and kv["kv_connector"] == "NixlConnector"


def test_the_plan_starts_each_engine_as_its_side_and_says_how_roles_switch():
    cfg = load_pipeline(QUICKSTART, {"engines.role_switch": "restart", "engines.count": 3})
    plans = launch_plan(cfg.engines, [Role.PREFILL, Role.DECODE, Role.MIXED], environ={})
    sides = [json.loads(p.command[p.command.index("--kv-transfer-config") + 1])["kv_role"] for p in plans]
    assert sides == ["kv_producer", "kv_consumer", "kv_consumer"]
    assert plans[0].switch.startswith("role switch: restart")


def test_dry_run_prints_the_switch_path(tmp_path):
    r = CliRunner().invoke(main, ["run", QUICKSTART, "--dry-run", f"output_dir={tmp_path}",
                                  "engines.role_switch=restart", "policy=static:1:2"])
    assert r.exit_code == 0, r.output
    assert "role switch: restart" in r.output and '"kv_role": "kv_producer"' in r.output


def test_in_place_on_a_vllm_without_kv_both_is_one_line_exit_2(tmp_path, vllm_source, monkeypatch):
    source = vllm_source(WITHOUT_BOTH)
    monkeypatch.setattr(kv_roles, "_config_source", lambda: source)
    r = CliRunner().invoke(main, ["validate", QUICKSTART, "engines.role_switch=in_place"])
    assert r.exit_code == 2, r.output
    assert "engines.role_switch: in_place needs kv_role kv_both" in r.output and "Traceback" not in r.output
