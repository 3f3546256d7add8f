"""The Prefect UI's pictures on Getting started and Operations, taken from a real run: a Prefect
server on a free port of 127.0.0.1, `pforge serve` registering the config's deployments on it,
`pforge run configs/tiny.yaml` reporting to it, then a headless Chromium (docs/browser.py) on the
UI's pages.

    .venv/bin/python docs/screenshots.py [--config configs/tiny.yaml] [--out docs/assets/images]

Writes prefect-runs.png (the flow runs), prefect-flow-run.png (the run: its task runs, one per
stage), prefect-artifacts.png (the artifacts the stages published), prefect-deployments.png (the
deployments `pforge serve` registered: the pipeline, one per stage, the corpus refresh),
prefect-run-form.png (the pipeline deployment's Run form: its typed parameters) and
prefect-report.png (the evaluation's report artifact). Needs a Chromium (`apt-get install
chromium-headless-shell`); a few minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT / "docs"))
from browser import Browser, find_chromium  # noqa: E402
from flows.processes import free_port, start_prefect_server, stop_session  # noqa: E402
from tasks.config import load_config  # noqa: E402

BIN = Path(sys.executable).parent
SETTLE_S = 4.0   # the UI's own requests after the page's load event
STILL_S = 2.0    # then a picture is taken once two captures this far apart are the same (or after STILL_WITHIN_S)
STILL_WITHIN_S = 90.0
STOP_GRACE_S = 30.0
PAGES = {   # file name: (path under the UI, text the page shows once its data has arrived,
            #             an API path it must have fetched too: what it draws on a canvas, which has no text)
    "prefect-runs.png": ("/runs", "passage-forge", None),
    "prefect-flow-run.png": ("/runs/flow-run/{flow_run}", "evaluate", "/graph-v2"),
    "prefect-artifacts.png": ("/artifacts", "summary", None),
    "prefect-deployments.png": ("/deployments", "{name}--corpus-refresh", None),
    "prefect-run-form.png": ("/deployments/deployment/{deployment}/run", "Parameters", None),
    "prefect-report.png": ("/artifacts/artifact/{report}", "Split:", None),
}


def start_serving(config: Path, root: Path, env: dict, log: Path) -> subprocess.Popen:
    """`pforge serve CONFIG` in its own session (stopping it stops the runs it started): it registers
    the deployments on the server of PREFECT_API_URL, then serves them until stopped."""
    return subprocess.Popen([str(BIN / "pforge"), "--root", str(root), "serve", str(config)], cwd=PROJECT_ROOT,
                            env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def api(port: int, path: str, body: dict) -> list[dict]:
    response = httpx.post(f"http://127.0.0.1:{port}/api{path}", json=body, timeout=30)
    response.raise_for_status()
    return response.json()


def wait_for_deployments(port: int, name: str, serving: subprocess.Popen, log: Path) -> dict[str, dict]:
    """The deployments once `pforge serve` has registered them all (NAME--corpus-refresh is the last)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        deployments = {d["name"]: d for d in api(port, "/deployments/filter", {})}
        if f"{name}--corpus-refresh" in deployments:
            return deployments
        if serving.poll() is not None:
            break
        time.sleep(1)
    raise RuntimeError(f"pforge serve did not register the deployments: {log.read_text(errors='replace')[-2000:]}")


def page_ids(port: int, name: str, deployments: dict[str, dict]) -> dict[str, str]:
    """What PAGES' paths name: the latest flow run, the pipeline's deployment, the evaluation's report."""
    flow_run = api(port, "/flow_runs/filter", {"sort": "START_TIME_DESC", "limit": 1})[0]["id"]
    report = api(port, "/artifacts/filter", {"artifacts": {"key": {"any_": [f"{name}-evaluation"]}},
                                             "sort": "CREATED_DESC", "limit": 1})[0]["id"]
    return {"name": name, "flow_run": flow_run, "deployment": deployments[name]["id"], "report": report}


def still(page: Browser) -> bytes:
    """What the page shows once it stops changing (a graph's animation, a late request)."""
    time.sleep(SETTLE_S)
    last, deadline = page.capture(), time.monotonic() + STILL_WITHIN_S
    while time.monotonic() < deadline:
        time.sleep(STILL_S)
        now = page.capture()
        if now == last:
            break
        last = now
    return last


def shoot(port: int, out: Path, chromium: str, ids: dict[str, str]) -> list[Path]:
    written = []
    with Browser(chromium, width=1400, height=900) as page:
        for name, (path, shows, fetched) in PAGES.items():
            shows = shows.format(**ids)
            page.open(f"http://127.0.0.1:{port}{path.format(**ids)}")
            if not page.wait_for(f"document.body.innerText.includes({shows!r})", timeout_s=60):
                raise RuntimeError(f"{path}: the UI did not show {shows!r}")
            if fetched and not page.wait_for("performance.getEntriesByType('resource')"
                                             f".some(entry => entry.name.includes({fetched!r}))", timeout_s=60):
                raise RuntimeError(f"{path}: the UI did not fetch {fetched!r}")
            written.append(page.screenshot(out / name, still(page)))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=PROJECT_ROOT / "configs" / "tiny.yaml")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "docs" / "assets" / "images")
    args = parser.parse_args(argv)
    chromium = find_chromium()
    if chromium is None:
        sys.exit("screenshots: no Chromium (apt-get install --no-install-recommends chromium-headless-shell)")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="pforge-screenshots-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "PREFECT_HOME": str(work / "prefect-home"), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
               "PREFECT_UI_API_URL": f"http://127.0.0.1:{port}/api", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               "HF_HUB_OFFLINE": "1"}
        config = args.config.resolve()
        name = load_config(config).name
        server = start_prefect_server(port, env, work / "server.log")
        started = [server]
        try:
            serving = start_serving(config, work / "root", env, work / "serve.log")
            started.append(serving)
            run = subprocess.run([str(BIN / "pforge"), "--root", str(work / "root"), "run", str(config)],
                                 cwd=PROJECT_ROOT, env=env, capture_output=True, text=True)
            if run.returncode != 0:
                sys.exit(f"screenshots: pforge run exited {run.returncode}:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
            deployments = wait_for_deployments(port, name, serving, work / "serve.log")
            for path in shoot(port, args.out, chromium, page_ids(port, name, deployments)):
                print(f"wrote {path.relative_to(PROJECT_ROOT) if path.is_relative_to(PROJECT_ROOT) else path}")
        finally:
            for process in reversed(started):   # pforge serve first, then the server it talks to
                stop_session(process, STOP_GRACE_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
