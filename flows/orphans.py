"""The processes a `pforge` left running when it was killed with no chance to stop them (SIGKILL,
the OOM killer): its ephemeral Prefect server above all, which would go on serving the shared
SQLite database while the next run starts a server of its own on it (two writers: "database is
locked"), or its Dask workers and torchrun ranks, computing for nobody.

A `pforge` process puts its owner tag (pid and start time) in its environment before it starts
anything, so every descendant inherits it; the next `pforge` start stops the processes whose tag
names an owner that no longer runs. The start time tells a reused pid from the owner.
"""
from __future__ import annotations

import os
from typing import MutableMapping

import psutil

from flows.interrupts import stop_processes

OWNER_VARIABLE = "PFORGE_OWNER"
STOP_GRACE_S = 5.0   # uvicorn stops on SIGTERM well within this; then SIGKILL


def owner_tag(pid: int) -> str:
    """"PID:START" for a running process (its start time in seconds since the epoch)."""
    return f"{pid}:{psutil.Process(pid).create_time():.2f}"


def mark_descendants(environ: MutableMapping[str, str] = os.environ) -> str:
    """Tags this process's environment (every child started from now on inherits it)."""
    environ[OWNER_VARIABLE] = owner_tag(os.getpid())
    return environ[OWNER_VARIABLE]


def owner_alive(tag: str) -> bool:
    """False only for a well-formed tag whose process is gone (or whose pid now runs another
    process); a malformed tag counts as alive, so nothing is stopped on a guess."""
    pid, _, started = tag.partition(":")
    try:
        pid_number, start = int(pid), float(started)
    except ValueError:
        return True
    try:
        return abs(psutil.Process(pid_number).create_time() - start) < 0.02
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:   # somebody else's process: not ours to judge
        return True


def stop_orphans(grace_s: float = STOP_GRACE_S) -> list[int]:
    """SIGTERM, then SIGKILL after `grace_s`, to this user's processes that carry the tag of a
    `pforge` that no longer runs; returns their pids."""
    me = os.getpid()
    orphans = []
    for process in psutil.process_iter(["pid"]):
        if process.pid == me:
            continue
        try:
            tag = process.environ().get(OWNER_VARIABLE)
        except psutil.Error:   # gone meanwhile, a kernel thread, or another user's process
            continue
        if tag and not owner_alive(tag):
            orphans.append(process)
    stop_processes(orphans, grace_s)
    return [process.pid for process in orphans]
