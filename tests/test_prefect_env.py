"""The Prefect environment of a `pforge` process: defaults a user's setting overrides, and a
private ephemeral-server database per process (removed at exit, or by the next start)."""
import os
import subprocess
import sys

import pytest

from flows import prefect_env
from flows.prefect_env import DATABASE_DIR_PREFIX, configure_prefect_environment, remove_stale_database_dirs


def test_defaults_fill_only_what_the_user_left_unset(tmp_path, release_locks):
    env = {"PREFECT_HOME": str(tmp_path)}
    configure_prefect_environment(env, temp_root=str(tmp_path))
    assert env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    assert int(env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"]) >= 120  # a loaded 2-core machine
    user = {"PREFECT_HOME": str(tmp_path), "PREFECT_SERVER_ANALYTICS_ENABLED": "true", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "30"}
    configure_prefect_environment(user, temp_root=str(tmp_path))
    assert user["PREFECT_SERVER_ANALYTICS_ENABLED"] == "true"
    assert user["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] == "30"


@pytest.fixture
def release_locks():
    yield
    while prefect_env._held_locks:
        prefect_env._held_locks.pop().close()


def test_the_first_process_keeps_the_shared_database_and_the_next_ones_get_their_own(tmp_path, release_locks):
    home = tmp_path / "home"
    envs = [{"PREFECT_HOME": str(home)} for _ in range(3)]
    folders = [configure_prefect_environment(env, temp_root=str(tmp_path)) for env in envs]
    # the first: Prefect's default database under PREFECT_HOME, its history as before
    assert folders[0] is None and "PREFECT_API_DATABASE_CONNECTION_URL" not in envs[0]
    assert (home / prefect_env.SHARED_DATABASE_LOCK).is_file()
    # while it lives, the others each get a database of their own
    assert folders[1] != folders[2] and all(f.is_dir() and f.parent == tmp_path for f in folders[1:])
    assert envs[1]["PREFECT_API_DATABASE_CONNECTION_URL"] == f"sqlite+aiosqlite:///{folders[1] / 'prefect.db'}"
    prefect_env._held_locks.pop().close()  # the first process exits (the kernel frees its lock)
    assert configure_prefect_environment({"PREFECT_HOME": str(home)}, temp_root=str(tmp_path)) is None


def test_a_chosen_database_or_server_is_left_alone(tmp_path, release_locks):
    chosen = {"PREFECT_HOME": str(tmp_path), "PREFECT_API_DATABASE_CONNECTION_URL": "postgresql+asyncpg://db/prefect"}
    assert configure_prefect_environment(chosen, temp_root=str(tmp_path)) is None
    assert chosen["PREFECT_API_DATABASE_CONNECTION_URL"] == "postgresql+asyncpg://db/prefect"
    served = {"PREFECT_HOME": str(tmp_path), "PREFECT_API_URL": "http://127.0.0.1:4200/api"}  # no ephemeral server
    assert configure_prefect_environment(served, temp_root=str(tmp_path)) is None
    assert "PREFECT_API_DATABASE_CONNECTION_URL" not in served
    assert not prefect_env._held_locks and not (tmp_path / prefect_env.SHARED_DATABASE_LOCK).exists()


def test_folders_of_dead_processes_are_removed_at_the_next_start(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"{DATABASE_DIR_PREFIX}{int(dead.stdout)}-abc"
    live = tmp_path / f"{DATABASE_DIR_PREFIX}{os.getpid()}-abc"
    other = tmp_path / "pforge-prefect-notapid"
    for folder in (stale, live, other):
        folder.mkdir()
        (folder / "prefect.db").write_bytes(b"x")
    assert remove_stale_database_dirs(str(tmp_path)) == [stale]
    assert live.is_dir() and other.is_dir() and not stale.exists()
