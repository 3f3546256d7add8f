"""The Prefect UI's pictures on Getting started, taken from a real run: a Prefect server on a free
port of 127.0.0.1, `pforge run configs/tiny.yaml` reporting to it, then a headless Chromium
(docs/browser.py) on the UI's pages.

    .venv/bin/python docs/screenshots.py [--config configs/tiny.yaml] [--out docs/assets/images]

Writes prefect-runs.png (the flow runs), prefect-flow-run.png (the run: its task runs, one per
stage) and prefect-artifacts.png (the artifacts the stages published). Needs a Chromium
(`apt-get install chromium-headless-shell`); about a minute on 2 cores.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT / "docs"))
from browser import Browser, find_chromium  # noqa: E402

BIN = Path(sys.executable).parent
SETTLE_S = 4.0   # the UI's own requests after the page's load event
PAGES = {   # file name: (path under the UI, text the page shows once its data has arrived)
    "prefect-runs.png": ("/runs", "passage-forge"),
    "prefect-flow-run.png": ("/runs/flow-run/{flow_run}", "evaluate"),
    "prefect-artifacts.png": ("/artifacts", "summary"),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int, env: dict, log: Path) -> subprocess.Popen:
    server = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 600   # minutes on a loaded machine: it migrates a new database
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=5).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if server.poll() is not None:
            break
        time.sleep(0.5)
    server.kill()
    raise RuntimeError(f"the Prefect server did not start: {log.read_text(errors='replace')[-2000:]}")


def latest_flow_run(port: int) -> str:
    response = httpx.post(f"http://127.0.0.1:{port}/api/flow_runs/filter", json={"sort": "START_TIME_DESC", "limit": 1})
    response.raise_for_status()
    return response.json()[0]["id"]


def shoot(port: int, out: Path, chromium: str) -> list[Path]:
    flow_run = latest_flow_run(port)
    written = []
    with Browser(chromium, width=1400, height=900) as page:
        for name, (path, shows) in PAGES.items():
            page.open(f"http://127.0.0.1:{port}{path.format(flow_run=flow_run)}")
            if not page.wait_for(f"document.body.innerText.includes({shows!r})", timeout_s=60):
                raise RuntimeError(f"{path}: the UI did not show {shows!r}")
            time.sleep(SETTLE_S)
            written.append(page.screenshot(out / name))
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
        server = start_server(port, env, work / "server.log")
        try:
            run = subprocess.run([str(BIN / "pforge"), "--root", str(work / "root"), "run", str(args.config.resolve())],
                                 cwd=PROJECT_ROOT, env=env, capture_output=True, text=True)
            if run.returncode != 0:
                sys.exit(f"screenshots: pforge run exited {run.returncode}:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
            for path in shoot(port, args.out, chromium):
                print(f"wrote {path.relative_to(PROJECT_ROOT) if path.is_relative_to(PROJECT_ROOT) else path}")
        finally:
            os.killpg(server.pid, 15)
            server.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
