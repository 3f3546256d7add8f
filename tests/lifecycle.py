"""A real `pforge run` process for the tests that start, signal and kill one: its environment, its
session (each run is a session of its own, as a terminal's job, so everything it started is found
and stopped by session), and what its output and its store say it built."""
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from flows.server_watchdog import SERVER_APP   # in the ephemeral server's command line
from storage import ArtifactStore
from tasks.config import PROJECT_ROOT
from tests.signals import default_signals

PFORGE = Path(sys.executable).with_name("pforge")
TINY = PROJECT_ROOT / "configs" / "tiny.yaml"
BUILT = re.compile(r"INFO (\S+): (\S+) ([0-9a-f]{16}) \(built\)")
CACHE_HIT = re.compile(r"INFO (\S+): (\S+) ([0-9a-f]{16}) \(cache hit\)")


def pforge_env(tmp: Path, **changes) -> dict[str, str]:
    """What a user's shell would pass: no database chosen, one PREFECT_HOME shared by every run
    here (as ~/.prefect is), so runs that shared its database would meet again."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_SERVER_DATABASE_CONNECTION_URL")}
    env.update({"HF_HUB_OFFLINE": "1", "PREFECT_HOME": str(tmp / "prefect-home")}, **changes)
    return {k: v for k, v in env.items() if v is not None}


def start_run(root: Path, log: Path, env: dict, config: Path = TINY) -> subprocess.Popen:
    # A session of its own, as a terminal's job: its processes are found (and stopped) by session.
    return subprocess.Popen([str(PFORGE), "run", str(config), "--root", str(root)], cwd=PROJECT_ROOT, env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=default_signals)


def session_processes(sid: int) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if os.getsid(process.pid) == sid:
                found.append(process)
        except (ProcessLookupError, PermissionError):
            pass
    return found


def in_session(sid: int) -> list[str]:
    return [" ".join(process.info["cmdline"] or [])[:160] for process in session_processes(sid)]


def running_in_session(sid: int) -> list[str]:
    """`in_session` but for zombies: a killed process's child is one until whoever inherited it reaps it."""
    running = []
    for process in session_processes(sid):
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                running.append(" ".join(process.info["cmdline"] or [])[:160])
        except psutil.NoSuchProcess:
            pass
    return running


def kill_session(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(10)


def prefect_servers(sid: int) -> list[psutil.Process]:
    return [process for process in session_processes(sid) if SERVER_APP in (process.info["cmdline"] or [])]


def built_in(output: str) -> dict[str, str]:
    """artifact stage -> version of each "(built)" line (the engine logs it once committed)."""
    return {m.group(2): m.group(3) for m in BUILT.finditer(output)}


def cache_hits_in(output: str) -> dict[str, str]:
    """artifact stage -> version of each "(cache hit)" line: a stage the run found built."""
    return {m.group(2): m.group(3) for m in CACHE_HIT.finditer(output)}


def registered(root: Path) -> dict[str, str]:
    return {row["stage"]: row["version"] for row in ArtifactStore(root).list_artifacts()}
