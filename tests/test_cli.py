"""The command line as a user meets it: one clear line per error, non-zero exits, nothing
registered by a failed stage, and a DuckDB reader that may hold the catalog open meanwhile."""
import os
import subprocess
import sys
import time

import pytest

from flows.cli import COMMANDS, main
from storage import ArtifactStore
from tasks.config import PROJECT_ROOT

TINY = PROJECT_ROOT / "configs" / "tiny.yaml"


@pytest.fixture()
def store_with_one_artifact(tmp_path):
    import pyarrow as pa

    from storage import write_table

    store = ArtifactStore(tmp_path)
    store.materialize("passages", "1", {}, {}, lambda d: {"stats": {"rows": write_table(d, pa.table({"pid": ["a", "b"]}))}})
    return tmp_path


@pytest.mark.parametrize("query,params,message", [
    ("SELEC 1", [], "Parser Error"),
    ("SELECT * FROM no_such_view", [], "no_such_view"),
    ("SELECT * FROM passages WHERE pid = $1", [], "parameter"),
    ("DELETE FROM artifacts", [], "read-only"),
])
def test_sql_errors_are_one_line_and_exit_2(store_with_one_artifact, capsys, query, params, message):
    argv = ["--root", str(store_with_one_artifact), "sql", query] + [f"--param={p}" for p in params]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pforge: error: catalog query failed") and message.lower() in err[0].lower(), err


def test_sql_binds_parameters(store_with_one_artifact, capsys):
    assert main(["--root", str(store_with_one_artifact), "sql", "SELECT count(*) AS n FROM passages WHERE pid = $1",
                 "--param", "a"]) == 0
    assert capsys.readouterr().out.split() == ["n", "1"]


def test_a_failing_stage_prints_one_clear_line_and_registers_nothing(tmp_path):
    data = tmp_path / "data"
    (data / "squad").mkdir(parents=True)
    (data / "squad" / "dev.json").write_text('{"version": "1.1", "data": [{"title": "A", "paragraphs": [}')
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"name: bad\ndata: {{data_root: {data}, squad: {{path: squad/dev.json, download: null}}}}\n")
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "HF_HUB_OFFLINE": "1",
           "PREFECT_HOME": str(tmp_path / "prefect")}  # its own ephemeral server database
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "--root", str(tmp_path / "store"), "run", str(bad)],
                          cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith(f"pforge: error: {data / 'squad' / 'dev.json'}: "), proc.stderr[-3000:]
    assert ArtifactStore(tmp_path / "store").list_artifacts() == []
    debug = subprocess.run([sys.executable, "-m", "flows.cli", "--root", str(tmp_path / "store"), "run", str(bad), "--debug"],
                           cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert debug.returncode == 2 and "Traceback" in debug.stderr


READER = r'''
import sys, time, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
before = con.execute("SELECT count(*) FROM artifacts").fetchone()[0]
print("holding", before, flush=True)
sys.stdin.readline()  # hold the connection until told
print("still", con.execute("SELECT count(*) FROM artifacts").fetchone()[0], flush=True)
'''


def test_a_reader_holding_the_catalog_open_does_not_block_a_whole_run(prefect_harness, shared_data, tmp_path, capsys):
    from flows.pipeline import pipeline
    from tasks.config import load_config

    root = tmp_path / "store"
    ArtifactStore(root)  # an empty catalog to open
    reader = subprocess.Popen([sys.executable, "-c", READER, str(root / "catalog.duckdb")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().split() == ["holding", "0"]
        started = time.monotonic()
        versions = pipeline(config=load_config(TINY), root=str(root))
        assert time.monotonic() - started < 120  # no 30-40 s lock waits per commit
        assert main(["--root", str(root), "sql", "SELECT count(*) AS n FROM artifacts"]) == 0
        assert capsys.readouterr().out.split() == ["n", str(len(versions))]
        assert main(["--root", str(root), "artifacts"]) == 0
        reader.stdin.write("\n")
        reader.stdin.flush()
        # The reader kept its snapshot, unharmed, through every swap of the catalog.
        assert reader.stdout.readline().split() == ["still", "0"]
    finally:
        reader.kill()
        reader.wait(10)


@pytest.mark.parametrize("stage", [None, "chunk"])
def test_nproc_runs_only_a_training_stage(stage, tmp_path, capsys):
    argv = ["run", str(PROJECT_ROOT / "configs" / "tiny.yaml"), "--nproc", "2", "--root", str(tmp_path)]
    assert main(argv + (["--stage", stage] if stage else [])) == 2
    assert "--nproc 2 runs one training stage (--stage train:NAME)" in capsys.readouterr().err
    assert not (tmp_path / "catalog.duckdb").exists()


def test_nproc_launches_flows_ddp_under_torchrun(tmp_path, monkeypatch):
    launched = []
    monkeypatch.setattr(subprocess, "run", lambda argv, cwd: launched.append(argv) or subprocess.CompletedProcess(argv, 0))
    config = PROJECT_ROOT / "configs" / "dpr.yaml"
    assert main(["run", str(config), "--stage", "train:dpr", "--nproc", "2", "--root", str(tmp_path)]) == 0
    assert launched == [[sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                         "-m", "flows.ddp", str(config), "--stage", "train:dpr", "--root", str(tmp_path)]]


@pytest.mark.parametrize("command", [[]] + [[name] for name in sorted(COMMANDS)])
def test_every_help_page_prints(command, capsys):
    # argparse %-formats help strings: a bare '%' in one (as '95% interval' was) crashed `pforge --help`
    with pytest.raises(SystemExit) as exit_info:
        main(command + ["--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: pforge")
