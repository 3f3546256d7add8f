"""Crash consistency of a `pforge run`: a run SIGKILLed at some moment leaves only complete versions
listed, and a rerun resumes it into a store equal to the one a clean run builds. Shared by
tests/test_random_kills.py (a few moments; its docstring says what "equal" leaves out and why, as
measured on two clean runs) and benchmarks/random_kills.py (many moments).
"""
from __future__ import annotations

import hashlib
import json
import random
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from storage import ArtifactStore
from tasks.config import PROJECT_ROOT
from tests.lifecycle import (BUILT, PFORGE, TINY, built_in, cache_hits_in, kill_session, registered, running_in_session,
                             start_run)

RUN_TIMEOUT_S = 420
STAGE_STARTS = ": running"     # the line a stage logs as it starts (flows/stage_task.py)
# What two clean runs write differently: clocks in the manifests, random ids in Lucene's files.
CLOCK_FIELDS = ("created_at", "timings")
CLOCK_FILE_FIELDS = ("mtime_ns",)
CLOCK_STATS = {"bm25_index": ("seconds", "index_seconds", "write_seconds")}


def has_random_ids(stage: str, relative: str) -> bool:
    """A Lucene index file: two clean runs write it with the same size and other bytes."""
    return stage == "bm25_index" and relative.startswith("index/") and relative != "index/write.lock"


# -- running -----------------------------------------------------------------------------------
@dataclass
class CleanRun:
    root: Path
    output: str
    seconds: float          # start to exit
    stages_s: float         # from the first stage's "running" line to the last "(built)" one: where a kill meets the store


@dataclass
class KilledRun:
    moment_s: float         # seconds after its first stage's "running" line
    output: str
    where: str              # `stage_at_kill`: "in bm25_index", "after chunk", ...
    sid: int                # its session: what is still in it after the kill, the rerun must stop
    left: list[str]         # its session's processes alive after the kill


def _wait_for_line(process, log: Path, text: str, timeout_s: float) -> bool:
    """True once `text` is in the log; False if the run exits first."""
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text(errors="replace"):
        if process.poll() is not None:
            return False
        assert time.monotonic() < deadline, f"no {text!r} within {timeout_s}s:\n{log.read_text(errors='replace')[-3000:]}"
        time.sleep(0.05)
    return True


def run_clean(root: Path, log: Path, env: dict, config: Path = TINY) -> CleanRun:
    started = time.monotonic()
    process = start_run(root, log, env, config)
    first_stage = last_commit = None
    commits = 0
    try:
        while True:
            exited = process.poll() is not None   # before the read: the last one sees every line
            output, now = log.read_text(errors="replace"), time.monotonic()
            if first_stage is None and STAGE_STARTS in output:
                first_stage = now
            if len(BUILT.findall(output)) > commits:
                commits, last_commit = len(BUILT.findall(output)), now
            if exited:
                break
            assert now - started < RUN_TIMEOUT_S, output[-3000:]
            time.sleep(0.05)
    finally:
        kill_session(process)
    assert process.returncode == 0 and first_stage is not None and last_commit is not None, output[-3000:]
    return CleanRun(root, output, time.monotonic() - started, last_commit - first_stage)


def draw_moments(seed: int, count: int, stages_s: float) -> list[float]:
    """`count` moments, seconds after the first stage starts, each drawn at random within its own
    count-th of the clean run's stage time, so that a few of them spread over the whole run."""
    rng = random.Random(seed)
    return [stages_s * (i + rng.random()) / count for i in range(count)]


def stage_at_kill(output: str) -> str:
    """Where a killed run was, from its log: "in STAGE", "after STAGE" (logged done) or "before the stages"."""
    lines = output.splitlines()
    started = [i for i, line in enumerate(lines) if line.endswith(STAGE_STARTS)]
    if not started:
        return "before the stages"
    stage = lines[started[-1]].split()[-2].rstrip(":")
    finished = any(line.split()[3:4] == [f"{stage}:"] and line.endswith(("(built)", "(cache hit)"))
                   for line in lines[started[-1] + 1:])
    return f"{'after' if finished else 'in'} {stage}"


