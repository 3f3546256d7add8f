"""`pforge study run`: the next rows in priority order that fit a time budget, each built with
`pforge run CONFIG --upto STAGE` (resumable: a run stopped at the budget's end continues from its
checkpoints and shards next time, on this root), measured from the root, and its record written
into the repository and committed there at once (with the study's shared inputs, exported as soon
as a row has built them, recorded or not), so a machine that goes away loses only the row in
flight. A row priced above what is left of the budget is passed over for a later, cheaper one, and
advanced with what is left once no row fits; a row nobody has measured yet (priced "unknown") is
run, and measures itself, where at least ADVANCE_MIN_S and its priced part are left. A row whose config reads a model of another config's run
(`other.yaml:STAGE`) that the root lacks has that config run up to that stage first. A row named
with `--again` whose record was measured at other versions than this plan gives (another CPU's
precision, older code) is built here and its record replaced, naming the one it replaces (which is
kept under `records/replaced/`)."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from flows.study.definition import Row, Study
from flows.study.estimate import format_duration
from flows.study.measure import measure_row, targets
from flows.study.records import code_commit, file_safe, keep_replaced, read_records, write_record
from flows.study.status import (BUILT, MEASURED, Plans, RowStatus, log_dir, not_recorded_note, open_store,
                                row_status, versions_changed)
from storage.atomic import atomic_write_text
from tasks.config import PROJECT_ROOT

if TYPE_CHECKING:
    from flows.registry import ConfigReference

logger = logging.getLogger("passage_forge")
STOP_GRACE_S = 120.0   # a stopped run writes its last checkpoint and stops its Prefect server
ADVANCE_MIN_S = 600.0  # less than this left: a passed-over row is not started (start-up would eat it)


class Again(str):
    """A row name given with `--again`: measured once more where its record's versions are not
    this plan's (the order of `--row` and `--again` names on the command line is kept)."""


def least_seconds(status: RowStatus) -> float:
    """What the row takes at least: its price; with an unpriced step, its priced part and no less
    than ADVANCE_MIN_S (an unknown row measures itself, but not in the budget's last minutes)."""
    if status.seconds_left is not None:
        return status.seconds_left
    return max(sum(p.seconds for p in status.left if p.seconds is not None), ADVANCE_MIN_S)


def pipeline_command(study: Study, row: Row, root: Path) -> list[str]:
    return [sys.executable, "-m", "flows.cli", "--root", str(root), "run", str(study.config_of(row)),
            "--upto", ",".join(targets(row))]


def reference_command(reference: ConfigReference, root: Path) -> list[str]:
    """The run of another config that builds a model a row reads (`other.yaml:STAGE`)."""
    return [sys.executable, "-m", "flows.cli", "--root", str(root), "run", str(reference.config),
            "--upto", reference.stage]


