"""Where each row of a study stands: measured (a committed record: when, on which CPU, at which
commit), resumable in the local artifact root (some of its steps built, or a step's work folder
holding checkpoints or shards), or not started; and what is left of it priced on this machine."""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from flows.study.definition import Row, Study
from flows.study.estimate import (StepPrice, format_duration, measured_steps, price_step, remaining, total_seconds,
                                  with_best_probe)
from flows.study.measure import references_needed, steps_run_here, steps_to_build
from flows.study.records import file_safe
from storage import ArtifactStore
from storage.paths import work_dir
from tasks.engine import Plan
from tasks.training.checkpoints import TrainingProgress, training_progress

if TYPE_CHECKING:
    from flows.registry import ConfigReference

MEASURED, RESUMABLE, BUILT, NOT_STARTED = "measured", "resumable", "built, not recorded", "not started"
PASSAGES = "chunk"   # the step whose output is the corpus's passages


@dataclass(frozen=True)
class RowStatus:
    row: Row
    state: str
    detail: str                    # the record's origin, or how far the local root is
    left: list[StepPrice]          # the steps still to build here, priced
    # other configs' models the row reads and the root lacks (its run would stop there): built first
    first: tuple[ConfigReference, ...] = ()

    @property
    def seconds_left(self) -> float | None:
        return total_seconds(self.left)

    def left_text(self) -> str:
        """What is left here: its price, or where a step is unpriced, the priced part and "+ ?"."""
        if self.state == MEASURED:
            return "-"
        priced = [p.seconds for p in self.left if p.seconds is not None]
        if len(priced) == len(self.left) or not priced:
            return format_duration(self.seconds_left)
        return f"{format_duration(sum(priced))} + ?"


class Plans:
    """One plan per config, made when first asked for (planning reads the configs' input files)."""

    def __init__(self, study: Study):
        self.study, self._plans, self._references = study, {}, {}

    def __call__(self, row: Row) -> Plan:
        return self.of(self.study.config_of(row))

    def of(self, path: Path) -> Plan:
        from flows.registry import plan_for
        from tasks.config import load_config

        if path not in self._plans:
            self._plans[path] = plan_for(load_config(path))
        return self._plans[path]

    def references(self, row: Row) -> list[ConfigReference]:
        """The models the row's config reads from other configs' runs (`other.yaml:STAGE`)."""
        from flows.registry import config_references
        from tasks.config import load_config

        path = self.study.config_of(row)
        if path not in self._references:
            self._references[path] = config_references(load_config(path))
        return self._references[path]

    def passages_of_record(self, record: dict) -> str | None:
        """The passages a record's steps read: the `chunk` version it names, else its config's."""
        from tasks.config import PROJECT_ROOT

        named = (record.get("versions") or {}).get(PASSAGES)
        path = PROJECT_ROOT / (record.get("config") or self.study.default_config)
        return named or (passages_of(self.of(path)) if path.is_file() else None)


def passages_of(plan: Plan) -> str | None:
    """The version of the passages a plan reads: a step of the same name over the same passages
    does the same work (on another corpus it does not)."""
    return plan.planned_version(PASSAGES) if PASSAGES in plan else None


def log_dir(root: Path) -> Path:
    """The runs' logs, in the root (a dot-folder: the store takes it for no stage)."""
    return root / ".study-logs"


def not_recorded_note(root: Path, row: Row) -> Path:
    """Where the runner leaves why a built row could not be recorded (gone once it is)."""
    return log_dir(root) / f"{file_safe(row.name)}.not-recorded"


def open_store(root: Path) -> ArtifactStore | None:
    return ArtifactStore(root, create=False) if root.is_dir() else None