def run_killed_at(moment_s: float, root: Path, log: Path, env: dict, config: Path = TINY) -> KilledRun:
    """Starts the run and SIGKILLs its whole session (process group) `moment_s` after its first
    stage started (or once it exits by itself, when the moment is past its end)."""
    process = start_run(root, log, env, config)
    try:
        if _wait_for_line(process, log, STAGE_STARTS, RUN_TIMEOUT_S):
            deadline = time.monotonic() + moment_s
            while process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        kill_session(process)
    output = log.read_text(errors="replace")
    return KilledRun(moment_s, output, stage_at_kill(output), process.pid, running_in_session(process.pid))


def rerun(root: Path, log: Path, env: dict, config: Path = TINY) -> tuple[int, str]:
    """Runs the config to its end on `root`: its exit code and output."""
    process = start_run(root, log, env, config)
    try:
        code = process.wait(RUN_TIMEOUT_S)
    finally:
        kill_session(process)
    return code, log.read_text(errors="replace")


def verify(root: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(PFORGE), "verify", "--root", str(root)], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


# -- what a killed run left ----------------------------------------------------------------------
def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _manifest_version(manifest: Path) -> str | None:
    try:
        return json.loads(manifest.read_text()).get("version")
    except (OSError, ValueError):   # none, or not JSON: no version names the folder
        return None


def unfinished_folders_on_disk(root: Path) -> list[str]:
    """Version folders (any not hidden: a build's .tmp-* folder is) with no manifest naming them,
    looked at before anything opens the store (opening it removes a dead build's leftovers)."""
    found = []
    for folder in sorted(root.glob("*/*")) if root.is_dir() else ():
        if folder.is_dir() and not folder.name.startswith(".") and not folder.parent.name.startswith("."):
            if _manifest_version(folder / "manifest.json") != folder.name:
                found.append(f"{folder.relative_to(root)}: a version folder without its manifest")
    return found


def _incomplete_files(path: Path, manifest: dict) -> list[str]:
    problems = []
    for relative, record in manifest["files"].items():
        file = path / relative
        if not file.is_file():
            problems.append(f"{relative}: missing")
        elif file.stat().st_size != record["bytes"] or _sha256(file) != record["sha256"]:
            problems.append(f"{relative}: not the file its manifest records")
    return problems


def partial_listings(root: Path) -> list[str]:
    """What the store lists (its artifacts, and the catalog's table) that is not a complete version:
    a temporary folder, a folder without its manifest or its files record, a recorded file missing
    or other than recorded. [] when everything listed is whole."""
    store = ArtifactStore(root)
    rows = store.list_artifacts()
    problems = []
    for row in rows:
        name, path = f"{row['stage']} {row['version']}", Path(row["path"])
        if path.name.startswith(".tmp-") or path != root.resolve() / row["stage"] / row["version"]:
            problems.append(f"{name}: listed at {path}")
            continue
        manifest_file = path / "manifest.json"
        manifest = json.loads(manifest_file.read_text()) if manifest_file.is_file() else {}
        if not manifest.get("files"):
            problems.append(f"{name}: no manifest with a files record")
            continue
        problems += [f"{name} {problem}" for problem in _incomplete_files(path, manifest)]
    catalogued = {(r["stage"], r["version"]) for r in store.sql("SELECT stage, version FROM artifacts").to_pylist()}
    folders = {(r["stage"], r["version"]) for r in rows}
    if catalogued != folders:
        problems.append(f"the catalog lists {sorted(catalogued)}, the folders hold {sorted(folders)}")
    return problems


# -- comparing stores ----------------------------------------------------------------------------
def comparable_manifest(stage: str, manifest: dict) -> dict:
    """The manifest without what two clean runs write differently."""
    kept = {key: value for key, value in manifest.items() if key not in CLOCK_FIELDS}
    kept["files"] = {relative: {k: v for k, v in record.items()
                                if k not in CLOCK_FILE_FIELDS and not (k == "sha256" and has_random_ids(stage, relative))}
                     for relative, record in manifest.get("files", {}).items()}
    if stage in CLOCK_STATS and isinstance(kept.get("stats"), dict):
        kept["stats"] = {k: v for k, v in kept["stats"].items() if k not in CLOCK_STATS[stage]}
    return kept


