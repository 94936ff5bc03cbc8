"""`prorsa report --format/--dpi` on a `prorsa sim --output` folder, and a sweep's panels per workload."""

import re

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner

from prorsa.cli import main
from tests.sim_output import sim_output

matplotlib_image = pytest.importorskip("matplotlib.image")

PIPELINE = ("name: figs\nengines: {backend: emulated, count: 2, slots: 8}\npolicy: static:1:1\n"
            "workload: {family: swe, prompts: 2, group_size: 2, max_turns: 3}\n")
FIGURES = ("comparison", "completion", "latency", "colocated-roles", "colocated-demand", "prorsa-roles",
           "prorsa-demand")
MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "pdf": b"%PDF-", "svg": b"<?xml"}


@pytest.fixture(scope="module")
def sim_dir(tmp_path_factory):
    return sim_output(tmp_path_factory.mktemp("sim"), PIPELINE, "colocated,prorsa")


def report(*args: str) -> str:
    res = CliRunner().invoke(main, ["report", *args])
    assert res.exit_code == 0, res.output
    return res.output


def test_every_figure_is_written_in_each_format_and_linked_in_the_chosen_one(sim_dir, tmp_path):
    # one non-default format: every report writes all three, so a second (pdf) wrote the same files
    # again and only its links differed; the default's (png) links are checked below
    report(str(sim_dir), "--format", "svg", "--output", str(tmp_path))
    for stem in FIGURES:
        for each in MAGIC:
            assert (tmp_path / f"{stem}.{each}").read_bytes().startswith(MAGIC[each]), (stem, each)
    md = (tmp_path / "report.md").read_text()
    links = re.findall(r"!\[[^]]*\]\(([^)]+)\)", md)
    assert sorted(links) == sorted(f"{s}.svg" for s in FIGURES)
    svg = (tmp_path / "prorsa-roles.svg").read_text()
    assert "<!-- Engine roles over time: prorsa -->" in svg  # matplotlib keeps each text as a comment
    assert "figs-" not in svg  # no run folder timestamp in a title


def test_png_resolution_follows_dpi(sim_dir, tmp_path):
    report(str(sim_dir), "--dpi", "50", "--output", str(tmp_path / "lo"))  # the least it takes: rendering is the cost
    report(str(sim_dir), "--dpi", "150", "--output", str(tmp_path / "hi"))
    links = re.findall(r"!\[[^]]*\]\(([^)]+)\)", (tmp_path / "lo" / "report.md").read_text())
    assert sorted(links) == sorted(f"{s}.png" for s in FIGURES)  # no --format: png linked
    lo = matplotlib_image.imread(tmp_path / "lo" / "latency.png").shape
    hi = matplotlib_image.imread(tmp_path / "hi" / "latency.png").shape
    assert hi[1] == pytest.approx(3 * lo[1], rel=0.05) and hi[0] == pytest.approx(3 * lo[0], rel=0.05)
    res = CliRunner().invoke(main, ["report", str(sim_dir), "--format", "gif"])
    assert res.exit_code == 2 and "--format" in res.output and "Traceback" not in res.output


def test_a_sweep_gets_a_panel_per_workload_never_a_mean_across_them(tmp_path):
    sweep = tmp_path / "sweep.nc"
    makespan = np.array([[[10.0, 12.0], [100.0, 110.0]], [[8.0, 9.0], [60.0, 70.0]]])  # policy x workload x seed
    xr.Dataset({"makespan_s": (("policy", "workload", "seed"), makespan),
                "trajectories_per_s": (("policy", "workload", "seed"), 1 / makespan)},
               coords={"policy": ["colocated", "prorsa"], "workload": ["search", "swe"], "seed": [0, 1]},
               attrs={"name": "grid", "clock": "body seconds"}).to_netcdf(sweep, engine="netcdf4")
    report(str(sweep), "--output", str(tmp_path / "r"))
    md = (tmp_path / "r" / "report.md").read_text()
    panels = re.findall(r"^sweep grid: workload (\w+) \(mean over seed; whiskers min-max\):$", md, re.M)
    assert panels == ["search", "swe"]
    swe = md.split("sweep grid: workload swe", 1)[1]
    assert "| colocated | 105 |" in swe and "| prorsa | 65 |" in swe
    assert "| colocated | 11 |" in md.split("sweep grid: workload swe", 1)[0]
    assert "57.5" not in md and "58" not in md  # the across-workload mean of colocated's makespans
    assert matplotlib_image.imread(tmp_path / "r" / "comparison.png").shape[0] > 2 * 150 * 3  # two rows of panels
