"""What `make demo` costs on this CPU, and what it prints: one `pforge run configs/demo.yaml` on a
new artifact root, timed, its output kept (trimmed) for the docs.

    .venv/bin/python benchmarks/demo_run.py [--config configs/demo.yaml] [--install-seconds S]

Records, per CPU (lscpu's model, family and model: one entry each, the last run replacing the
one before), the run's wall time (the Prefect server's start included), the pipeline's time (the
first stage's start to the last stage's commit, from the manifests), each stage's build time, the
number of output lines, the test split of the report and a sample of the output; then rewrites
benchmarks/results/demo_run_cpu.md from every entry ("Times", "Stages", "Sample output": the docs
include those sections). `--install-seconds` records a `make install` measured separately
(`time make install` in a fresh clone). Run it on a quiet machine: a timing taken while other
work shares the cores says little. The runtime cache (ONNX exports, llama.cpp's GGUF) is this
machine's, as `make demo` would find it: a first run on a machine also pays for those.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import _bootstrap  # noqa: F401  (puts the project on sys.path)
import reporting  # noqa: E402
from flows.study.machine import describe_cpu  # noqa: E402
from flows.study.records import code_commit  # noqa: E402

ROOT = _bootstrap.ROOT
RESULTS_JSON = reporting.RESULTS / "demo_run_cpu.json"
PFORGE = Path(sys.executable).with_name("pforge")
STAGE_LINE = re.compile(r"INFO (\S+): (\S+) ([0-9a-f]{16}) \((built|cache hit)\)")
SAMPLE_STAGE_LINES = 6   # the first stages' lines, then "...", then the last one


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "demo.yaml")
    parser.add_argument("--install-seconds", type=float, help="a `make install` measured separately, to record")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="build into DIR and keep it (default: a temporary root)")
    parser.add_argument("--results", type=Path, default=RESULTS_JSON)
    return parser.parse_args(argv)


def run_demo(config: Path, root: Path, log: Path) -> tuple[int, float]:
    """(exit code, wall seconds) of one `pforge run CONFIG` on `root`, its output in `log`."""
    started = time.perf_counter()
    with log.open("wb") as out:
        code = subprocess.run([str(PFORGE), "--root", str(root), "run", str(config)], cwd=ROOT,
                              stdout=out, stderr=subprocess.STDOUT).returncode
    return code, time.perf_counter() - started


def manifests(root: Path) -> list[dict]:
    """Every committed artifact's manifest in `root` (a new root: this run's builds only)."""
    found = []
    for path in sorted(root.glob("*/*/manifest.json")):
        if not any(part.startswith(".") for part in path.relative_to(root).parts):
            found.append(json.loads(path.read_text(encoding="utf-8")))
    return found


def stage_builds(output: str, built: list[dict]) -> list[dict]:
    """Each stage the output names, in order, with its artifact's recorded build seconds."""
    build_s = {(m.get("stage"), m.get("version")): (m.get("timings") or {}).get("build_s") for m in built}
    rows = []
    for stage, artifact, version, how in STAGE_LINE.findall(output):
        rows.append({"stage": stage, "artifact": artifact, "version": version, "how": how,
                     "build_s": build_s.get((artifact, version))})
    return rows


def pipeline_seconds(built: list[dict]) -> float | None:
    """From the first build's start (its commit time less its build time) to the last commit."""
    spans = []
    for m in built:
        build_s, created = (m.get("timings") or {}).get("build_s"), m.get("created_at")
        if build_s is not None and created:
            end = datetime.fromisoformat(created).timestamp()
            spans.append((end - build_s, end))
    return round(max(e for _, e in spans) - min(s for s, _ in spans), 1) if spans else None


