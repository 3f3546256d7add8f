"""A `pforge run` process from start to exit, as a user's shell sees it: on busy cores, two at
once, and stopped by Ctrl-C or SIGTERM at any stage. Each run is a real `pforge` process with its
own ephemeral Prefect server; everything started here is stopped by its process group."""
import os
import signal
import subprocess
import time

import psutil
import pytest

from tasks.config import PROJECT_ROOT
from tests.lifecycle import PFORGE, built_in, in_session, kill_session, pforge_env, prefect_servers, registered, start_run

pytestmark = pytest.mark.usefixtures("shared_data")
EXIT_WITHIN_S = 15


# (the stage's "running" line to wait for, seconds after it, the signal, the artifact it builds)
SCENARIOS = {
    "sigint-in-ingest": ("ingest_documents", 0.0, signal.SIGINT, "documents"),
    "sigint-0.3s-into-the-bm25-index": ("bm25_index", 0.3, signal.SIGINT, "bm25_index"),
    "sigterm-0.3s-into-the-bm25-index": ("bm25_index", 0.3, signal.SIGTERM, "bm25_index"),
}


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """The three interruptions, started at once (each waits for its own stage): per scenario its
    exit code, seconds from the signal to the exit, output, what was left in its session, root."""
    tmp = tmp_path_factory.mktemp("interrupted")
    runs = {}
    for name in SCENARIOS:
        log = tmp / f"{name}.log"
        runs[name] = {"root": tmp / name, "log": log, "process": start_run(tmp / name, log, pforge_env(tmp))}
    try:
        deadline = time.monotonic() + 240
        while any("rc" not in run for run in runs.values()) and time.monotonic() < deadline:
            for name, run in runs.items():
                stage, delay, signum, _ = SCENARIOS[name]
                process = run["process"]
                if "rc" in run:
                    continue
                if "signalled" not in run:
                    if process.poll() is not None:
                        raise AssertionError(f"{name}: exited ({process.returncode}) before {stage}:\n"
                                             f"{run['log'].read_text(errors='replace')[-3000:]}")
                    output = run["log"].read_text(errors="replace")
                    if f"{stage}: running" in output:
                        run.setdefault("reached", time.monotonic())
                        if time.monotonic() - run["reached"] >= delay:
                            os.kill(process.pid, signum)
                            run["signalled"] = time.monotonic()
                elif process.poll() is not None:
                    run.update(rc=process.returncode, seconds=time.monotonic() - run["signalled"],
                               left=in_session(process.pid), output=run["log"].read_text(errors="replace"))
                elif time.monotonic() - run["signalled"] > 60:
                    run.update(rc=None, seconds=float("inf"), left=in_session(process.pid),
                               output=run["log"].read_text(errors="replace"))
            time.sleep(0.02)
        missing = [name for name, run in runs.items() if "rc" not in run]
        assert not missing, f"never reached their stage: {missing}"
        yield runs
    finally:
        for run in runs.values():
            kill_session(run["process"])


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_signal_stops_the_run_at_once_with_one_line_and_its_server_and_leaves_nothing_partial(
        interrupted, scenario, capsys):
    from flows.cli import main

    stage, _, signum, artifact = SCENARIOS[scenario]
    run = interrupted[scenario]
    output = run["output"]
    assert run["rc"] == 128 + signum, output[-3000:]
    assert run["seconds"] < EXIT_WITHIN_S
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    assert [line for line in output.splitlines() if line.startswith("pforge:")] == \
        [f"pforge: interrupted ({signal.Signals(signum).name}); nothing partial was registered"]
    assert output.rstrip().splitlines()[-1].startswith("pforge: interrupted")
    assert run["left"] == []  # the ephemeral Prefect server (uvicorn) went with the run
    # The store holds exactly what the run reported built, never the interrupted stage.
    assert main(["--root", str(run["root"]), "artifacts"]) == 0
    listed = capsys.readouterr().out
    stored = registered(run["root"])
    assert stored == built_in(output)
    assert artifact not in stored and f"\n{artifact} " not in listed
    assert not list(run["root"].glob("*/.tmp-*"))  # the interrupted build's folder: removed on the next open


