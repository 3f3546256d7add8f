"""benchmarks/demo_run.py: what it reads from a run (stage lines, manifests, the report) and the
results page it writes, on a made-up run (the script's own run is `make demo`'s cost)."""
import json
from pathlib import Path

from tests.benchmark_scripts import benchmark_script

OUTPUT = """2026-12-02 05:00:00,000 INFO Beginning flow run 'x' for flow 'passage-forge'
2026-12-02 05:00:01,000 INFO ingest_documents: running
2026-12-02 05:00:02,000 INFO ingest_documents: documents d3e0031b3b9e498f (built)
2026-12-02 05:00:03,000 INFO chunk: passages ad7b224d8fd80958 (cache hit)
2026-12-02 05:00:09,000 INFO evaluate: evaluation 4ce8a0a1fb38dcc8 (built)
report: /tmp/r/evaluation/4ce8a0a1fb38dcc8/report.md
"""
REPORT = "# Evaluation: demo\n\n## Split: all\n\n| a |\n\n## Split: test\n\n| System | Top-1 |\n| bm25 | 70.4 |\n\n## Gold linking\n\nx\n"


def _manifest(root: Path, stage: str, version: str, created: str, build_s: float) -> None:
    folder = root / stage / version
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"stage": stage, "version": version, "created_at": created,
                                                      "timings": {"build_s": build_s}}))


def test_it_reads_the_stages_the_pipeline_span_the_test_split_and_a_sample(tmp_path):
    root = tmp_path / "r"
    _manifest(root, "documents", "d3e0031b3b9e498f", "2026-12-02T05:00:02+00:00", 1.5)
    _manifest(root, "evaluation", "4ce8a0a1fb38dcc8", "2026-12-02T05:00:09+00:00", 2.0)
    (root / ".tmp-x" / "v").mkdir(parents=True)   # a folder in flight is no artifact
    with benchmark_script("demo_run") as script:
        built = script.manifests(root)
        assert [m["stage"] for m in built] == ["documents", "evaluation"]
        stages = script.stage_builds(OUTPUT, built)
        assert [(s["stage"], s["how"], s["build_s"]) for s in stages] == [
            ("ingest_documents", "built", 1.5), ("chunk", "cache hit", None), ("evaluate", "built", 2.0)]
        assert script.pipeline_seconds(built) == 8.5   # 05:00:00.5 (02 less 1.5) to 05:00:09
        assert script.report_section(REPORT, "Split: test") == "| System | Top-1 |\n| bm25 | 70.4 |"
        sample = script.output_sample(OUTPUT.replace("/tmp/r", str(root)), root)
        assert sample.splitlines()[0] == "INFO ingest_documents: documents d3e0031b3b9e498f (built)"
        assert "running" not in sample and sample.endswith("report: artifacts/evaluation/4ce8a0a1fb38dcc8/report.md")


def test_one_entry_per_cpu_the_last_run_replacing_the_one_before(tmp_path):
    results = tmp_path / "demo_run_cpu.json"

    def entry(key: str, wall: float) -> dict:
        return {"config": "configs/demo.yaml", "cpu": {"key": key, "flags": ["avx2"]}, "date": "2026-12-02",
                "commit": "0123456789abcdef", "exit_code": 0, "wall_s": wall, "pipeline_s": wall - 30, "install_s": None,
                "output_lines": 9, "stages": [{"stage": "chunk", "build_s": 1.0}], "test_split": "| t |", "sample": "s"}

    with benchmark_script("demo_run") as script:
        results.write_text(json.dumps([entry("Zen 3", 700.0), entry("Zen 5", 250.0)]))
        entries = script.merged(results, entry("Zen 3", 640.0))
        assert [(e["cpu"]["key"], e["wall_s"]) for e in entries] == [("Zen 5", 250.0), ("Zen 3", 640.0)]
        page = script.markdown(entries)
    assert "| Zen 3 | avx2 | 10 min 10 s | 10 min 40 s | - |" in page
    for heading in ("## Times", "## Stages", "## Sample output", "## Test split"):
        assert heading in page
