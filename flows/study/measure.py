"""A finished row's record from the artifact root that built it: the row's artifact read once,
scored by the evaluation library as the evaluate stage scores it, with the versions, the stage
times and the machine beside it."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from flows.study.definition import Row, Study
from flows.study.records import NDCG_AT_10, OUTCOME_DIGITS, OUTCOME_SPLITS, RANK, write_questions
from storage import ArtifactStore
from tasks.engine import Plan, not_needed

if TYPE_CHECKING:
    from flows.registry import ConfigReference


# What scoring a runs row reads beside its runs: the questions, the passages' text, the gold links.
SCORING_INPUTS = ("ingest_questions", "chunk", "link_gold")


def targets(row: Row) -> list[str]:
    """The steps `pforge run --upto` builds for a row: its own, and for runs what scoring reads."""
    return [row.stage, *SCORING_INPUTS] if row.kind == "runs" else [row.stage]


def planned_steps(plan: Plan, row: Row) -> list[str]:
    """The steps a row needs (its own, every input, and what scoring reads), in run order."""
    needed = set().union(*(plan.needed_for(name) for name in targets(row)))
    return [name for name in plan.names() if name in needed]


def steps_run_here(plan: Plan, store: ArtifactStore | None, row: Row) -> list[str]:
    """The row's planned steps less those a run on `store` leaves out: the producers of an
    imported artifact (the generator whose queries came with the repository) are never built
    there. Without a store, every planned step."""
    return _less_left_out(plan, store, planned_steps(plan, row))


def steps_to_build(plan: Plan, store: ArtifactStore | None, stage: str) -> list[str]:
    """What `pforge run --upto STAGE` builds on `store` (every step it needs without a store),
    in run order: another config's steps that make a model a row reads."""
    needed = plan.needed_for(stage)
    return _less_left_out(plan, store, [name for name in plan.names() if name in needed])


def _less_left_out(plan: Plan, store: ArtifactStore | None, steps: list[str]) -> list[str]:
    if store is None:
        return steps
    left_out = not_needed(plan, store, steps)
    return [step for step in steps if step not in left_out]


def references_needed(plan: Plan, references: list[ConfigReference], store: ArtifactStore | None,
                      steps: list[str]) -> list[ConfigReference]:
    """The artifacts of other configs' runs (`references`) that a step of `steps` still to build
    reads and `store` lacks: its run would stop there, so they are built first."""
    pins = {(pin.artifact, pin.version) for name in steps for pin in plan.pins_to_fetch(store, name)}
    return [reference for reference in references if (reference.artifact, reference.version) in pins]


def row_artifact(plan: Plan, store: ArtifactStore, row: Row):
    """The row's artifact at the version the plan gives it (None: not built in this root)."""
    stage = plan[plan.resolve_name(row.stage)]
    return store.get(stage.artifact, plan.planned_version(stage.name))


def build_seconds(manifest: dict) -> float | None:
    """The build's wall time, plus, for a trainer that resumed, the training time of the attempts
    before it (a resumed build's own clock saw only its last part)."""
    build_s = (manifest.get("timings") or {}).get("build_s")
    stats = manifest.get("stats") or {}
    earlier = (stats.get("seconds_all_attempts") or 0.0) - (stats.get("seconds") or 0.0)
    return build_s + earlier if build_s is not None and earlier > 0 else build_s


def stage_times(plan: Plan, store: ArtifactStore, row: Row, steps: list[str]) -> list[dict]:
    """Each step's build as its manifest recorded it (the run that built it, on this root), for
    `steps`, those a run builds here (`steps_run_here`); an imported artifact was built on another
    machine, whose CPU this record does not name: its time is in the record of the row that built it."""
    out = []
    for name in steps:
        stage, version = plan[name], plan.planned_version(name)
        artifact = store.get(stage.artifact, version)
        if artifact is None:
            raise RuntimeError(f"row {row.name!r}: step {name} ({stage.artifact} {version}) is not built in {store.root}")
        if not artifact.manifest.get("imported"):
            out.append(_stage_time(name, artifact))
    return out


def reference_stage_times(plan: Plan, store: ArtifactStore, steps: list[str],
                          references: list[tuple[ConfigReference, Plan]], own: list[dict]) -> list[dict]:
    """The builds of other configs' steps behind a model the row's `steps` (those run here) read
    (`other.yaml:STAGE`, with that config's plan), each with its config: the work the runner did
    first for the row. A step the row's own steps (`own`) list is left out, and so is one the root
    no longer holds or imported."""
    pinned = {(pin.artifact, pin.version) for name in steps for pin in plan[name].pinned.values()}
    seen = {(stage["artifact"], stage["version"]) for stage in own}
    out = []
    for reference, other in references:
        if (reference.artifact, reference.version) not in pinned:
            continue   # a model the row's steps here do not read (an imported artifact stood in for its reader)
        for name in steps_to_build(other, store, reference.stage):
            work = (other[name].artifact, other.planned_version(name))
            artifact = store.get(*work)
            if work in seen or artifact is None or artifact.manifest.get("imported"):
                continue
            seen.add(work)
            out.append({**_stage_time(name, artifact), "config": config_name(reference.config)})
    return out


def config_name(path: Path) -> str:
    """A config file as records name it: relative to the project where it is in it."""
    from tasks.config import PROJECT_ROOT

    path = Path(path).resolve()
    return str(path.relative_to(PROJECT_ROOT)) if path.is_relative_to(PROJECT_ROOT) else str(path)


