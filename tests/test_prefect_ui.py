"""The UI path end to end: a real Prefect server on 127.0.0.1, `pforge serve` registering the
deployments, a run created through the REST API exactly as the UI's "Run" button does, then the
artifacts in the catalog and in Prefect. Everything started here is stopped by its PID."""
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from flows.processes import free_port, start_prefect_server, stop_session
from storage import ArtifactStore
from tasks.config import PROJECT_ROOT

pytestmark = pytest.mark.usefixtures("shared_data")
PFORGE = Path(sys.executable).with_name("pforge")
STOP_GRACE_S = 30.0


def _start(argv, env, log: Path) -> subprocess.Popen:
    # Its own session: stopping it stops its children (the runner's flow-run subprocesses) too.
    return subprocess.Popen(argv, env=env, cwd=PROJECT_ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


RETRIED_STATUS = {429, 502, 503}   # a busy server's answers (503: its database is busy), not a verdict
TRIES = 6                          # back-off 0.5, 1, 2, 4, 8 s: a busy moment, bounded


def _api(method: str, url: str, tries: int = TRIES, sleep=time.sleep, **kwargs) -> httpx.Response:
    """One REST call, retried with bounded back-off on transient connection errors and busy
    answers; the last answer (or error) is the result."""
    for attempt in range(tries):
        try:
            response = httpx.request(method, url, timeout=30, **kwargs)
        except (httpx.TransportError, httpx.TimeoutException):
            if attempt == tries - 1:
                raise
        else:
            if response.status_code not in RETRIED_STATUS or attempt == tries - 1:
                return response
        sleep(0.5 * 2 ** attempt)
    raise AssertionError("unreachable")


def test_api_calls_retry_a_busy_server_and_give_up_after_bounded_tries(monkeypatch):
    answers = iter([httpx.ConnectError("refused"), httpx.Response(503), httpx.Response(201, json={"id": "r"})])

    def request(method, url, **kwargs):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer
    monkeypatch.setattr(httpx, "request", request)
    waits = []
    assert _api("POST", "http://x/api/deployments/d/create_flow_run", json={}, sleep=waits.append).json() == {"id": "r"}
    assert waits == [0.5, 1.0]
    monkeypatch.setattr(httpx, "request", lambda method, url, **kwargs: httpx.Response(503))
    waits.clear()
    assert _api("GET", "http://x/api/health", sleep=waits.append).status_code == 503  # then the caller's assert says so
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0]
    monkeypatch.setattr(httpx, "request", lambda method, url, **kwargs: httpx.Response(422))
    assert _api("POST", "http://x/api/deployments/d/create_flow_run", sleep=waits.append).status_code == 422  # a verdict


def _wait(what: str, check, timeout: float, logs: list[Path], every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(every)
    tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists())
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{tails}")


@pytest.fixture
def prefect_server(tmp_path):
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_API_URL": api,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "true",
           "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}"}
    started = [start_prefect_server(port, env, tmp_path / "server.log")]
    try:
        yield api, env, started
    finally:
        for process in reversed(started):
            stop_session(process, STOP_GRACE_S)
        assert all(p.poll() is not None for p in started)


def _deployments(api: str) -> dict[str, dict]:
    rows = _api("POST", f"{api}/deployments/filter", json={}).json()
    return {d["name"]: d for d in rows}


def test_a_run_triggered_as_the_ui_does_completes_and_publishes_its_artifacts(prefect_server, tmp_path):
    api, env, started = prefect_server
    root = tmp_path / "store"
    serve_log = tmp_path / "serve.log"
    started.append(_start([str(PFORGE), "serve", str(PROJECT_ROOT / "configs" / "tiny.yaml"), "--root", str(root)],
                          env, serve_log))
    logs = [tmp_path / "server.log", serve_log]
    # serve registers them one by one; the refresh deployment is the config's last
    deployments = _wait("the deployments", lambda: (d := _deployments(api)) and "tiny--corpus-refresh" in d and d, 180, logs)
    assert {"tiny", "tiny--chunk", "tiny--corpus-refresh"} <= set(deployments)
    assert "dump" in deployments["tiny--corpus-refresh"]["parameter_openapi_schema"]["properties"]
    tiny = deployments["tiny"]
    # The form the UI renders: the typed config, defaults included.
    schema = tiny["parameter_openapi_schema"]
    assert {"config", "stage", "root"} <= set(schema["properties"])
    assert tiny["enforce_parameter_schema"] is True

    # Invalid input from the form is refused by the server, before any run exists.
    bad = dict(tiny["parameters"], config={**tiny["parameters"]["config"], "bm25": {"k1": "not a number"}})
    refused = _api("POST", f"{api}/deployments/{tiny['id']}/create_flow_run", json={"parameters": bad})
    assert refused.status_code in (409, 422), refused.text

    # "Run" -> "Quick run": the deployment's own parameters.
    created = _api("POST", f"{api}/deployments/{tiny['id']}/create_flow_run", json={})
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]

    def finished():
        state = _api("GET", f"{api}/flow_runs/{run_id}").json()["state"]
        assert state["type"] not in ("FAILED", "CRASHED", "CANCELLED"), state
        return state["type"] == "COMPLETED" and state
    _wait("the flow run to complete", finished, 420, logs, every=2.0)

    # The catalog has the run's artifacts...
    store = ArtifactStore(root)
    assert {r["stage"] for r in store.list_artifacts()} >= {"documents", "passages", "bm25_index", "bm25_runs", "evaluation"}
    assert store.sql("SELECT count(*) AS n FROM metrics WHERE system = 'bm25'").column("n")[0].as_py() > 0
    # ... and Prefect has the report, the metrics table, each stage's summary and progress, linked to the run.
    artifacts = _api("POST", f"{api}/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [run_id]}}}).json()
    by_key = {a["key"]: a for a in artifacts if a["key"]}
    assert {"tiny-evaluation", "tiny-evaluation-metrics", "tiny-chunk-summary", "tiny-evaluate-summary"} <= set(by_key)
    assert by_key["tiny-evaluation-metrics"]["type"] == "table"
    chunk_progress = by_key["tiny-chunk-progress"]
    assert chunk_progress["type"] == "progress" and float(chunk_progress["data"]) == 100.0
    evaluation = store.latest("evaluation")
    assert evaluation.version in by_key["tiny-evaluate-summary"]["data"]
