"""Ctrl-C, SIGTERM and SIGHUP (the terminal closing) stop a `pforge` process within seconds, at any
stage, with one line (a signal the process inherited as ignored, as under nohup, stays ignored).

Unwinding the stack does not: a KeyboardInterrupt raised into Prefect's engine prints a long
traceback, and raised while the main thread waits on worker threads or inside the JVM (BM25) it can
hang for minutes. So a signal ends the process instead: its child processes (the ephemeral Prefect
server, Dask workers, torchrun ranks) are terminated, the cleanups run, one line is printed and
the process exits with 128 + the signal number. Nothing partial is visible afterwards: the store
builds into a temporary folder and renames it into place (a crash at any moment leaves the whole
artifact or nothing; the next start removes the leftovers).

The C-level signal handler writes the signal number to a wake-up pipe that a watcher thread
reads, so the exit happens even while the main thread is stuck in C code and never returns to run
a Python handler; the Python handler does the same when it gets to run first.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Callable

import psutil

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)   # Ctrl-C, kill, the terminal closing
CHILD_GRACE_S = 3.0   # uvicorn and Dask workers stop on SIGTERM within this; then SIGKILL

_lock = threading.Lock()
_cleanups: list[Callable[[], None]] = []
_installed = False


def installed() -> bool:
    """Whether this process ends itself this way (a `pforge` process, not a caller's own: a test's)."""
    return _installed


def exit_code(signum: int) -> int:
    return 128 + signum   # the shell's convention: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP


def stop_on_signals(cleanups: list[Callable[[], None]] = ()) -> None:
    """Installs the handlers (main thread only); `cleanups` run before the exit."""
    global _installed
    _installed = True
    _cleanups.extend(cleanups)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    for signum in SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:  # nohup, or `&` in a script: stays ignored
            signal.signal(signum, _on_signal)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    # A forked child (a multiprocessing worker) would inherit both, and a SIGTERM meant for it
    # alone would reach our pipe and end the whole run: it gets Python's defaults back.
    os.register_at_fork(after_in_child=_defaults_in_child)
    threading.Thread(target=_watch, args=(read_fd,), name="pforge-signals", daemon=True).start()


def _defaults_in_child() -> None:
    try:
        signal.set_wakeup_fd(-1)
        if signal.getsignal(signal.SIGINT) is _on_signal:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) is _on_signal:
                signal.signal(signum, signal.SIG_DFL)
    except ValueError:  # not the main thread: nothing of ours is installed there
        pass


def _on_signal(signum, frame) -> None:
    stop(signum)


def _watch(read_fd: int) -> None:
    while True:
        data = os.read(read_fd, 1)
        if data and data[0] in SIGNALS and signal.getsignal(data[0]) is not signal.SIG_IGN:
            stop(data[0])


def stop(signum: int) -> None:
    """Ends the process on a signal: exit 128 + the signal number (see `end_process`)."""
    name = signal.Signals(signum).name
    end_process(f"pforge: interrupted ({name}); nothing partial was registered", exit_code(signum))


def end_process(line: str, code: int) -> None:
    """Terminates the children, runs the cleanups, prints `line` and exits with `code`. The first
    caller wins; a second (a signal while it works) waits for the exit."""
    if not _lock.acquire(blocking=False):
        threading.Event().wait()   # the first caller is exiting the process
    try:
        # Logging's own error reports stay quiet from here: Prefect's API log worker writes one, with
        # no newline at its end, when the server below stops under it, and it ran into the one line.
        logging.raiseExceptions = False
        terminate_children()
        for cleanup in _cleanups:
            try:
                cleanup()
            except Exception:   # an exit path must not fail
                pass
        # os.write: no Python stream lock, which the interrupted main thread may hold
        os.write(2, f"{line}\n".encode())
    finally:
        os._exit(code)


def terminate_children(grace_s: float = CHILD_GRACE_S) -> None:
    """Every descendant process: SIGTERM, then SIGKILL for those still alive after `grace_s`."""
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    stop_processes(children, grace_s)


def stop_processes(processes: list[psutil.Process], grace_s: float) -> None:
    """SIGTERM to each, then SIGKILL to those still alive after `grace_s`."""
    for process in processes:
        try:
            process.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for process in alive:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
