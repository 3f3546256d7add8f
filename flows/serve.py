"""Register the pipeline and each of its stages as deployments on a Prefect server and serve them
(`pforge serve`).

What `serve` is given is checked before the flows and Prefect's serving machinery are imported and
before any server is contacted, each refusal one line naming the input (the CLI exits 2): every
config loads; no two share a name (their deployments would replace each other's); `--cron` and
each config's refresh.cron are expressions Prefect accepts; the artifact root is a folder the
served runs can write (each builds into it, so a read-only root or a file is refused as `pforge
run` refuses it); PREFECT_API_URL, when set, is an http(s) URL with a host and a valid port.
"""
from __future__ import annotations

import time
from pathlib import Path

import httpx

from storage import require_writable_root, resolve_root
from tasks.config import load_config

API_URL_EXAMPLE = "http://127.0.0.1:4200/api"


def check_cron(expression: str, where: str) -> None:
    """ValueError naming `where` when Prefect would not accept `expression` as a schedule."""
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=expression)
    except ValueError:  # pydantic's ValidationError: several lines, Prefect's own wording
        raise ValueError(f"{where}: {expression!r} is not a cron schedule (5 fields: minute hour day month weekday, "
                         "e.g. '0 3 * * 0')") from None


def check_api_url(api_url: str) -> None:
    """ValueError when PREFECT_API_URL is not an http(s) URL with a host and a port in 1..65535."""
    try:
        url = httpx.URL(api_url)
        problem = ("not an http(s) URL" if url.scheme not in ("http", "https") else
                   "no host in it" if not url.host else
                   f"port {url.port} is outside 1..65535" if url.port is not None and not 0 < url.port < 65536 else None)
    except httpx.InvalidURL as exc:
        problem = str(exc)
    if problem is not None:
        raise ValueError(f"PREFECT_API_URL {api_url!r}: {problem}; set it to a Prefect server's API, "
                         f"e.g. {API_URL_EXAMPLE}")


def load_served_configs(config_paths: list[Path], root: str | None = None, cron: str | None = None) -> list:
    """The configs `serve` serves, once its inputs pass the checks of the module's notes (but
    PREFECT_API_URL's: `check_api_url`)."""
    if cron is not None:
        check_cron(cron, "--cron")
    configs, names = [], {}
    for path in config_paths:
        cfg = load_config(path)
        if cfg.name in names:
            raise ValueError(f"{names[cfg.name]} and {path} are both named {cfg.name!r}: their deployments would "
                             "replace each other's; give each config its own name")
        names[cfg.name] = path
        if cfg.refresh.cron is not None:
            check_cron(cfg.refresh.cron, f"{path}: refresh.cron")
        configs.append((path, cfg))
    require_writable_root(resolve_root(root))
    return configs


def build_deployments(config_paths: list[Path], root: str | None = None, cron: str | None = None) -> list:
    """One deployment for the whole pipeline per config (optionally on a cron), one per stage, and
    NAME--corpus-refresh (on the config's refresh.cron when set), each with the config as a typed
    parameter the UI renders as a form. The artifact root is resolved now, so scheduled runs write
    where the server was told, not under the serving process's working directory."""
    configs = load_served_configs(config_paths, root, cron)
    from flows.pipeline import pipeline
    from flows.refresh import corpus_refresh
    from flows.registry import plan_for

    store_root = str(resolve_root(root))
    deployments = []
    for path, cfg in configs:
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

    api_url = PREFECT_API_URL.value()
    if api_url:
        check_api_url(api_url)
    deployments = build_deployments(config_paths, root, cron)  # every input is checked before any wait
    if api_url:  # without one, Prefect starts (and waits for) an ephemeral server
        wait_for_server(api_url)
    from prefect import serve

    serve(*deployments)
