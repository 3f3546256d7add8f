"""`pforge plan CONFIG`: the stages a config runs, in order, with the version each would get and
whether that version is built in the artifact store; and the stage DAG as Mermaid or Graphviz dot.

Nothing is built. "Built" means what makes `pforge run` a cache hit: `<root>/<artifact>/<planned
version>/` holds a committed manifest. A root that does not exist yet is not created: every stage
is then "not built". (An existing root is opened as every command opens it, which may refresh a
stale catalog index.)

The DAG is the plan's structure only (stage names, inputs, inputs pinned to another run's
artifact), never versions or cache state, so the same config draws the same picture on every
machine (versions depend on the input files and, through `bf16: auto`, on the CPU) and the docs
pages that embed it can be checked against it (tests/test_docs_site.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from storage import ArtifactStore
from tasks.engine import Plan

BUILT, NOT_BUILT = "built", "not built"


@dataclass(frozen=True)
class PlannedStage:
    name: str            # what `pforge run --stage` takes
    artifact: str        # the folder under the root and the catalog's stage
    version: str         # the version a run of this config gives it
    state: str           # BUILT or NOT_BUILT in the store
    missing_pins: tuple[str, ...] = ()  # "ARTIFACT:VERSION" inputs of other runs the store lacks


def planned_stages(plan: Plan, root: Path) -> list[PlannedStage]:
    """Every stage of `plan` in run order, with its planned version and its state under `root`."""
    store = ArtifactStore(root, create=False) if root.exists() else None  # a file: refused

    def present(artifact: str, version: str) -> bool:
        return store is not None and store.get(artifact, version) is not None

    out = []
    for stage in plan:
        version = plan.planned_version(stage.name)
        missing = tuple(f"{pin.artifact}:{pin.version}" for pin in stage.pinned.values()
                        if not present(pin.artifact, pin.version))
        out.append(PlannedStage(stage.name, stage.artifact, version,
                                BUILT if present(stage.artifact, version) else NOT_BUILT, missing))
    return out


def plan_text(config_name: str, root: Path, stages: list[PlannedStage]) -> str:
    """What `pforge plan` prints: a summary line, one line per stage, then a note for each input
    pinned to another run's artifact that the store lacks (the run would stop there)."""
    built = sum(s.state == BUILT for s in stages)
    where = str(root) if root.is_dir() else f"{root} (no artifact store there yet)"
    lines = [f"plan of {config_name}: {len(stages)} stages, {built} built, {len(stages) - built} to build, in {where}",
             f"{'#':>3}  {'stage':24s} {'artifact':18s} {'version':16s}  state"]
    for i, s in enumerate(stages, 1):
        lines.append(f"{i:>3}  {s.name:24s} {s.artifact:18s} {s.version:16s}  {s.state}")
    for s in stages:
        for pin in s.missing_pins:
            lines.append(f"note: {s.name} needs {pin}, which is not in the store: run the config that builds it first")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------ the DAG
def _node_ids(plan: Plan) -> dict[str, str]:
    # Stage names hold ':' and '(' which neither Mermaid nor dot take as ids: number them in run order.
    return {name: f"s{i}" for i, name in enumerate(plan.names())}


def _pins(plan: Plan) -> dict[tuple[str, str], str]:
    """(stage, input key) -> a node id for each input pinned to another run's artifact."""
    return {(stage.name, key): f"p{i}_{j}" for i, stage in enumerate(plan)
            for j, key in enumerate(sorted(stage.pinned))}


def _label(text: str) -> str:
    return text.replace('"', "#quot;")


def drawn_inputs(plan: Plan) -> dict[str, list[str]]:
    """Each stage's inputs less those another of its inputs already depends on (the DAG's
    transitive reduction): `chunk -> evaluate` goes when `chunk -> ... -> search -> evaluate` says
    it, so a large plan's picture keeps the edges a reader follows."""
    ancestors: dict[str, set[str]] = {}
    drawn = {}
    for stage in plan:   # run order: every input's ancestors are known before the stage
        through_others = set().union(*(ancestors[dep] for dep in stage.inputs)) if stage.inputs else set()
        drawn[stage.name] = [dep for dep in stage.inputs if dep not in through_others]
        ancestors[stage.name] = set(stage.inputs) | through_others
    return drawn


def _edges(plan: Plan, reduced: bool) -> dict[str, list[str]]:
    """The inputs each stage is drawn with: all of them, or `drawn_inputs`'s."""
    return drawn_inputs(plan) if reduced else {stage.name: list(stage.inputs) for stage in plan}


def mermaid(plan: Plan, reduced: bool = False) -> str:
    """The stage DAG as a Mermaid flowchart (without the ``` fence), one line per stage in run order:
    its inputs `-->` it (`a & b --> c`); an input pinned to another run's artifact is a rounded
    node of its own, with a dotted arrow. `reduced`: only the edges no longer path implies
    (`drawn_inputs`), as the docs draw it."""
    ids, pins, inputs = _node_ids(plan), _pins(plan), _edges(plan, reduced)
    lines = ["flowchart TD"]
    for stage in plan:
        node = f'{ids[stage.name]}["{_label(stage.name)}"]'  # declared where it first appears
        if inputs[stage.name]:
            lines.append(f"    {' & '.join(ids[dep] for dep in inputs[stage.name])} --> {node}")
            node = ids[stage.name]
        for key in sorted(stage.pinned):
            lines.append(f'    {pins[(stage.name, key)]}("{_label(stage.pinned[key].artifact)} (another run)") -.-> {node}')
            node = ids[stage.name]
        if not stage.inputs and not stage.pinned:
            lines.append(f"    {node}")
    return "\n".join(lines) + "\n"


def dot(plan: Plan, reduced: bool = False) -> str:
    """The stage DAG as Graphviz dot (`dot -Tsvg`): the same nodes and edges as `mermaid`."""
    ids, pins, inputs = _node_ids(plan), _pins(plan), _edges(plan, reduced)
    lines = ["digraph plan {", "    rankdir=TB;", "    node [shape=box];"]
    lines += [f'    {ids[stage.name]} [label="{_dot_label(stage.name)}"];' for stage in plan]
    for (name, key), pid in pins.items():
        lines.append(f'    {pid} [label="{_dot_label(plan[name].pinned[key].artifact)} (another run)", style=rounded];')
    for stage in plan:
        lines += [f"    {ids[dep]} -> {ids[stage.name]};" for dep in inputs[stage.name]]
        lines += [f"    {pins[(stage.name, key)]} -> {ids[stage.name]} [style=dashed];" for key in sorted(stage.pinned)]
    return "\n".join(lines + ["}"]) + "\n"


def _dot_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


DAG_FORMATS = {"mermaid": mermaid, "dot": dot}
