"""What a killed `pforge` leaves running is stopped by the next start: processes carrying the tag
of an owner that no longer runs (flows/orphans.py). The end-to-end case, a real run killed with
SIGKILL and its Prefect server, is in tests/test_cli_lifecycle.py."""
import os
import subprocess
import sys

from flows.orphans import OWNER_VARIABLE, mark_descendants, owner_alive, owner_tag, stop_orphans

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


def _tagged(tag: str | None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != OWNER_VARIABLE}
    if tag is not None:
        env[OWNER_VARIABLE] = tag
    return subprocess.Popen(SLEEP, env=env)


def test_the_descendants_of_a_dead_owner_are_stopped_and_nothing_else():
    owner = subprocess.Popen(SLEEP)
    dead_tag = owner_tag(owner.pid)
    processes = {
        "orphan": _tagged(dead_tag),
        "pid reused by another process": _tagged(f"{os.getpid()}:1.00"),  # pytest runs, started later
        "living owner": _tagged(owner_tag(os.getpid())),
        "malformed tag": _tagged("not-a-pid"),
        "untagged": _tagged(None),
    }
    try:
        owner.kill()
        owner.wait(10)
        assert not owner_alive(dead_tag) and owner_alive(owner_tag(os.getpid()))
        stopped = stop_orphans(grace_s=5)
        assert sorted(stopped) == sorted([processes["orphan"].pid, processes["pid reused by another process"].pid])
        for name, process in processes.items():
            try:
                process.wait(10 if process.pid in stopped else 0.2)
            except subprocess.TimeoutExpired:
                pass
            assert (process.poll() is not None) == (process.pid in stopped), name
    finally:
        for process in processes.values():
            process.kill()
            process.wait(10)


def test_a_process_tags_its_own_environment_for_its_children():
    env = {}
    tag = mark_descendants(env)
    assert env == {OWNER_VARIABLE: tag} and tag.startswith(f"{os.getpid()}:") and owner_alive(tag)
