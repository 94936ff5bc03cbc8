"""Cluster files: the examples load, a bad file is one error line naming file and field (exit 2,
nothing started), and the job scripts dask-jobqueue renders ask for what each worker needs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import yaml
from click.testing import CliRunner

from prorsa.cli import main
from prorsa.cluster.jobs import job_scripts, run_jobs, sweep_job_options
from prorsa.cluster.security import make_security
from prorsa.config.cluster import JobSettings, cluster_option, load_cluster
from prorsa.config.load import ConfigError, load_pipeline
from prorsa.control.policy import make_policy

from .conftest import make_certs

REPO = Path(__file__).resolve().parents[2]
PIPELINE = """\
name: t
policy: static:2:1
engines: {backend: emulated, count: 3, slots: 16}
workload: {family: swe, prompts: 2, group_size: 2}
runtime: {tool_workers: 2, tool_threads: 8}
"""


def pipeline(tmp_path: Path, text: str = PIPELINE):
    path = tmp_path / "p.yaml"
    path.write_text(text)
    cfg = load_pipeline(path)
    return cfg, make_policy(cfg.policy).initial_roles(cfg.engines.count)


@pytest.mark.parametrize("name, kind", [("local", "local"), ("slurm", "slurm"), ("pbs", "pbs"),
                                        ("scheduler", "address")])
def test_the_example_files_load(name, kind):
    assert load_cluster(REPO / "cluster" / f"{name}.yaml").kind == kind


def test_the_tls_example_loads_with_its_certificates(tmp_path):
    shutil.copy(REPO / "cluster" / "slurm-tls.yaml", tmp_path)
    make_certs(tmp_path / "certs", name="node")
    spec = load_cluster(tmp_path / "slurm-tls.yaml")
    assert spec.tls.ca_file == str(tmp_path / "certs" / "ca.pem")
    sec = make_security(spec.tls)
    assert sec.require_encryption and sec.tls_worker_cert == str(tmp_path / "certs" / "node.pem")


@pytest.mark.parametrize("text, expected", [
    ("kind: kubernetes\n", "kind: got 'kubernetes'; expected one of ['local', 'slurm', 'pbs', 'address']"),
    ("kind: slurm\nengines: {gpus: -1}\n", "engines.gpus: got -1; expected: Input should be greater than or equal"),
    ("kind: slurm\nengines: {cpu: 8}\n", "engines.cpu: unknown field"),
    ("kind: slurm\ntools: {memory: lots}\n", "tools.memory: got 'lots'; expected: a size such as 16GB"),
    ("kind: pbs\nresource_spec: 'select=1:ncpus={cores}'\n", "resource_spec: got 'select=1:ncpus={cores}'; "
                                                             "expected: unknown placeholder 'cores'"),
    ("kind: local\ntls: {ca_file: nowhere.pem, cert: c.pem}\n", "tls.ca_file: got "),
    ("kind: address\naddress: host:8786\n", "address: got 'host:8786'"),
    ("kind: slurm\nscheduler: {port: 99999}\n", "scheduler.port: got 99999"),
    ("kind: slurm\ngpu_directive: '--gpus={n}'\n",
     "gpu_directive: got '--gpus={n}'; expected: unknown placeholder 'n'"),
])
def test_a_bad_cluster_file_is_one_error_line_and_exit_2(tmp_path, text, expected):
    spec = tmp_path / "c.yaml"
    spec.write_text(text)
    (tmp_path / "p.yaml").write_text(PIPELINE)
    out = tmp_path / "runs"
    result = CliRunner().invoke(main, ["run", str(tmp_path / "p.yaml"), "--cluster", str(spec), f"output_dir={out}"])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {spec}: {expected}"), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert not out.exists()  # refused before anything ran


def test_the_sweep_command_checks_the_cluster_file_too(tmp_path):
    spec = tmp_path / "c.yaml"
    spec.write_text("kind: slurm\nsweep: {jobs: 0}\n")
    result = CliRunner().invoke(main, ["sweep", str(tmp_path / "s.yaml"), "--cluster", str(spec)])
    assert result.exit_code == 2 and result.stderr.startswith(f"error: {spec}: sweep.jobs: got 0")


def test_an_address_is_a_running_scheduler():
    assert cluster_option("tcp://10.0.0.5:8786").address == "tcp://10.0.0.5:8786"
    assert cluster_option("10.0.0.5:8786").address == "tcp://10.0.0.5:8786"
    with pytest.raises(ConfigError, match="no such file"):
        cluster_option("missing.yaml")


def batch_spec(tmp_path: Path, kind: str, extra: str = "") -> object:
    path = tmp_path / f"{kind}.yaml"
    directive = "--exclusive" if kind == "slurm" else "-V"
    path.write_text(f"""\