def report_section(report: str, heading: str) -> str:
    """The body of the report's `## heading` section ('' when it has none)."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", report, re.MULTILINE | re.DOTALL)
    return match.group(1).strip() if match else ""


def output_sample(output: str, root: Path) -> str:
    """The run's output as a user reads it: the first stages' lines, the last, the report's path
    (under `artifacts/`, the root `make demo` builds into)."""
    stage_lines = [line for line in output.splitlines() if STAGE_LINE.search(line)]
    tail = [line for line in output.splitlines() if line.startswith("report: ")]
    shown = stage_lines[:SAMPLE_STAGE_LINES]
    if len(stage_lines) > SAMPLE_STAGE_LINES:
        shown += ["...", stage_lines[-1]]
    text = "\n".join(re.sub(r"^\S+ \S+ ", "", line) for line in shown + tail)   # the timestamps go
    return text.replace(str(root), "artifacts")


def entry_for(config: Path, root: Path, log: Path, code: int, wall_s: float, install_s: float | None) -> dict:
    output = log.read_text(encoding="utf-8", errors="replace")
    built = manifests(root)
    reports = sorted(root.glob("evaluation/*/report.md"))
    report = reports[-1].read_text(encoding="utf-8") if reports else ""
    return {"config": str(config.relative_to(ROOT)), "cpu": describe_cpu(), "date": datetime.now(timezone.utc).date().isoformat(),
            **code_commit(ROOT), "exit_code": code, "wall_s": round(wall_s, 1), "pipeline_s": pipeline_seconds(built),
            "install_s": install_s, "output_lines": len(output.splitlines()), "stages": stage_builds(output, built),
            "test_split": report_section(report, "Split: test"), "sample": output_sample(output, root)}


def merged(results: Path, entry: dict) -> list[dict]:
    """The recorded entries with this CPU's replaced by `entry`."""
    entries = json.loads(results.read_text(encoding="utf-8")) if results.exists() else []
    return [e for e in entries if e["cpu"]["key"] != entry["cpu"]["key"]] + [entry]


def minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{int(seconds // 60)} min {int(round(seconds % 60)):02d} s"


def markdown(entries: list[dict]) -> str:
    times = reporting.markdown_table(
        ["CPU", "flags", "pipeline", "`pforge run`, server start included", "`make install`", "measured"],
        [[e["cpu"]["key"], ", ".join(e["cpu"]["flags"]), minutes(e["pipeline_s"]), minutes(e["wall_s"]),
          minutes(e["install_s"]), f"{e['date']}, commit {(e['commit'] or 'unknown')[:10]}"] for e in entries],
        align="llrrrl")
    last = entries[-1]
    stages = reporting.markdown_table(["stage", "build (s)"], [[s["stage"], f"{s['build_s']:.1f}"] for s in last["stages"]
                                                              if s["build_s"] is not None])
    return "\n".join([
        f"# `pforge run {last['config']}`: time and output",
        "", f"Written by `{reporting.script_path(__file__)}` (one run on a new artifact root per CPU, the last replacing "
        "the one before).",
        "", "## Times", "", times,
        "", "## Stages", "", f"On {last['cpu']['key']}, {last['date']}:", "", stages,
        "", "## Sample output", "",
        f"`pforge run` prints {last['output_lines']} lines on {last['cpu']['key']}; its stage lines (the first, the last) "
        "and the report's path:", "", "```text", last["sample"], "```",
        "", "## Test split", "", last["test_split"] or "(no report)", ""])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = args.config.resolve()
    with tempfile.TemporaryDirectory(prefix="pforge-demo-run-") as tmp:
        root = args.keep or Path(tmp) / "root"
        log = Path(tmp) / "run.log"
        code, wall_s = run_demo(config, root, log)
        entry = entry_for(config, root, log, code, wall_s, args.install_seconds)
        if code != 0:
            print(log.read_text(encoding="utf-8", errors="replace")[-4000:], file=sys.stderr)
            print(f"demo_run: pforge run exited {code}; nothing recorded", file=sys.stderr)
            return code
    entries = merged(args.results, entry)
    reporting.write_report(args.results.with_suffix(".md"), markdown(entries), entries, indent=1)
    print(f"{entry['cpu']['key']}: pipeline {minutes(entry['pipeline_s'])}, wall {minutes(wall_s)}; "
          f"wrote {args.results} and {args.results.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
