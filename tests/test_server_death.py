"""The Prefect server dying mid-run (the OOM killer, a crash, its owner stopping it): the run stops
within seconds with one `pforge: error:` line and a non-zero exit, registers nothing partial,
leaves nothing running, and the rerun completes, reusing every stage the first run committed
(flows/server_watchdog.py). Before the watchdog the run did not stop: each Prefect API call retried
for minutes, its workers printed every failure, and the run was still at the next stage minutes
later. The ephemeral server's case is run to the rerun; a configured server's (PREFECT_API_URL)
to the stop, its rerun being the same as the first case's (its start costs another 20-40 s)."""
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from flows.processes import free_port, start_prefect_server, stop_session
from flows.server_watchdog import LOST_AFTER_S
from tasks.config import PROJECT_ROOT
from tests.crash_consistency import partial_listings, rerun, resume_problems, unfinished_folders_on_disk
from tests.lifecycle import built_in, in_session, kill_session, pforge_env, prefect_servers, registered, start_run
from tests.signals import default_signals

pytestmark = pytest.mark.usefixtures("shared_data")
STAGE = ("bm25_index", "bm25_index")   # the stage the server dies in, and its artifact: the longest of tiny's
STOPS_WITHIN_S = 20   # the watchdog looks twice a second; the rest is the exit's own cleanup


def _wait_for_stage(process, log, stage: str, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while f"{stage}: running" not in log.read_text(errors="replace"):
        assert process.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.05)


def _exit_within(process, seconds: float) -> tuple[int | None, list[str]]:
    """The run's exit code (None: still running after `seconds`) and what of its session is left."""
    deadline = time.monotonic() + seconds
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return process.poll(), in_session(process.pid)


def _check_stopped_with_one_line_and_nothing_partial(code, left, output: str, root, seconds: float) -> None:
    assert code is not None, f"still running {seconds:.0f}s after its server died:\n{output[-3000:]}"
    assert code != 0 and "Traceback" not in output, output[-3000:]
    lines = [line for line in output.splitlines() if line.startswith("pforge:")]
    assert len(lines) == 1 and lines[0].startswith("pforge: error: ") and "Prefect server" in lines[0], output[-3000:]
    assert output.rstrip().splitlines()[-1] == lines[0]
    assert left == []
    # What is listed is whole, and is what the run reported built (the stage the server died in
    # only if its commit came first).
    assert unfinished_folders_on_disk(root) == [] and partial_listings(root) == []
    committed, reported = registered(root), built_in(output)
    assert reported.items() <= committed.items() and set(committed) - set(reported) <= {STAGE[1]}


def test_a_run_whose_temporary_server_dies_mid_stage_stops_with_one_line_and_the_rerun_resumes(tmp_path):
    env, root, log = pforge_env(tmp_path), tmp_path / "root", tmp_path / "killed.log"
    process = start_run(root, log, env)
    try:
        _wait_for_stage(process, log, STAGE[0])
        servers = prefect_servers(process.pid)
        assert servers, in_session(process.pid)
        for server in servers:
            server.kill()
        code, left = _exit_within(process, STOPS_WITHIN_S)
    finally:
        kill_session(process)
    _check_stopped_with_one_line_and_nothing_partial(code, left, log.read_text(errors="replace"), root, STOPS_WITHIN_S)
    committed = registered(root)
    code, again = rerun(root, tmp_path / "rerun.log", env)
    assert code == 0, again[-3000:]
    assert resume_problems(committed, again) == []
    assert {"bm25_index", "bm25_runs", "evaluation"} <= set(registered(root))


def test_a_run_whose_configured_server_is_stopped_mid_stage_stops_with_one_line(tmp_path):
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env, root, log = pforge_env(tmp_path, PREFECT_API_URL=api_url), tmp_path / "root", tmp_path / "run.log"
    server = start_prefect_server(port, pforge_env(tmp_path), tmp_path / "server.log")
    process = None
    try:
        process = start_run(root, log, env)
        _wait_for_stage(process, log, STAGE[0])
        stop_session(server, grace_s=30)   # as its owner stops it
        code, left = _exit_within(process, LOST_AFTER_S + STOPS_WITHIN_S)
    finally:
        kill_session(server)
        if process is not None:
            kill_session(process)
    output = log.read_text(errors="replace")
    _check_stopped_with_one_line_and_nothing_partial(code, left, output, root, LOST_AFTER_S + STOPS_WITHIN_S)
    assert api_url in output.rstrip().splitlines()[-1]


def test_the_ephemeral_server_counts_as_dead_on_two_looks_without_it_a_zombie_included():
    from flows.server_watchdog import SERVER_APP, ephemeral_server_lost

    started: list[int] = []

    def children_started_here() -> list[psutil.Process]:
        # this test's child only: a Prefect server an earlier test's harness left running is another's
        return [child for child in psutil.Process().children() if child.pid in started]

    check = ephemeral_server_lost(children_started_here)
    assert check() is None   # no server yet: one not started is no death
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", SERVER_APP])
    started.append(server.pid)
    try:
        assert check() is None
        server.kill()
        time.sleep(0.5)   # now a zombie: this process has not waited for it
        assert check() is None   # one look: Prefect may be starting its replacement
        assert "temporary Prefect server stopped" in check()
    finally:
        server.kill()
        server.wait()