kind: {kind}
jobs: {{walltime: "03:00:00", account: rl, prologue: [module load cuda], directives: [{directive}]}}
engines: {{gpus: 2, cpus: 8, memory: 64GiB, queue: gpu}}
tools: {{cpus: 4, memory: 16GiB, queue: cpu}}
sweep: {{jobs: 3, cpus: 6, memory: 12GiB}}
{extra}""")
    return load_cluster(path)


def test_slurm_scripts_ask_for_gpus_and_start_each_worker_in_its_role(tmp_path):
    cfg, roles = pipeline(tmp_path)
    spec = batch_spec(tmp_path, "slurm")
    scripts = job_scripts(spec, run_jobs(spec, cfg, roles), "tcp://10.1.2.3:8786")
    assert list(scripts) == ["engine-0", "engine-1", "engine-2", "tools-0", "tools-1"]
    for name in ("engine-0", "engine-1", "engine-2"):
        s = scripts[name]
        assert "#SBATCH --gres=gpu:2" in s and "#SBATCH -p gpu" in s and "#SBATCH --cpus-per-task=8" in s
        assert "#SBATCH --mem=64G" in s and "#SBATCH -t 03:00:00" in s and "#SBATCH -A rl" in s
        assert "#SBATCH --exclusive" in s and f"#SBATCH -J prorsa-{name}" in s
        assert "\nmodule load cuda\n" in s
        assert f"dask_worker tcp://10.1.2.3:8786 --name {name} --nthreads 16 " in s and "--nanny" in s
    assert "--resources prefill=16,decode=0,env=0" in scripts["engine-0"]
    assert "--resources prefill=16,decode=0,env=0" in scripts["engine-1"]
    assert "--resources prefill=0,decode=16,env=0" in scripts["engine-2"]
    for name in ("tools-0", "tools-1"):
        s = scripts[name]
        assert "gpu" not in s.replace("--gres", "") and "--gres" not in s
        assert "#SBATCH -p cpu" in s and "#SBATCH --cpus-per-task=4" in s and "#SBATCH --mem=16G" in s
        assert f"--name {name} --nthreads 8 " in s and "--resources prefill=0,decode=0,env=8" in s


def test_pbs_scripts_ask_for_gpus_in_the_select_statement(tmp_path):
    cfg, roles = pipeline(tmp_path)
    spec = batch_spec(tmp_path, "pbs")
    scripts = job_scripts(spec, run_jobs(spec, cfg, roles), "tcp://10.1.2.3:8786")
    assert "#PBS -l select=1:ncpus=8:ngpus=2:mem=64GB" in scripts["engine-2"]
    assert "#PBS -q gpu" in scripts["engine-2"] and "#PBS -A rl" in scripts["engine-2"]
    assert "#PBS -l walltime=03:00:00" in scripts["engine-2"] and "#PBS -V" in scripts["engine-2"]
    assert "--resources prefill=0,decode=16,env=0" in scripts["engine-2"]
    assert "#PBS -l select=1:ncpus=4:mem=16GB" in scripts["tools-0"]  # no ngpus part without GPUs
    assert "--resources prefill=0,decode=0,env=8" in scripts["tools-0"]


def test_gpus_default_to_the_engines_tensor_parallel_size_on_cuda(tmp_path):
    text = PIPELINE.replace("backend: emulated", "backend: vllm, vllm: {device: cuda, tensor_parallel_size: 4}")
    cfg, roles = pipeline(tmp_path, text)
    spec = batch_spec(tmp_path, "slurm").model_copy(update={"engines": JobSettings()})
    scripts = job_scripts(spec, run_jobs(spec, cfg, roles), "tcp://h:1")
    assert "#SBATCH --gres=gpu:4" in scripts["engine-0"] and "--gres" not in scripts["tools-0"]
    emulated, roles = pipeline(tmp_path)
    assert "--gres" not in job_scripts(spec, run_jobs(spec, emulated, roles), "tcp://h:1")["engine-0"]


def test_sweep_jobs_are_single_threaded_worker_processes(tmp_path):
    spec = batch_spec(tmp_path, "slurm", 'gpu_directive: "--gpus-per-task={gpus}"')
    script = job_scripts(spec, {"prorsa-sweep-0": sweep_job_options(spec)}, "tcp://h:1")["prorsa-sweep-0"]
    assert "--nthreads 1 " in script and "--nworkers 6 " in script and "#SBATCH --cpus-per-task=6" in script
    assert "--resources" not in script and "gpu" not in script


def test_tls_puts_the_certificates_on_every_workers_command_line(tmp_path):
    certs = make_certs(tmp_path / "certs")
    spec = batch_spec(tmp_path, "slurm",
                      "tls: {ca_file: certs/ca.pem, cert: certs/prorsa.pem, key: certs/prorsa-key.pem}")
    cfg, roles = pipeline(tmp_path)
    scripts = job_scripts(spec, run_jobs(spec, cfg, roles), "tls://10.1.2.3:8786", make_security(spec.tls))
    for s in scripts.values():
        assert "dask_worker tls://10.1.2.3:8786" in s and "--protocol tls://" in s
        assert f"--tls-ca-file {certs['ca_file']}" in s and f"--tls-cert {certs['cert']}" in s
        assert f"--tls-key {certs['key']}" in s


def test_validate_checks_cluster_files(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: slurm\nengines: {gpus: many}\n")
    result = CliRunner().invoke(main, ["validate", str(REPO / "cluster" / "slurm.yaml"), str(bad)])
    assert result.exit_code == 2
    assert result.stdout == f"ok: {REPO / 'cluster' / 'slurm.yaml'} (cluster slurm)\n"
    assert result.stderr.startswith(f"error: {bad}: engines.gpus: got 'many'") and result.stderr.count("\n") == 1


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True),
                     st.text(max_size=20), st.sampled_from(["8GB", "{gpus}", "{x}", "tcp://h:1", "ca.pem", "\0"]))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=8), inner, max_size=3), max_leaves=6)
_sections = ["scheduler", "jobs", "engines", "tools", "sweep", "tls", "host", "workers", "address", "python",
             "start_timeout_s", "gpu_directive", "resource_spec", "log_directory", "death_timeout_s"]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kind=st.one_of(st.sampled_from(["local", "slurm", "pbs", "address"]), _values),
       fields=st.dictionaries(st.sampled_from(_sections + ["cpus", "gpus", "memory"]), _values, max_size=4))
def test_any_cluster_file_is_ok_or_one_error_line(tmp_path, kind, fields):
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump({"kind": kind, **fields}, allow_unicode=True))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    out = result.output
    assert "Traceback" not in out and out.count("\n") == 1, out
    if result.exit_code:
        assert result.exit_code == 2 and out.startswith(f"error: {path}: "), out
    else:
        assert out.startswith(f"ok: {path} (cluster "), out


def test_engine_jobs_get_absolute_model_paths(tmp_path, monkeypatch):
    """A batch job may start elsewhere (PBS: in $HOME): what the engine plugin carries must not
    depend on the directory prorsa was started in."""
    from prorsa.engine.registry import backend_of

    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    text = PIPELINE.replace("backend: emulated", "backend: vllm, vllm: {model: models/m, device: cuda}")
    cfg, _ = pipeline(tmp_path, text)
    engines = backend_of(cfg.engines).portable()
    assert engines.vllm.model == str(tmp_path / "models" / "m") and Path(engines.vllm.cache_dir).is_absolute()
    assert engines.backend == "vllm" and engines.vllm.device == "cuda"
