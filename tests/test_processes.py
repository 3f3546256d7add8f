"""flows/processes.py: a process group stopped as one (SIGTERM, then SIGKILL for whatever is left
of it, a child that ignores SIGTERM or outlives its leader included), and a Prefect server that
fails to start is stopped and reported with its log. Timings are loose: the machine may be loaded."""
import os
import signal
import socket
import subprocess
import time

import psutil
import pytest

from flows.processes import free_port, start_prefect_server, stop_session
from tests.lifecycle import kill_session
from tests.signals import default_signals

GONE_WITHIN_S = 30   # an orphan killed in the group is reaped by init, which may poll every few seconds


def _start(script: str) -> tuple[subprocess.Popen, int]:
    """`bash -c script` leading a process group of its own, and its child's pid (the script echoes it)
    once that child runs `sleep` (so any `trap` it set is in place)."""
    process = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True,
                               preexec_fn=default_signals)
    child = int(process.stdout.readline())
    deadline = time.monotonic() + GONE_WITHIN_S
    while psutil.Process(child).name() != "sleep":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return process, child


def _group_gone(pgid: int, within_s: float = GONE_WITHIN_S) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_a_group_that_ignores_sigterm_is_killed_after_the_grace():
    process, child = _start('trap "" TERM; sleep 60 & echo $!; wait')
    try:
        started = time.monotonic()
        stop_session(process, grace_s=1.0)
        assert time.monotonic() - started >= 1.0   # it had its grace
        assert process.returncode == -signal.SIGKILL
        assert _group_gone(process.pid)
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    finally:
        kill_session(process)


def test_a_child_that_outlives_its_leader_is_killed_too():
    process, child = _start('(trap "" TERM; exec sleep 60) & echo $!; wait')
    try:
        stop_session(process, grace_s=60.0)
        assert process.returncode == -signal.SIGTERM   # the leader stopped on SIGTERM...
        assert _group_gone(process.pid)                # ... and its child, which ignores it, did not run on
    finally:
        kill_session(process)


def test_a_well_behaved_process_stops_on_sigterm_without_waiting_for_the_grace():
    process = subprocess.Popen(["sleep", "60"], start_new_session=True, preexec_fn=default_signals)
    try:
        started = time.monotonic()
        stop_session(process, grace_s=120.0)
        assert process.returncode == -signal.SIGTERM
        assert time.monotonic() - started < 60
        assert _group_gone(process.pid)
    finally:
        kill_session(process)


def test_a_process_that_already_ended_is_no_error():
    process = subprocess.Popen(["true"], start_new_session=True)
    process.wait(30)
    stop_session(process, grace_s=1.0)
    assert process.returncode == 0


def test_a_prefect_server_that_cannot_start_is_stopped_and_reported_with_its_log(tmp_path):
    with socket.socket() as taken:   # the port is bound and listened on, never answered
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        before = {p.pid for p in psutil.Process().children()}
        with pytest.raises(RuntimeError, match="the Prefect server") as failed:
            start_prefect_server(port, env, tmp_path / "server.log", timeout_s=300)
    assert (tmp_path / "server.log").read_text(errors="replace")[-200:] in str(failed.value)
    assert {p.pid for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE} <= before


def test_free_port_can_be_bound():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))