def row_status(row: Row, plans: Plans, store: ArtifactStore | None, records: dict[str, dict],
               machine: dict, progress: Callable[[Path], TrainingProgress | None] = training_progress) -> RowStatus:
    plan, record = plans(row), records.get(row.name)
    if record is not None:
        origin = record.get("machine", {}).get("key", "an unnamed CPU")
        commit = (record.get("commit") or "?")[:10]
        versions, other = record.get("versions") or {}, versions_changed(record, plan)
        at_other = (f"; {len(other)} of {len(versions)} steps at other versions than this plan gives ({', '.join(other[:3])}"
                    f"{', ...' if len(other) > 3 else ''}; `--again` measures it here)") if other else ""
        return RowStatus(row, MEASURED, f"{record.get('recorded_at', '?')[:10]}, {origin}, commit {commit}{at_other}", [])
    own = steps_run_here(plan, store, row)
    first = tuple(references_needed(plan, plans.references(row), store, own))
    # the row's own steps, then the other configs' steps that make a model it reads and the root
    # lacks; by the work they do (artifact and version): a step two plans share is one
    steps: dict[str, tuple[Plan, str, str | None]] = {}   # work -> (plan, step, the other config's file name)
    for step_plan, names, config in [(plan, own, None), *((plans.of(ref.config), steps_to_build(
            plans.of(ref.config), store, ref.stage), ref.config.name) for ref in first)]:
        for name in names:
            steps.setdefault(f"{step_plan[name].artifact}@{step_plan.planned_version(name)}", (step_plan, name, config))
    built, in_flight = [], {}
    for work, (step_plan, name, _) in steps.items():
        stage, version = step_plan[name], step_plan.planned_version(name)
        if store is not None and store.get(stage.artifact, version) is not None:
            built.append(work)
        elif store is not None and _has_work(folder := work_dir(store.root, stage.artifact, version)):
            in_flight[work] = progress(folder)
    measured, priced_on = measured_steps(records, plans.passages_of_record), with_best_probe(machine, records)
    left = [remaining(replace(price_step(name, measured, priced_on, passages_of(step_plan),
                                         (config, work) if config else None), work=work), in_flight.get(work))
            for work, (step_plan, name, config) in steps.items() if work not in built]
    needs = "; first " + ", ".join(ref.written for ref in first) if first else ""
    if len(built) == len(steps):
        note = not_recorded_note(store.root, row)
        failed = f"; recording it failed: {note.read_text().strip()}" if note.is_file() else ""
        return RowStatus(row, BUILT, "its artifact is in the local root" + failed, left)
    if built or in_flight:
        part_built = ", ".join(_part_built(steps[work][1], progress) for work, progress in in_flight.items())
        detail = f"{len(built)} of {len(steps)} steps built" + (f"; {part_built} part-built" if in_flight else "")
        return RowStatus(row, RESUMABLE, detail + needs, left, first)
    return RowStatus(row, NOT_STARTED, f"{len(steps)} steps" + needs, left, first)


def versions_changed(record: dict, plan: Plan) -> list[str]:
    """The steps the record measured at a version this plan does not give: the code or a config
    changed since, or this CPU resolves another precision (`auto`: bf16 where avx512_bf16 is). The
    record stands; a rebuild here would make other artifacts."""
    return [name for name, version in (record.get("versions") or {}).items()
            if name not in plan or plan.planned_version(name) != version]


def _part_built(step: str, progress: TrainingProgress | None) -> str:
    return f"{step} (step {progress.step} of {progress.total})" if progress else step


def _has_work(folder: Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())


def study_status(study: Study, root: Path, records: dict[str, dict], machine: dict,
                 plans: Plans | None = None) -> list[RowStatus]:
    plans = plans or Plans(study)
    store = open_store(root)
    progress = functools.cache(training_progress)   # rows that share a step read its checkpoint once
    return [row_status(row, plans, store, records, machine, progress) for row in study.ordered()]


def status_text(study: Study, root: Path, statuses: list[RowStatus], machine: dict) -> str:
    measured = sum(s.state == MEASURED for s in statuses)
    open_rows = [s for s in statuses if s.state != MEASURED]
    # a step several rows need (the generation, a shared pre-training) is built once: counted once
    known = sum({p.work or (s.row.name, p.step): p.seconds
                 for s in open_rows for p in s.left if p.seconds is not None}.values())
    unknown = sum(s.seconds_left is None for s in open_rows)
    probe = f"fp32 probe {machine['sgemm_gflops']} GFLOP/s"
    if machine.get("sgemm_gflops_now"):
        probe += f" (the best measured on this CPU; {machine['sgemm_gflops_now']} now)"
    width = max([34, *(len(s.row.name) for s in statuses)])   # the columns line up whatever the names
    lines = [f"study {study.name}: {measured} of {len(statuses)} rows measured; root {root}",
             f"this machine: {machine['key']}, {machine['threads']} threads, {probe}",
             f"left here: {format_duration(known)} of priced work (a shared step once)" + (f"; {unknown} rows have unpriced steps" if unknown else ""),
             "",
             f"{'p':>1}  {'row':{width}s} {'state':20s} {'left here':>10s}  detail"]
    for s in statuses:
        lines.append(f"{s.row.priority:>1}  {s.row.name:{width}s} {s.state:20s} {s.left_text():>10s}  {s.detail}")
    return "\n".join(lines) + "\n"
