"""Register the pipeline and each of its stages as deployments on a Prefect server."""
from __future__ import annotations

import time
from pathlib import Path

import httpx
from prefect import serve

from flows.pipeline import pipeline
from flows.refresh import corpus_refresh
from flows.registry import plan_for
from storage import resolve_root
from tasks.config import load_config


def build_deployments(config_paths: list[Path], root: str | None = None, cron: str | None = None) -> list:
    """One deployment for the whole pipeline per config (optionally on a cron), one per stage, and
    NAME--corpus-refresh (on the config's refresh.cron when set), each with the config as a typed
    parameter the UI renders as a form. The artifact root is resolved now, so scheduled runs write
    where the server was told, not under the serving process's working directory."""
    store_root = str(resolve_root(root))
    deployments = []
    for path in config_paths:
        cfg = load_config(path)
        base = {"config": cfg.model_dump(), "root": store_root}
        deployments.append(pipeline.to_deployment(
            name=cfg.name, parameters=base, cron=cron, tags=["passage-forge", cfg.name],
            description=f"Full pipeline on {path}"))
        for stage in plan_for(cfg).names():
            deployments.append(pipeline.to_deployment(
                name=f"{cfg.name}--{stage}", parameters={**base, "stage": stage}, tags=["passage-forge", "stage"],
                description=f"Rerun stage {stage} of {path} on its latest upstream artifacts"))
        deployments.append(corpus_refresh.to_deployment(
            name=f"{cfg.name}--corpus-refresh", parameters={**base, "dump": cfg.refresh.dump}, cron=cfg.refresh.cron,
            tags=["passage-forge", "refresh", cfg.name],
            description=f"Refresh the corpus of {path} from a newer dump (dump: a path, a glob or a URL with {{date}})"))
    return deployments


def wait_for_server(api_url: str, within_s: float = 90.0, sleep=time.sleep, clock=time.monotonic) -> None:
    """Waits, with bounded back-off, until the server answers its health check: a server still
    starting (or busy) is not a failure. Prefect's client retries 503s and dropped connections
    only once it has connected, so a first refused connection would end `serve` at once."""
    deadline, wait, last = clock() + within_s, 0.5, "no answer"
    while True:
        try:
            response = httpx.get(f"{api_url.rstrip('/')}/health", timeout=10)
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        if clock() + wait > deadline:
            raise RuntimeError(f"the Prefect server at {api_url} did not answer within {within_s:.0f} s ({last}); "
                               "start it (prefect server start) or correct PREFECT_API_URL")
        sleep(wait)
        wait = min(wait * 2, 8.0)


def serve_pipeline(config_paths: list[Path], root: str | None = None, cron: str | None = None) -> None:
    from prefect.settings import PREFECT_API_URL

    deployments = build_deployments(config_paths, root, cron)  # a bad config fails before any wait
    if PREFECT_API_URL.value():  # without one, Prefect starts (and waits for) an ephemeral server
        wait_for_server(PREFECT_API_URL.value())
    serve(*deployments)
