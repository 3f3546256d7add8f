"""A `pforge run` (or `refresh`) whose Prefect server dies under it stops at once, with one line.

Without the server nothing fails where the run can see it: Prefect's client retries each API call
for minutes, its log and event workers print each failure on the terminal and drop it, and the run
crawls on (measured on tiny: the ephemeral server killed as bm25_index started, the run began the
next stage 3.5 minutes later and was still running after 5; a configured server stopped there,
the run was still waiting 2 minutes later). So a watchdog thread looks at the server while the
flow runs:

- the ephemeral server (no PREFECT_API_URL): this process's child running Prefect's server app;
  it has died when no such child is alive (a zombie is dead) on two looks in a row, once one was
  seen (Prefect replaces a server that lost its port at once: a single look could fall between);
- a configured server (PREFECT_API_URL): its health endpoint; it is gone when no connection to it
  could be made for LOST_AFTER_S (a slow answer, or any HTTP status, is the server there: busy).

Then the run ends as on a signal (flows/interrupts.py): its children stopped, the cleanups run,
one `pforge: error:` line, exit 2. Nothing partial is registered: a stage builds into a temporary
folder and commits by rename, so the one running is left out and the next run rebuilds it,
reusing every stage committed before.

Under `pforge run --nproc N` the watchdog runs in rank 0 alone, the one rank whose flow run talks to
the server, and ends the run through the process that launched the ranks (flows/ddp.py).
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator

import psutil

from flows import interrupts

SERVER_APP = "prefect.server.api.server:create_app"   # in the ephemeral server's command line
POLL_S = 0.5          # the ephemeral server: a look at this process's children
CONFIGURED_POLL_S = 2.0   # a configured server: a request to it
LOST_AFTER_S = 15.0   # a configured server restarting within this is no loss
EXIT_CODE = 2         # as the CLI's other `pforge: error:` lines
STOPPED = "nothing partial was registered; rerun to resume from the last complete stage"


def _own_children() -> list[psutil.Process]:
    try:
        return psutil.Process().children()
    except psutil.Error:
        return []


def _ephemeral_servers(children: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for child in children:
        try:
            if SERVER_APP in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.Error:   # exited meanwhile
            pass
    return alive


def ephemeral_server_lost(children: Callable[[], list[psutil.Process]] = _own_children) -> Callable[[], str | None]:
    """A check that returns why the run's ephemeral server is gone, else None; `children` lists the
    processes to look among (this process's own)."""
    state = {"seen": False, "missed": 0}

    def check() -> str | None:
        if _ephemeral_servers(children()):
            state.update(seen=True, missed=0)
        elif state["seen"]:
            state["missed"] += 1
        return "the run's temporary Prefect server stopped" if state["missed"] >= 2 else None
    return check


def configured_server_lost(api_url: str, lost_after_s: float = LOST_AFTER_S,
                           clock: Callable[[], float] = time.monotonic) -> Callable[[], str | None]:
    """A check that returns why the server at `api_url` is gone (no connection for `lost_after_s`), else None."""
    import httpx

    state = {"answered": clock()}

    def check() -> str | None:
        try:
            httpx.get(f"{api_url.rstrip('/')}/health", timeout=min(5.0, lost_after_s))
        except (httpx.ConnectError, httpx.ConnectTimeout):
            if clock() - state["answered"] >= lost_after_s:
                return f"the Prefect server at {api_url} could not be reached for {lost_after_s:.0f} s"
            return None
        except httpx.HTTPError:   # connected, then slow or cut off: a busy server, still there
            pass
        state["answered"] = clock()
        return None
    return check


def _watch(check: Callable[[], str | None], done: threading.Event, poll_s: float, end: Callable[[str], None]) -> None:
    while not done.wait(poll_s):
        reason = check()
        if reason is not None and not done.is_set():
            end(f"pforge: error: {reason}; {STOPPED}")


def end_this_process(line: str) -> None:
    """Ends this process as a signal does (its children stopped, its cleanups run), printing `line`."""
    interrupts.end_process(line, EXIT_CODE)


@contextlib.contextmanager
def stopping_if_the_server_dies(poll_s: float = POLL_S, end: Callable[[str], None] | None = None) -> Iterator[None]:
    """Watches the run's Prefect server while the block runs; once it is gone, `end` is called with
    the one line to print. Without `end`, this process ends, in a `pforge` process only (one that
    ends itself on a signal: flows/interrupts.py): a caller's own process (a test's) is never ended.
    A caller that passes `end` owns its process (flows/ddp.py's rank 0)."""
    if end is None:
        if not interrupts.installed():
            yield
            return
        end = end_this_process
    from prefect.settings import PREFECT_API_URL

    api_url = PREFECT_API_URL.value()
    check = configured_server_lost(api_url) if api_url else ephemeral_server_lost()
    poll_s = max(poll_s, CONFIGURED_POLL_S) if api_url else poll_s
    done = threading.Event()
    threading.Thread(target=_watch, args=(check, done, poll_s, end), name="pforge-server-watchdog", daemon=True).start()
    try:
        yield
    finally:
        done.set()   # the block's end stops the server itself (at exit): that is no death
