"""The benchmark scripts' one report writer: the header that says how a result was made (the command
that reproduces it, the CPU, the date), Markdown tables, and the result files, each written
atomically (a run killed while writing leaves the file it was replacing, never half of a new one).

    print(reporting.header("Encoding throughput (SQuAD dev)", __file__, argv))
    print(reporting.markdown_table(["system", "passages/s"], rows))
    reporting.write_report("xmoco_queue_study_cpu", markdown, data)   # results/NAME.md and .json
    reporting.write_json(Path(args.out), result)                      # a path a script was given

A target given as a str is a name under `RESULTS` (benchmarks/results/); a Path is the file itself.
"""
from __future__ import annotations

import functools
import json
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import _bootstrap  # noqa: F401  (puts the project on sys.path)

ROOT = _bootstrap.ROOT
RESULTS = ROOT / "benchmarks" / "results"


# --------------------------------------------------------------------------- header
def script_path(script: str | Path) -> str:
    """The script's path from the project root (`benchmarks/quality/dense_quality.py`), taken from
    where the file is: a script that moves names its new place."""
    path = Path(script).resolve()
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def command(script: str | Path, argv: Sequence[str] | None = None, *, env: str = "") -> str:
    """The command that reproduces a run: `[env] python benchmarks/... ARGS`, with the arguments
    main() parsed (`argv`; None: this process's)."""
    args = shlex.join(sys.argv[1:] if argv is None else [str(a) for a in argv])
    return " ".join(part for part in (env, "python", script_path(script), args) if part)


@functools.lru_cache(maxsize=1)
def cpu_name() -> str:
    """lscpu's model name with its family and model ("AMD EPYC (family 25 model 1)"): the name alone
    does not tell a Zen 1 from a Zen 3."""
    from flows.study.machine import describe_cpu

    return describe_cpu()["key"]


def device_name(device: str = "cpu") -> str:
    """The GPU's name on CUDA, else the CPU's."""
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.get_device_name()
    return cpu_name()


def header(title: str, script: str | Path, argv: Sequence[str] | None = None, *, env: str = "") -> str:
    """`# title`, the command that reproduces the run, and `CPU: NAME; DATE` (UTC, to the minute),
    a blank line after each."""
    when = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    return f"# {title}\n\n`{command(script, argv, env=env)}`\n\nCPU: {cpu_name()}; {when}\n"


# --------------------------------------------------------------------------- tables
def table_row(cells: Sequence[Any]) -> str:
    """One Markdown table row (for a script that prints its rows as they are measured)."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], numeric_from: int = 1, *,
                   align: str | None = None) -> str:
    """A Markdown table; columns from `numeric_from` on are right-aligned, or `align` gives one
    letter per column (`l` or `r`)."""
    align = align or "l" * numeric_from + "r" * (len(header) - numeric_from)
    if len(align) != len(header):
        raise ValueError(f"align {align!r}: one letter per column, {len(header)} columns")
    lines = [table_row(header), "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    return "\n".join(lines + [table_row(row) for row in rows])


# --------------------------------------------------------------------------- files
def results_file(target: str | Path, suffix: str = ".md") -> Path:
    """A str names a file under RESULTS (`bm25_throughput_cpu` -> RESULTS/bm25_throughput_cpu.md);
    a Path is the file itself."""
    if isinstance(target, Path):
        return target
    if "/" in target or "\\" in target:
        raise ValueError(f"{target!r}: a name under {RESULTS}, or pass a Path")
    return RESULTS / (target if target.endswith(suffix) else target + suffix)


def _write(path: Path, text: str) -> Path:
    from storage.atomic import atomic_write_text

    return atomic_write_text(path, text)


def json_text(data: Any, indent: int = 2) -> str:
    # default=str: argparse namespaces hold Paths
    return json.dumps(data, indent=indent, default=str) + "\n"


def write_json(target: str | Path, data: Any, *, indent: int = 2) -> Path:
    """`data` as JSON at `target` (see results_file), atomically; returns the path."""
    return _write(results_file(target, ".json"), json_text(data, indent))


def write_report(target: str | Path, markdown: str, data: Any = None, *, indent: int = 2) -> Path:
    """The Markdown at `target` (see results_file) and, given `data`, its JSON beside it (the same
    name, .json), each atomically; returns the Markdown's path."""
    path = results_file(target)
    if path.suffix == ".json":
        raise ValueError(f"{path}: the Markdown's path (its JSON goes beside it)")
    raw = None if data is None else json_text(data, indent)  # before any write: unserialisable data writes nothing
    _write(path, markdown.rstrip("\n") + "\n")
    if raw is not None:
        _write(path.with_suffix(".json"), raw)
    return path