def _busy() -> None:
    while True:
        pass


def test_the_next_runs_complete_two_at_once_on_busy_cores_offline(interrupted, tmp_path):
    """Each interrupted store finishes on the next run. The two runs go at once, each with its own
    ephemeral server (a shared SQLite database failed them: "database is locked"), while busy
    loops load every core (the server then starts slower than Prefect's 20 s default allows), and
    with the analytics variable unset, as from a plain shell (no telemetry attempt)."""
    import multiprocessing

    roots = [interrupted[name]["root"] for name in ("sigint-in-ingest", "sigterm-0.3s-into-the-bm25-index")]
    env = pforge_env(interrupted["sigint-in-ingest"]["root"].parent, PREFECT_SERVER_ANALYTICS_ENABLED=None)
    logs = [tmp_path / f"next-{i}.log" for i in range(2)]
    busy = [multiprocessing.get_context("spawn").Process(target=_busy, daemon=True) for _ in range(os.cpu_count() + 1)]
    processes = []
    try:
        for process in busy:
            process.start()
        processes = [start_run(root, log, env) for root, log in zip(roots, logs)]
        codes = [p.wait(420) for p in processes]
    finally:
        for process in busy:
            process.kill()
            process.join(10)
        for p in processes:
            kill_session(p)
    for root, log, code in zip(roots, logs, codes):
        output = log.read_text(errors="replace")
        assert code == 0, output[-3000:]
        assert "Traceback" not in output and "database is locked" not in output, output[-3000:]
        assert "telemetry" not in output.lower(), output[-3000:]
        # The libraries' chatter stays out of the terminal (pforge --debug shows it): Lucene's JVM
        # INFO lines, faiss's SIMD probing, Prefect's docs link; its server is one line that says what it is.
        for noise in ("INFO: Using MemorySegmentIndexInput", "Could not load library with", "prefect.io/docs",
                      "Stopping temporary server"):
            assert noise not in output, (noise, output[-3000:])
        assert output.count("Prefect: a temporary server for this run at http") == 1, output[-3000:]
        assert {"documents", "passages", "bm25_index", "bm25_runs", "evaluation"} <= set(registered(root))
        assert not list(root.glob("*/.tmp-*"))


def test_a_run_killed_with_sigkill_leaves_a_server_that_the_next_start_stops(tmp_path):
    """SIGKILL gives `pforge` no chance to stop its ephemeral server, which would go on serving the
    shared database while the next run starts its own on it. The next `pforge` (any command) stops
    it, and only it: a run alive meanwhile keeps its own."""
    env = pforge_env(tmp_path)
    killed = start_run(tmp_path / "killed", tmp_path / "killed.log", env)
    living = None
    try:
        deadline = time.monotonic() + 240
        while not prefect_servers(killed.pid) or "ingest_documents: running" not in \
                (tmp_path / "killed.log").read_text(errors="replace"):
            assert killed.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "killed.log").read_text(errors="replace")[-3000:]
            time.sleep(0.1)
        os.kill(killed.pid, signal.SIGKILL)   # the process alone, as the OOM killer does
        killed.wait(10)
        orphans = prefect_servers(killed.pid)
        assert orphans and all(p.is_running() for p in orphans)   # the case exists: the server outlived it
        living = start_run(tmp_path / "living", tmp_path / "living.log", env)
        while not prefect_servers(living.pid):
            assert living.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "living.log").read_text(errors="replace")[-3000:]
            time.sleep(0.1)
        listing = subprocess.run([str(PFORGE), "artifacts", "--root", str(tmp_path / "killed")], cwd=PROJECT_ROOT,
                                 env=env, capture_output=True, text=True, timeout=120)
        assert listing.returncode == 0, listing.stderr[-3000:]
        gone, alive = psutil.wait_procs(orphans, timeout=10)
        assert not alive and in_session(killed.pid) == []
        assert prefect_servers(living.pid) and living.poll() is None   # another run's server is not an orphan
    finally:
        kill_session(killed)
        if living is not None:
            kill_session(living)
