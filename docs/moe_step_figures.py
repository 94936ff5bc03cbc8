"""Regenerate the docs' picture of one run: dashboard screenshots while pipelines/moe-step.yaml runs
(emulated MoE engines at half real time, about a minute and a half here), then `prorsa report` of it.

    python docs/moe_step_figures.py [--out docs/moe-step] [--shots 3] [--chromium PATH]

Writes OUT/dashboard-<k>.png (the Prorsa page, k-th look), OUT/report/ (report.md and its figures)
and OUT/README.md (the command, the commit and when). Needs chromium for the screenshots (without
it, only the report) and matplotlib for the report.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from prorsa.devtools.browser import Chromium

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "pipelines" / "moe-step.yaml"
RUN_S = 80  # wall seconds the step took here at time scale 0.5 (its simulated makespan: ~120 body s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "moe-step")
    ap.add_argument("--shots", type=int, default=3)
    ap.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="moe-step-") as tmp:
        run = subprocess.Popen([sys.executable, "-m", "prorsa.cli", "run", str(PIPELINE), "--output", tmp],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
        page = _page_url(run)
        rest: list[str] = []
        threading.Thread(target=lambda: rest.extend(run.stdout), daemon=True).start()  # the pipe never fills
        shots = _screenshots(args.chromium, page, args.out, args.shots) if args.chromium and page else []
        if run.wait(timeout=600) != 0:
            sys.exit("error: prorsa run failed:\n" + "".join(rest)[-2000:])
        (run_dir,) = Path(tmp).iterdir()
        shutil.rmtree(args.out / "report", ignore_errors=True)
        subprocess.run([sys.executable, "-m", "prorsa.cli", "report", str(run_dir), "--output",
                        str(args.out / "report"), "--dpi", "110"], check=True, cwd=ROOT)
    _provenance(args.out, shots)
    print(f"wrote {args.out}: {len(shots)} screenshots and report/report.md")


def _page_url(run: subprocess.Popen) -> str | None:
    """The Prorsa page's address, from the line the run prints at start."""
    for line in run.stdout:
        if line.startswith("prorsa page:"):
            return line.split()[2]
    return None


def _screenshots(binary: str, page: str, out: Path, n: int) -> list[Path]:
    """n looks at the page, spread over the run, once its Bokeh document has drawn some points."""
    browser = Chromium(binary)
    try:
        browser.call("Page.enable")
        browser.call("Page.navigate", url=page)
        browser.wait_for("typeof Bokeh !== 'undefined' && Bokeh.documents.length > 0 && (() => {"
                         "const m = Bokeh.documents[0].get_model_by_name('prorsa-demand-prefill');"
                         "return m !== null && m.renderers[0].data_source.data.t.length >= 3; })()", timeout=120)
        shots = []
        for k in range(1, n + 1):
            time.sleep(RUN_S / (n + 1))
            path = out / f"dashboard-{k}.png"
            path.write_bytes(browser.screenshot())
            shots.append(path)
        return shots
    finally:
        browser.close()


def _provenance(out: Path, shots: list[Path]) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["# One moe-step run, as a user sees it", "",
             f"Written by `python docs/moe_step_figures.py` at commit {commit or '?'}, {stamp}: "
             "`prorsa run pipelines/moe-step.yaml` with its dashboard open, then `prorsa report`.", ""]
    lines += [f"![dashboard, look {k}]({p.name})" for k, p in enumerate(shots, 1)]
    lines += ["", "The report: [report/report.md](report/report.md).", ""]
    (out / "README.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