def _stage_time(name: str, artifact) -> dict:
    manifest = artifact.manifest
    return {"step": name, "artifact": artifact.stage, "version": artifact.version,
            "build_s": build_seconds(manifest), "rows": manifest.get("rows"), "created_at": manifest.get("created_at")}


def measure_row(study: Study, row: Row, plan: Plan, store: ArtifactStore,
                references: list[tuple[ConfigReference, Plan]] = ()) -> dict:
    """The record's measured part (outcomes, metrics, details, versions, stage times: the row's
    own steps, then those of the other configs' runs behind a model it read, `references` with
    their plans); raises when the row's artifact is not built in `store`."""
    artifact = row_artifact(plan, store, row)
    if artifact is None:
        raise RuntimeError(f"row {row.name!r}: {row.stage} is not built in {store.root}")
    steps = steps_run_here(plan, store, row)
    own = stage_times(plan, store, row, steps)
    record = {"row": row.name, "kind": row.kind, "system": row.system_name, "stage": row.stage,
              "config": row.config or study.default_config, "artifact": artifact.stage, "version": artifact.version,
              "versions": {name: plan.planned_version(name) for name in planned_steps(plan, row)},
              "stages": own + reference_stage_times(plan, store, steps, list(references), own)}
    if row.kind == "runs":
        record.update(_runs_outcomes(study, row, plan, store, artifact.read_table()))
    else:  # the classifier's report and the generated queries' quality are in their manifests' stats
        details = artifact.manifest.get("stats") or {}
        curve = classifier_dev_curve(artifact.path, details.get("selected_by")) if row.kind == "classifier" else None
        record["details"] = {**details, "dev_curve": curve} if curve else details
    return record


def classifier_dev_curve(artifact_path: Path, selected_by: str | None = "auc") -> list[list] | None:
    """[[step, dev AUC], ...] at each of the classifier's evaluations (a few dozen: small enough
    for the record), from the training/history.json its artifact keeps: each evaluation's AUC, or
    the trainer's dev_curve where AUC picked the checkpoint (the curve is the picking metric's);
    None without them."""
    from tasks.evaluation.figures import read_history

    history = read_history(Path(artifact_path) / "training" / "history.json") or {}
    curve = [(h["step"], h["dev_metrics"]["auc"]) for h in history.get("history") or []
             if (h.get("dev_metrics") or {}).get("auc") is not None]
    if not curve and selected_by in (None, "auc"):
        curve = history.get("dev_curve") or []
    return [[int(step), round(float(auc), OUTCOME_DIGITS)] for step, auc in curve] or None


def _inputs(plan: Plan, store: ArtifactStore, name: str):
    artifact = store.get(plan[name].artifact, plan.planned_version(name))
    if artifact is None:
        raise RuntimeError(f"{name} is not built in {store.root}")
    return artifact


def _runs_outcomes(study: Study, row: Row, plan: Plan, store: ArtifactStore, runs) -> dict:
    import pyarrow.compute as pc

    from tasks.evaluation.evaluate import evaluate_runs
    from tasks.evaluation.qa_metrics import carries_answers

    run = runs.filter(pc.equal(runs.column("system"), row.system_name))
    if not run.num_rows:
        known = sorted(set(runs.column("system").to_pylist()))
        raise RuntimeError(f"row {row.name!r}: {row.stage}'s runs hold no system {row.system_name!r}; systems: {known}")
    questions = _inputs(plan, store, "ingest_questions").read_table("questions")
    gold = _inputs(plan, store, "link_gold").read_table()
    passages = _inputs(plan, store, "chunk").read_table(columns=["pid", "doc_id", "text"])
    scoring = plan["evaluate"].params
    results, metrics, _ = evaluate_runs(questions, passages, gold, [run], title=row.name, ks=scoring.ks,
                                        match_type=scoring.match_type,
                                        ignore_identical_ids=scoring.ignore_identical_ids)
    split_of = dict(zip(questions.column("qid").to_pylist(), questions.column("split").to_pylist()))
    run_splits = {split_of.get(q) for q in pc.unique(run.column("qid")).to_pylist()} - {None}
    run_splits = (run_splits & set(OUTCOME_SPLITS)) or run_splits   # what rows are compared on, not what they trained on
    if carries_answers(questions):
        measure = RANK
        value_of = {(s, q): r for q, s, r in zip(results.column("qid").to_pylist(), results.column("split").to_pylist(),
                                                 results.column(RANK).to_pylist())}
        splits = {s: sorted(q for (sp, q) in value_of if sp == s) for s in sorted(run_splits)}
        values = {s: [value_of[(s, q)] for q in qids] for s, qids in splits.items()}
    else:
        from tasks.evaluation.bootstrap import runs_by_system
        from tasks.evaluation.ir_metrics import per_query_values

        measure = NDCG_AT_10
        scored = runs_by_system([run], passages if scoring.ignore_identical_ids else None)[row.system_name]
        judged = set(gold.column("qid").to_pylist())
        splits = {s: sorted(q for q in judged if split_of.get(q) == s) for s in sorted(run_splits)}
        values = {s: [round(v, OUTCOME_DIGITS) for v in per_query_values(scored, gold, qids, "ndcg_cut", 10)]
                  for s, qids in splits.items()}
    digest = write_questions(study.folder, splits)
    return {"outcomes": {"measure": measure, "questions": digest, "splits": values},
            "metrics": [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in m.items()}
                        for m in metrics.to_pylist()]}