def run_pipeline(argv: list[str], log: Path, timeout_s: float, threads: int) -> int | None:
    """The exit status of `argv` (its output appended to `log`), or None when the budget ended
    first: the run is then stopped with SIGTERM (pforge's own stop: children and server too)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PFORGE_THREADS": str(threads)}
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        process = subprocess.Popen(argv, cwd=PROJECT_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            return process.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            import psutil

            from flows.interrupts import stop_processes

            stop_processes([psutil.Process(process.pid)], STOP_GRACE_S)   # SIGTERM, then SIGKILL after the grace
            process.wait()
            return None


def commit_records(repo: Path, paths: list[Path], message: str, attempts: int = 5) -> bool:
    """Commits exactly `paths` in `repo` (whatever else is staged there stays staged, uncommitted)."""
    relative = [str(p.resolve().relative_to(repo.resolve())) for p in paths]
    for attempt in range(attempts):
        added = subprocess.run(["git", "-C", str(repo), "add", "--", *relative], capture_output=True, text=True)
        done = added.returncode == 0 and subprocess.run(
            ["git", "-C", str(repo), "commit", "-q", "-m", message, "--only", "--", *relative],
            capture_output=True, text=True).returncode == 0
        if done:
            return True
        time.sleep(2 + 3 * attempt)   # another git command held the index lock
    logger.warning("study: could not commit %s in %s; the files are written, commit them by hand", relative, repo)
    return False


def record_row(study: Study, row: Row, plans: Plans, root: Path, machine: dict, commit: dict,
               repo: Path | None) -> Path:
    """Measures a built row, writes its record (and its question list) and commits them in `repo`;
    a record it replaces is named in the new one (`replaces`: when, where, at which commit) and kept."""
    store = open_store(root)
    references = [(reference, plans.of(reference.config)) for reference in plans.references(row)]
    record = {**measure_row(study, row, plans(row), store, references), **commit, "machine": machine, "root": str(root)}
    previous = read_records(study.folder).get(row.name)
    kept = []
    if previous is not None:   # kept beside it: the tables show the row's two measurements side by side
        record["replaces"] = {"recorded_at": previous.get("recorded_at"), "commit": previous.get("commit"),
                              "machine": (previous.get("machine") or {}).get("key"), "version": previous.get("version")}
        kept.append(keep_replaced(study.folder, previous))
    path = write_record(study.folder, record)
    files = [path, *kept, *export_shared(study, plans, root)]
    questions = record.get("outcomes", {}).get("questions")
    if questions:
        files.append(study.folder / "questions" / f"{questions}.json")
    current = study_as_it_is_now(study)
    if current.tables_file:   # the committed tables follow the records and study.yaml (a test holds them to both)
        from flows.study.tables import study_tables

        tables = current.folder.parents[1] / current.tables_file
        atomic_write_text(tables, study_tables(current))
        files.append(tables)
    if repo is not None:
        cpu, again = machine.get("key", "?"), " (measured again)" if previous is not None else ""
        commit_records(repo, files, f"Study record: {row.name}{again} ({study.name}; {cpu}, commit {str(commit['commit'])[:10]})")
    return path


def study_as_it_is_now(study: Study) -> Study:
    """`study` read again from its study.yaml: a row or claim added since the run began is in the
    tables a record rewrites (they would otherwise lack it, and no longer match study.yaml). A file
    that does not load now (an edit half made) leaves the definition the run began with."""
    from flows.study.definition import load_study

    try:
        return load_study(study.folder / "study.yaml")
    except ValueError as error:
        logger.warning("study: %s; the tables follow the definition this run began with", error)
        return study


def import_shared(study: Study, root: Path, say: Callable[[str], None]) -> None:
    """Every export under shared/ into the root (a cache hit where it is there)."""
    from storage import ArtifactStore
    from storage.transfer import DESCRIPTION_SUFFIX, import_artifact

    if not study.shared_dir.is_dir():
        return
    store = ArtifactStore(root)
    for description in sorted(study.shared_dir.glob(f"*{DESCRIPTION_SUFFIX}")):
        artifact = import_artifact(store, description)
        if not artifact.cache_hit:
            say(f"study: imported {artifact.stage} {artifact.version} from {description.name}")


def export_shared(study: Study, plans: Plans, root: Path) -> list[Path]:
    """The shared steps built in the root and not exported yet, exported; returns the new files."""
    from storage.transfer import ARCHIVE_SUFFIX, DESCRIPTION_SUFFIX, export_artifact, export_name

    store, files = open_store(root), []
    for config, step in study.shared_steps():
        plan = plans.of(config)
        stage = plan[plan.resolve_name(step)]
        version = plan.planned_version(stage.name)
        artifact = store.get(stage.artifact, version) if store is not None else None
        name = export_name(stage.artifact, version)
        if artifact is None or (study.shared_dir / f"{name}{DESCRIPTION_SUFFIX}").is_file():
            continue
        description = export_artifact(store, artifact, study.shared_dir)
        files += [description, study.shared_dir / f"{name}{ARCHIVE_SUFFIX}"]
    return files


def keep_shared(study: Study, plans: Plans, root: Path, repo: Path | None, say: Callable[[str], None]) -> None:
    """The shared steps a row built before it stopped unrecorded (the budget ended, or a later step
    failed), exported and committed now: a new machine imports them instead of building them again."""
    files = export_shared(study, plans, root)
    if not files:
        return
    names = ", ".join(sorted({f.name.split(".")[0] for f in files}))
    say(f"study: exported {names} into {study.shared_dir}")
    if repo is not None:
        commit_records(repo, files, f"Study shared inputs: {names} ({study.name})")


def run_study(study: Study, root: Path, budget_s: float, machine: dict, *, repo: Path | None,
              rows: list[str] | None = None, say: Callable[[str], None] = print) -> list[str]:
    """Builds and records rows until the budget is spent; returns the rows recorded."""
    deadline = time.monotonic() + budget_s
    plans, commit = Plans(study), code_commit()
    if commit.get("dirty"):
        say("study: the code differs from its commit; records will say dirty: true (run from a clean worktree)")
    recorded, passed = [], []
    import_shared(study, root, say)

    def build(row: Row, status: RowStatus) -> bool:
        """Builds and records `row`; False when the budget ended in it."""
        left = deadline - time.monotonic()
        if status.state != BUILT:
            say(f"study: {row.name}: {status.state}, priced {status.left_text()} here; building "
                f"({format_duration(left)} of budget left)")
            log = log_dir(root) / f"{file_safe(row.name)}.log"
            rc = 0
            for reference in status.first:   # another config's model the row reads, which its run would stop at
                say(f"study: {row.name}: first {reference.written} ({reference.artifact} {reference.version})")
                rc = run_pipeline(reference_command(reference, root), log, deadline - time.monotonic(),
                                  machine["threads"])
                if rc != 0:
                    break
            if rc == 0:
                rc = run_pipeline(pipeline_command(study, row, root), log, deadline - time.monotonic(),
                                  machine["threads"])
            if rc is None:
                say(f"study: {row.name}: the budget ended mid-row; it resumes from the root next time")
                keep_shared(study, plans, root, repo, say)
                return False
            if rc != 0:
                say(f"study: {row.name}: pforge run exited {rc} (log: {log_dir(root)}); next row")
                keep_shared(study, plans, root, repo, say)
                return True
        note = not_recorded_note(root, row)
        try:
            path = record_row(study, row, plans, root, machine, commit, repo)
        except Exception as error:   # one row that cannot be recorded does not end the budget for the rest
            why = f"{type(error).__name__}: {error}"
            say(f"study: {row.name}: built, but not recorded ({why}); next row")
            note.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(note, why + "\n")   # `pforge study status` shows it beside the row
            return True
        note.unlink(missing_ok=True)
        recorded.append(row.name)
        say(f"study: {row.name}: recorded {path}")
        return True

    def status_of(row: Row, again: bool) -> RowStatus:
        """The row's status; with `again`, as if unrecorded where its record is at other versions."""
        records = read_records(study.folder)
        record = records.get(row.name)
        if again and record is not None and versions_changed(record, plans(row)):
            records = {name: r for name, r in records.items() if name != row.name}
        return row_status(row, plans, open_store(root), records, machine)

    again = list(dict.fromkeys(name for name in rows or [] if isinstance(name, Again)))   # in command-line order
    records = read_records(study.folder) if again else {}
    for name in again:
        record = records.get(name)
        if record is not None:
            changed = versions_changed(record, plans(study.row(name)))
            say(f"study: {name}: measured again here: {len(changed)} of {len(record.get('versions') or {})} steps of its "
                f"record are at other versions than this plan gives" if changed else
                f"study: {name}: its record is at this plan's versions; not measured again")
    for row in [study.row(name) for name in rows] if rows else study.ordered():
        left = deadline - time.monotonic()
        if left <= 0:
            return recorded
        status = status_of(row, row.name in again)
        if status.state == MEASURED:
            continue
        if status.state != BUILT and least_seconds(status) > left:
            say(f"study: {row.name}: priced {status.left_text()}, {format_duration(left)} left: passed over")
            passed.append(row)
            continue
        if not build(row, status):
            return recorded
    # Nothing else fits what is left: it advances the rows passed over, in order (a row longer than
    # any budget would otherwise never start); their checkpoints and shards carry the work to the
    # next run on this root.
    for row in passed:
        left = deadline - time.monotonic()
        if left < ADVANCE_MIN_S:
            break
        say(f"study: {row.name}: nothing else fits; advancing it with the {format_duration(left)} left")
        if not build(row, status_of(row, row.name in again)):
            break
    return recorded


def background(argv: list[str], log: Path) -> int:
    """Starts `pforge argv` detached from this terminal (its own session, output to `log`); the
    child is not tagged as this process's (flows/orphans.py would stop it once this one exits)."""
    from flows.orphans import OWNER_VARIABLE

    log.parent.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != OWNER_VARIABLE}
    with open(log, "a", encoding="utf-8") as out:
        process = subprocess.Popen([sys.executable, "-m", "flows.cli", *argv], cwd=PROJECT_ROOT, env=env,
                                   stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    return process.pid