def _comparable_file(stage: str, folder: Path, file: Path):
    relative = file.relative_to(folder).as_posix()
    if relative == "manifest.json":
        return comparable_manifest(stage, json.loads(file.read_text()))
    if relative == "manifest.json.sha256":   # the manifest's digest (its clocks differ): whether it matches
        return file.read_text() == f"{_sha256(folder / 'manifest.json')}  manifest.json\n"
    if has_random_ids(stage, relative):
        return {"bytes": file.stat().st_size}
    return _sha256(file)


def snapshot(root: Path) -> dict[tuple[str, str], dict[str, object]]:
    """(stage, version) -> {relative path: what of the file two clean runs agree on} for every
    version the store lists."""
    versions = {}
    for row in ArtifactStore(root).list_artifacts():
        folder = Path(row["path"])
        versions[(row["stage"], row["version"])] = {
            file.relative_to(folder).as_posix(): _comparable_file(row["stage"], folder, file)
            for file in sorted(folder.rglob("*")) if file.is_file()}
    return versions


def differences(reference: dict, other: dict) -> list[str]:
    """Where two snapshots disagree, one line each ([] when the stores are equal)."""
    found = [f"{s} {v}: only in the reference" for s, v in sorted(reference.keys() - other.keys())]
    found += [f"{s} {v}: not in the reference" for s, v in sorted(other.keys() - reference.keys())]
    for key in sorted(reference.keys() & other.keys()):
        mine, theirs = reference[key], other[key]
        for relative in sorted(mine.keys() | theirs.keys()):
            if mine.get(relative) != theirs.get(relative):
                what = "missing" if relative not in theirs else "extra" if relative not in mine else "differs"
                found.append(f"{key[0]} {key[1]} {relative}: {what}")
    return found


# -- one kill, checked ---------------------------------------------------------------------------
def resume_problems(committed: dict[str, str], output: str) -> list[str]:
    """A rerun resumes: it builds again nothing the killed run committed, and finds all of it."""
    problems = []
    rebuilt = set(built_in(output).items()) & set(committed.items())
    if rebuilt:
        problems.append(f"the rerun built again what the killed run had committed: {sorted(rebuilt)}")
    unused = set(committed.items()) - set(cache_hits_in(output).items())
    if unused:
        problems.append(f"the rerun did not find what the killed run had committed: {sorted(unused)}")
    return problems


def kill_and_resume(reference: dict, moment_s: float, folder: Path, env: dict,
                    config: Path = TINY) -> tuple[KilledRun, list[str]]:
    """Kills a run into `folder`/root at `moment_s`, checks what it left, reruns it, and compares
    the result with `reference` (a `snapshot` of a clean run's store). Returns the kill and every
    problem found, one line each ([]: the store stayed consistent)."""
    folder.mkdir(parents=True, exist_ok=True)
    root = folder / "root"
    killed = run_killed_at(moment_s, root, folder / "killed.log", env, config)
    problems = unfinished_folders_on_disk(root)   # before anything opens the store
    committed = {}
    if root.is_dir():   # a kill before the flow opened the store leaves no root
        problems += partial_listings(root)
        committed = registered(root)
    code, output = rerun(root, folder / "rerun.log", env, config)
    if code != 0:
        return killed, problems + [f"the rerun exited {code}: {output[-2000:]}"]
    problems += resume_problems(committed, output)
    left = running_in_session(killed.sid)
    if left:
        problems.append(f"the killed run's processes outlived the rerun: {left}")
    problems += differences(reference, snapshot(root))
    checked = verify(root, env)
    if checked.returncode != 0:
        problems.append(f"pforge verify exited {checked.returncode}: {(checked.stdout + checked.stderr)[-1000:]}")
    return killed, problems
