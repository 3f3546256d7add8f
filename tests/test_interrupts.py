"""Ctrl-C and SIGTERM end a `pforge` process at once, even while its main thread is stuck in C
code (the JVM, a thread join), stop its child processes and run its cleanups; a forked worker's own
SIGTERM stays its own. Each case is a small real process (flows/interrupts.py installed)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tasks.config import PROJECT_ROOT
from tests.signals import default_signals

STUCK = r'''
import ctypes, signal, subprocess, sys
from pathlib import Path
from flows.interrupts import stop_on_signals

if len(sys.argv) > 2:                          # as under nohup
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

stop_on_signals([lambda: Path(sys.argv[1]).write_text("cleaned")])
child = subprocess.Popen(["sleep", "60"])      # stands in for the ephemeral Prefect server
print(child.pid, flush=True)
# The main thread now waits in C and never runs Python again (a mutex it holds itself: a wait that
# signals do not interrupt, as the JVM's futex waits): only the wake-up pipe can act.
libc, mutex = ctypes.CDLL(None), ctypes.create_string_buffer(64)
libc.pthread_mutex_lock(mutex)
libc.pthread_mutex_lock(mutex)
'''

FORKED_WORKER = r'''
import multiprocessing, time
from flows.interrupts import stop_on_signals

stop_on_signals()
worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
worker.start()
time.sleep(0.5)
worker.terminate()                            # a SIGTERM for the worker alone
worker.join(10)
time.sleep(1.0)                               # room for a wrongly shared signal to arrive
print("parent goes on", worker.exitcode, flush=True)
'''

# What Prefect's API log worker does when the server it ships logs to has stopped
# (prefect/logging/handlers.py APILogWorker._handle_batch): an error report whose last write has
# no newline. Stopping the ephemeral server is part of the stop, so it can come at that moment.
SHIPPING_FAILS_DURING_THE_STOP = r'''
import logging, sys, time
from flows.interrupts import stop_on_signals

def ship_logs():
    if logging.raiseExceptions and sys.stderr:
        sys.stderr.write("--- Error logging to API ---\n")
        sys.stderr.write("All connection attempts failed")
        sys.stderr.flush()

stop_on_signals([ship_logs])
print("ready", flush=True)
time.sleep(60)
'''


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_ends_a_process_stuck_in_c_code_with_its_children_and_one_line(tmp_path, signum):
    marker = tmp_path / "cleanup"
    # the STUCK script's own nohup case tests that an ignored SIGHUP stays ignored
    process = subprocess.Popen([sys.executable, "-c", STUCK, str(marker)], cwd=PROJECT_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True,
                               preexec_fn=default_signals)
    try:
        child = int(process.stdout.readline())
        time.sleep(0.2)
        started = time.monotonic()
        process.send_signal(signum)
        code = process.wait(15)
        elapsed = time.monotonic() - started
        stderr = process.stderr.read()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
    assert code == 128 + signum and elapsed < 5
    assert stderr.splitlines() == [f"pforge: interrupted ({signal.Signals(signum).name}); nothing partial was registered"]
    assert marker.read_text() == "cleaned"
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_a_forked_workers_own_sigterm_does_not_end_the_parent():
    done = subprocess.run([sys.executable, "-c", FORKED_WORKER], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["parent", "goes", "on", str(-signal.SIGTERM)]
    assert "interrupted" not in done.stderr


def test_an_ignored_signal_stays_ignored(tmp_path):
    """Under nohup, SIGHUP is ignored: the run must outlive the terminal, then stop on SIGTERM."""
    process = subprocess.Popen([sys.executable, "-c", STUCK, str(tmp_path / "cleanup"), "nohup"], cwd=PROJECT_ROOT,
                               preexec_fn=default_signals,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        process.stdout.readline()
        process.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 128 + signal.SIGTERM
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)


def test_a_log_shipping_error_during_the_stop_does_not_run_into_the_one_line():
    process = subprocess.Popen([sys.executable, "-c", SHIPPING_FAILS_DURING_THE_STOP], cwd=PROJECT_ROOT,
                               preexec_fn=default_signals, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        assert process.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 128 + signal.SIGTERM
        stderr = process.stderr.read()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
    assert stderr.splitlines() == ["pforge: interrupted (SIGTERM); nothing partial was registered"]


@pytest.mark.parametrize("delay_s", [0.2, 0.6])
def test_ctrl_c_while_pforge_starts_is_one_line_not_an_import_traceback(tmp_path, delay_s):
    # The CLI's imports (torch, pyarrow: over a second even on a fast machine) are under way then.
    pforge = Path(sys.executable).with_name("pforge")
    proc = subprocess.Popen([str(pforge), "--root", str(tmp_path / "none"), "plan", "configs/tiny.yaml"],
                            cwd=PROJECT_ROOT, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    time.sleep(delay_s)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.strip().splitlines() == ["pforge: interrupted while starting; nothing was run"], err
