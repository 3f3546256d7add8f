"""Child processes stopped with everything they started: a Prefect server on a free port (the UI's
tests, the docs' pictures), what runs against it (`pforge serve`), a headless browser.

A process started with `start_new_session=True` leads a new process group whose id is its pid, so
one signal to the group reaches its own children too (a runner's flow-run subprocesses, a
browser's zygote and renderers), and nothing outside it.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping

HOST = "127.0.0.1"
SERVER_START_S = 600.0   # it imports Prefect and migrates a new database: minutes on a loaded machine
FAILED_START_GRACE_S = 10.0
KILLED_WAIT_S = 10.0


def stop_session(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to `process`'s group; once `process` has exited, or after `grace_s`, SIGKILL to what
    is left of the group; `process` is reaped. `process` must lead its group (start_new_session)."""
    _signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    # A child that ignores SIGTERM, or outlives its leader, would run on unowned.
    _signal_group(process.pid, signal.SIGKILL)
    process.wait(KILLED_WAIT_S)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:   # nothing left in the group
        pass


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def start_prefect_server(port: int, env: Mapping[str, str], log: Path,
                         timeout_s: float = SERVER_START_S) -> subprocess.Popen:
    """`prefect server start` on 127.0.0.1:`port`, leading a process group of its own (stop it with
    `stop_session`), returned once its health endpoint answers; its output goes to `log`. When it
    exits first, or is not healthy within `timeout_s`, it is stopped and RuntimeError carries the
    log's tail."""
    import httpx

    command = [sys.executable, "-m", "prefect", "server", "start", "--host", HOST, "--port", str(port)]
    with log.open("wb") as out:
        server = subprocess.Popen(command, env=dict(env), stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True, preexec_fn=_default_signals)
    deadline = time.monotonic() + timeout_s
    while server.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(f"http://{HOST}:{port}/api/health", timeout=5).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    why = f"exited ({server.returncode})" if server.poll() is not None else f"was not healthy after {timeout_s:.0f} s"
    stop_session(server, FAILED_START_GRACE_S)
    raise RuntimeError(f"the Prefect server {why}:\n{log.read_text(errors='replace')[-3000:]}")


def _default_signals() -> None:
    # A caller started with signals ignored (`cmd &`, nohup) would hand SIG_IGN down, and SIGTERM
    # must stop the server as it stops a terminal's job.
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
