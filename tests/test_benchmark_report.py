"""benchmarks/reporting.py, the benchmarks' one report writer: result files written whole or not at
all, a header that names the command reproducing the run from where the script is now, and the
committed results naming scripts that exist."""
import ast
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.benchmark_scripts import BENCHMARKS, benchmark_script

ROOT = BENCHMARKS.parent
SCRIPT_PATH = re.compile(r"benchmarks/[a-z0-9_/]+\.py")  # lower case: `benchmarks/NAME.py` is a placeholder


@pytest.fixture(scope="module")
def reporting():
    with benchmark_script("reporting") as module:
        yield module


@pytest.fixture
def results(reporting, tmp_path, monkeypatch):
    folder = tmp_path / "results"
    monkeypatch.setattr(reporting, "RESULTS", folder)
    return folder


# --------------------------------------------------------------------------- files
def test_a_report_is_its_markdown_with_its_json_beside_it_under_results(reporting, results):
    path = reporting.write_report("bench_cpu", "# Bench\n\n| a |\n\n\n", {"out": Path("r.json"), "n": 1})
    assert path == results / "bench_cpu.md"
    assert path.read_text(encoding="utf-8") == "# Bench\n\n| a |\n"
    assert json.loads((results / "bench_cpu.json").read_text(encoding="utf-8")) == {"out": "r.json", "n": 1}
    assert sorted(p.name for p in results.iterdir()) == ["bench_cpu.json", "bench_cpu.md"]  # no temporaries
    reporting.write_report("bench_cpu", "# Again")  # no data: the Markdown alone, the JSON left as it was
    assert path.read_text(encoding="utf-8") == "# Again\n" and (results / "bench_cpu.json").exists()


def test_a_path_is_written_where_it_points_and_a_name_goes_under_results(reporting, results, tmp_path):
    assert reporting.results_file("x") == results / "x.md"
    assert reporting.results_file("x", ".json") == results / "x.json"
    assert reporting.write_json(tmp_path / "r.json", [1, 2]) == tmp_path / "r.json"
    assert json.loads((tmp_path / "r.json").read_text(encoding="utf-8")) == [1, 2]
    assert reporting.write_report(tmp_path / "out" / "study.md", "t", {"a": 1}) == tmp_path / "out" / "study.md"
    assert (tmp_path / "out" / "study.json").exists()
    with pytest.raises(ValueError):
        reporting.results_file("sub/x")  # a str is a name, never a path
    with pytest.raises(ValueError):
        reporting.write_report(tmp_path / "r.json", "t", {"a": 1})  # its JSON would overwrite it


def test_a_write_that_fails_keeps_the_files_it_was_replacing(reporting, results, monkeypatch):
    import storage.atomic

    results.mkdir()
    (results / "bench_cpu.md").write_text("old md", encoding="utf-8")
    (results / "bench_cpu.json").write_text("old json", encoding="utf-8")

    def replace_fails(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(storage.atomic.os, "replace", replace_fails)
    with pytest.raises(OSError):
        reporting.write_report("bench_cpu", "new md", {"new": 1})
    with pytest.raises(OSError):
        reporting.write_json("bench_cpu", {"new": 1})
    assert (results / "bench_cpu.md").read_text(encoding="utf-8") == "old md"
    assert (results / "bench_cpu.json").read_text(encoding="utf-8") == "old json"
    assert sorted(p.name for p in results.iterdir()) == ["bench_cpu.json", "bench_cpu.md"]


def test_data_that_is_not_json_writes_nothing(reporting, results):
    with pytest.raises(TypeError):
        reporting.write_report("bench_cpu", "md", {("a", 1): 2})
    assert not results.exists() or not any(results.iterdir())


# --------------------------------------------------------------------------- header
def test_the_header_names_the_command_from_the_scripts_own_path_the_cpu_and_the_date(reporting, monkeypatch):
    monkeypatch.setattr(reporting, "cpu_name", lambda: "Test CPU (family 25 model 1)")
    script = BENCHMARKS / "quality" / "dense_quality.py"
    lines = reporting.header("Dense quality", str(script), ["--out", "a b", "--seed", 3], env="HF_HUB_OFFLINE=1").split("\n")
    assert lines[0] == "# Dense quality"
    assert lines[2] == "`HF_HUB_OFFLINE=1 python benchmarks/quality/dense_quality.py --out 'a b' --seed 3`"
    assert re.fullmatch(r"CPU: Test CPU \(family 25 model 1\); \d{4}-\d\d-\d\dT\d\d:\d\dZ", lines[4])
    assert lines[1] == lines[3] == lines[5] == "" and len(lines) == 6
    assert reporting.command(BENCHMARKS / "bm25_throughput.py", []) == "python benchmarks/bm25_throughput.py"


def test_every_script_names_itself_by_its_own_file(reporting):
    """A header built from `__file__` follows the script when it moves; a written-out path would not."""
    calls = 0
    for path in sorted(BENCHMARKS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in ("header", "command") and path.name != "reporting.py":
                calls += 1
                script = node.args[1] if name == "header" else node.args[0]
                assert isinstance(script, ast.Name) and script.id == "__file__", f"{path}:{node.lineno}"
    assert calls >= 20


def test_cpu_name_is_lscpus_model_with_its_family_and_model(reporting, monkeypatch):
    from flows.study import machine

    def named(lscpu: str) -> str:
        monkeypatch.setattr(machine.subprocess, "run", lambda *a, **k: SimpleNamespace(stdout=lscpu))
        reporting.cpu_name.cache_clear()
        return reporting.device_name("cpu")

    try:
        assert named("Architecture: x86_64\nModel name: AMD EPYC\nCPU family: 25\nModel: 1\n") == \
            "AMD EPYC (family 25 model 1)"
        assert named("Model name: Intel(R) Xeon(R) Platinum 8480+\n") == "Intel(R) Xeon(R) Platinum 8480+"
    finally:
        reporting.cpu_name.cache_clear()


# --------------------------------------------------------------------------- tables
def test_tables_right_align_numbers_or_follow_the_given_alignment(reporting):
    assert reporting.markdown_table(["a", "b"], [["x", 1]]).splitlines() == ["| a | b |", "|---|---:|", "| x | 1 |"]
    assert reporting.markdown_table(["a", "b", "c"], [["x", "y", ""]], numeric_from=2).splitlines() == [
        "| a | b | c |", "|---|---|---:|", "| x | y |  |"]
    assert reporting.markdown_table(["lr", "loss", "s"], [], align="rlr").splitlines() == ["| lr | loss | s |", "|---:|---|---:|"]
    assert reporting.table_row([0.5, "a, b", 3]) == "| 0.5 | a, b | 3 |"
    with pytest.raises(ValueError):
        reporting.markdown_table(["a", "b"], [], align="l")


# --------------------------------------------------------------------------- committed files
def test_every_committed_result_names_scripts_that_exist():
    named = {}
    for page in sorted((BENCHMARKS / "results").glob("*.md")):
        for script in SCRIPT_PATH.findall(page.read_text(encoding="utf-8")):
            named.setdefault(script, []).append(page.name)
    assert "benchmarks/quality/xmoco_queue_study.py" in named  # the check sees the commands
    missing = {script: pages for script, pages in named.items() if not (ROOT / script).is_file()}
    assert not missing, f"results name scripts that are not there: {missing}"


def test_every_script_path_a_benchmark_names_exists():
    for path in sorted(BENCHMARKS.rglob("*.py")):
        for script in SCRIPT_PATH.findall(path.read_text(encoding="utf-8")):
            assert (ROOT / script).is_file(), f"{path.relative_to(ROOT)} names {script}"