def test_a_configured_server_counts_as_gone_only_when_unreachable_for_lost_after_s():
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from flows.server_watchdog import configured_server_lost

    now = [0.0]
    gone = configured_server_lost(f"http://127.0.0.1:{free_port()}/api", lost_after_s=10, clock=lambda: now[0])
    assert gone() is None
    now[0] = 9.9
    assert gone() is None
    now[0] = 10.0
    assert "could not be reached for 10 s" in gone()

    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    silent = socket.create_server(("127.0.0.1", 0))   # accepts connections (the kernel does), never answers
    try:
        for port in (server.server_port, silent.getsockname()[1]):
            there = configured_server_lost(f"http://127.0.0.1:{port}/api", lost_after_s=0.5, clock=lambda: now[0])
            now[0] += 100
            assert there() is None, port   # a 404, or no answer in time: a server is there, busy
    finally:
        server.shutdown()
        silent.close()


# -- `pforge run --nproc N`: the ranks of a data-parallel run ---------------------------------------
# A `pforge` process (it ends itself on signals, flows/interrupts.py) launching the ranks, as
# `pforge run CONFIG --stage train:NAME --nproc 2` does.
LAUNCHER = ("import sys; from pathlib import Path; from flows.interrupts import stop_on_signals; stop_on_signals(); "
            "from flows.ddp import launch; sys.exit(launch(sys.argv[1:], Path.cwd()))")


def _stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("launched_by", ["pforge", "torchrun"])
def test_under_nproc_rank_zero_watches_the_server_and_every_rank_stops_when_it_dies(tmp_path, launched_by):
    """tests/ddp_server_death.py: rank 0's stand-in server dies while rank 1 waits on rank 0 in a
    collective. Through `pforge`: one line, the last, exit 2, no traceback (torchrun's report of its
    ranks' end among them). Under torchrun alone: rank 0's line, and torchrun reports the failure.
    Either way no rank is left running and no scratch folder is left behind."""
    from flows.ddp import torchrun_command
    from flows.server_watchdog import STOPPED

    out, scratch = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    scratch.mkdir()
    env = pforge_env(tmp_path, TMPDIR=str(scratch), OMP_NUM_THREADS="1", PYTHONPATH=str(PROJECT_ROOT),
                     **dict.fromkeys(("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")))
    command = torchrun_command(2, "tests.ddp_server_death", str(out))
    if launched_by == "pforge":
        command = [sys.executable, "-c", LAUNCHER, *command]
    log = tmp_path / "run.log"
    process = subprocess.Popen(command, cwd=PROJECT_ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                               start_new_session=True, preexec_fn=default_signals)
    try:
        code = process.wait(timeout=600)  # torchrun and two ranks importing torch, on a loaded machine too
        exited_at = time.time()
        started = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
        left = [pid for record in started for key, pid in record.items()
                if key in ("pid", "server", "torchrun") and not _stopped(pid)]
    finally:
        kill_session(process)
        for record in [json.loads(p.read_text()) for p in out.glob("rank*.json")]:
            for pid in (record["pid"], *([record["server"]] if "server" in record else [])):
                with contextlib.suppress(psutil.Error):  # the ranks are sessions of their own
                    psutil.Process(pid).kill()
    output = log.read_text(errors="replace")
    assert len(started) == 2, output[-3000:]
    rank0, rank1 = started
    line = f"pforge: error: the run's temporary Prefect server stopped; {STOPPED}"
    assert [row for row in output.splitlines() if row.startswith("pforge:")] == [line], output[-3000:]
    if launched_by == "pforge":
        assert code == 2 and output.rstrip().splitlines()[-1] == line, output[-3000:]
        assert "Traceback" not in output and "ChildFailedError" not in output, output[-3000:]
        assert exited_at - rank0["killed_at"] < STOPS_WITHIN_S
    else:
        assert code != 0
    assert left == [], (left, output[-3000:])
    assert not Path(rank1["scratch"]).exists()
    if launched_by == "pforge":  # torchrun's own temporary folder too, which a stopped torchrun cannot remove
        assert list(scratch.iterdir()) == [], list(scratch.iterdir())


def test_only_rank_zero_watches_the_server_and_ends_the_run_its_own_way(monkeypatch):
    """flows/ddp.py: rank 0's flow run alone talks to the server, so it alone watches it, and hands
    its line to the launcher (`_end_run_from_rank_zero`), not to the signal machinery of a `pforge`
    process it is not; the other ranks start no watchdog."""
    from flows import ddp, server_watchdog
    from flows.server_watchdog import POLL_S, STOPPED
    from tasks.training.distributed import Ranks

    lost = "the run's temporary Prefect server stopped"
    monkeypatch.setattr(server_watchdog, "ephemeral_server_lost", lambda: lambda: lost)
    monkeypatch.setattr(server_watchdog, "configured_server_lost", lambda url: lambda: lost)
    ended: list[str] = []
    monkeypatch.setattr(ddp, "_end_run_from_rank_zero", ended.append)
    for rank in (1, 2, 0):
        with ddp.watching_the_server(Ranks(rank=rank, world_size=3)):
            watching = [t for t in threading.enumerate() if t.name == "pforge-server-watchdog" and t.is_alive()]
            deadline = time.monotonic() + (10 if rank == 0 else 3 * POLL_S)
            while not ended and time.monotonic() < deadline:
                time.sleep(0.05)
        assert (len(watching), set(ended)) == ((1, {f"pforge: error: {lost}; {STOPPED}"}) if rank == 0 else (0, set()))
