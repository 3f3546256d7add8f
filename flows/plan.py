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

A plan too large for one readable drawing (more than MAX_NODES nodes, `--reduced`) is drawn as the
docs draw it: `overview` (`--overview`), one node per stage family, then `parts` (`--part N`) of at
most MAX_NODES nodes, each a few families or systems with the stages they read from other parts.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
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
        built = present(stage.artifact, version)
        missing = tuple(f"{pin.artifact}:{pin.version}" for pin in plan.pins_to_fetch(store, stage.name))
        out.append(PlannedStage(stage.name, stage.artifact, version, BUILT if built else NOT_BUILT, missing))
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
MAX_NODES = 16
"""The most nodes one drawing of a plan holds. A plan whose whole drawing (`--reduced`) has more is
drawn as its stage families (`overview`) and in `parts` of at most this many nodes, as the docs draw it."""
MAX_WIDTH = 120
"""The widest a part's drawing may grow, in characters of its labels (`estimated_widths`): a wider
one is scaled down to the page's width until its labels are hard to read."""
COLLAPSED_ABOVE = 3
"""A stage of a part reading more than this many stages of one family from other parts has them
drawn as one node ("16 search stages"): the evaluation reads every system's search."""

OVERVIEW = "overview"

# The family of a stage whose name alone does not say it (the others: the name before `:`, else the name).
FAMILIES = {"ingest_documents": "ingest", "ingest_questions": "ingest", "link_gold": "gold", "pairs:gold": "gold",
            "bm25_index": "bm25", "bm25_search": "bm25", "qgen_model": "qgen", "synthetic_queries": "qgen",
            "pairs:synthetic": "qgen", "cross_encoder": "cross-encoder", "pairs:silver": "cross-encoder",
            "hybrid": "fusion"}

STAGE, OUTSIDE, PIN = "stage", "outside", "pin"


@dataclass(frozen=True)
class Node:
    id: str
    label: str
    kind: str = STAGE   # STAGE: drawn here; OUTSIDE: a stage drawn in another part; PIN: another run's artifact


@dataclass(frozen=True)
class Drawing:
    """What a DAG drawing holds: its nodes (the STAGE ones in run order, each drawn with the edges into
    it) and its edges (from id, to id; dotted from a PIN)."""
    nodes: tuple[Node, ...]
    edges: tuple[tuple[str, str], ...]
    direction: str = "TD"   # ranks top-down, or left to right ("LR") where that is the narrower picture


@dataclass(frozen=True)
class Part:
    title: str                # the families and systems it holds
    stages: tuple[str, ...]   # in run order


def family(name: str) -> str:
    """The stage family `name` is drawn in by the overview: `train:two-stage` is in `train`,
    `ingest_questions` in `ingest`, `pairs:synthetic` in `qgen` (FAMILIES)."""
    return FAMILIES.get(name) or name.split(":", 1)[0]


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


def _pin_nodes(plan: Plan, names) -> tuple[list[Node], list[tuple[str, str]]]:
    ids, pins = _node_ids(plan), _pins(plan)
    nodes, edges = [], []
    for name in names:
        for key in sorted(plan[name].pinned):
            nodes.append(Node(pins[(name, key)], f"{plan[name].pinned[key].artifact} (another run)", PIN))
            edges.append((pins[(name, key)], ids[name]))
    return nodes, edges


def whole(plan: Plan, reduced: bool = False) -> Drawing:
    """Every stage, an edge per input (`reduced`: only `drawn_inputs`'s), each pinned input a node."""
    ids, inputs = _node_ids(plan), _edges(plan, reduced)
    pin_nodes, pin_edges = _pin_nodes(plan, plan.names())
    return Drawing(tuple(Node(ids[stage.name], stage.name) for stage in plan) + tuple(pin_nodes),
                   tuple((ids[dep], ids[stage.name]) for stage in plan for dep in inputs[stage.name]) + tuple(pin_edges))


def _reachable(edges: list[tuple[str, str]], source: str, target: str, without: tuple[str, str]) -> bool:
    seen, todo = {source}, [source]
    while todo:
        node = todo.pop()
        for a, b in edges:
            if a == node and (a, b) != without and b not in seen:
                if b == target:
                    return True
                seen.add(b)
                todo.append(b)
    return False


def overview(plan: Plan) -> Drawing:
    """One node per stage family (`family`), in the order the plan first runs one: an edge where a
    stage of one reads a stage of the other (`drawn_inputs`), left out where a longer path of families
    leads there too (families may form a loop: mined negatives read a search and train a system)."""
    drawn = drawn_inputs(plan)
    families = list(dict.fromkeys(family(name) for name in plan.names()))
    fid = {fam: f"f{i}" for i, fam in enumerate(families)}
    members = {fam: [name for name in plan.names() if family(name) == fam] for fam in families}
    edges = list(dict.fromkeys((fid[family(dep)], fid[family(name)]) for name in plan.names()
                               for dep in drawn[name] if family(dep) != family(name)))
    for edge in list(edges):   # each removal keeps every reachability, so the loop may drop edges in turn
        if _reachable(edges, *edge, without=edge):
            edges.remove(edge)
    order = {f"f{i}": i for i in range(len(families))}
    edges.sort(key=lambda e: (order[e[1]], order[e[0]]))
    nodes = [Node(fid[fam], _family_label(fam, members[fam])) for fam in families]
    for i, fam in enumerate(families):
        artifacts = sorted({pin.artifact for name in members[fam] for pin in plan[name].pinned.values()})
        for j, artifact in enumerate(artifacts):
            nodes.append(Node(f"p{i}_{j}", f"{artifact} (another run)", PIN))
            edges.append((f"p{i}_{j}", fid[fam]))
    return _narrower(Drawing(tuple(nodes), tuple(edges)))


def _narrower(drawn: Drawing) -> Drawing:
    """`drawn` ranked left to right when that is narrower than top-down: the page's width is what a
    drawing is scaled down to, so a wide fan of inputs into one stage (the evaluation's) is drawn across
    and a long chain (a system's) down (`estimated_widths`)."""
    top_down, across = estimated_widths(drawn)
    return replace(drawn, direction="LR" if across < top_down else "TD")


def estimated_widths(drawn: Drawing) -> tuple[int, int]:
    """`drawn`'s width top-down and left to right, estimated in characters: top-down, the widest
    rank's labels side by side; left to right, each rank's longest label one after the other (a
    node's padding and the gap to the next about PADDING characters)."""
    rank: dict[str, int] = {}
    for node in drawn.nodes:   # longest path from a source; STAGE nodes come in run order, sources first
        rank.setdefault(node.id, 0)
    for _ in drawn.nodes:
        changed = False
        for a, b in drawn.edges:
            if rank[b] < rank[a] + 1:
                rank[b], changed = rank[a] + 1, True
        if not changed:
            break
    ranks: dict[int, list[int]] = {}
    for node in drawn.nodes:
        ranks.setdefault(rank[node.id], []).append(len(node.label) + PADDING)
    return max(sum(widths) for widths in ranks.values()), sum(max(widths) for widths in ranks.values())


PADDING = 10


def _family_label(fam: str, names: list[str]) -> str:
    """`chunk`, `train:dpr`, `fusion: hybrid` (a family of one stage), else `train (3 stages)`."""
    if len(names) > 1:
        return f"{fam} ({len(names)} stages)"
    return names[0] if names[0] == fam or names[0].startswith(f"{fam}:") else f"{fam}: {names[0]}"


def _systems(plan: Plan) -> dict[str, str]:
    """Stage -> the system it belongs to: every `FAMILY:X` stage of a system X searched as `search:X`."""
    searched = {name.split(":", 1)[1] for name in plan.names() if name.startswith("search:")}
    return {name: name.split(":", 1)[1] for name in plan.names() if ":" in name and name.split(":", 1)[1] in searched}


def _part_drawing(plan: Plan, members: set[str]) -> Drawing:
    """The stages in `members` with the edges into them (`drawn_inputs`); a stage they read from
    another part is an OUTSIDE node (more than COLLAPSED_ABOVE of one family, read by one stage: one
    node for them)."""
    ids, drawn = _node_ids(plan), drawn_inputs(plan)
    nodes: dict[str, Node] = {}
    edges = []
    for name in plan.names():
        if name not in members:
            continue
        nodes[ids[name]] = Node(ids[name], name)
        outside: dict[str, list[str]] = {}
        for dep in drawn[name]:
            if dep not in members:
                outside.setdefault(family(dep), []).append(dep)
        collapsed = {fam for fam, deps in outside.items() if len(deps) > COLLAPSED_ABOVE}
        for dep in drawn[name]:
            if dep in members:
                edges.append((ids[dep], ids[name]))
            elif family(dep) in collapsed:
                group = f"g{ids[name][1:]}_{list(outside).index(family(dep))}"
                if group not in nodes:
                    nodes[group] = Node(group, f"{len(outside[family(dep)])} {family(dep)} stages", OUTSIDE)
                    edges.append((group, ids[name]))
            else:
                nodes.setdefault(ids[dep], Node(ids[dep], dep, OUTSIDE))
                edges.append((ids[dep], ids[name]))
    pin_nodes, pin_edges = _pin_nodes(plan, [name for name in plan.names() if name in members])
    return _narrower(Drawing(tuple(nodes.values()) + tuple(pin_nodes), tuple(edges) + tuple(pin_edges)))


def fits_one_drawing(plan: Plan) -> bool:
    """Whether the whole plan, `--reduced`, is drawn in at most MAX_NODES nodes."""
    return len(whole(plan, reduced=True).nodes) <= MAX_NODES


def parts(plan: Plan) -> list[Part]:
    """The parts a large plan is drawn in, each of at most MAX_NODES nodes (its stages and those it
    reads from other parts) and at most MAX_WIDTH characters wide: the plan's units in run order, a
    unit being a system's stages (`train:X`, `encode:X`, `index:X`, `search:X`...) or the other
    stages of one family, packed into a part while they fit. A plan that `fits_one_drawing` is one part."""
    if fits_one_drawing(plan):
        return [Part("every stage", tuple(plan.names()))]
    systems = _systems(plan)
    units: dict[tuple[str, str], list[str]] = {}
    for name in plan.names():
        units.setdefault(("system", systems[name]) if name in systems else ("family", family(name)), []).append(name)

    def fits(names: list[str]) -> bool:
        drawn = _part_drawing(plan, set(names))
        return len(drawn.nodes) <= MAX_NODES and min(estimated_widths(drawn)) <= MAX_WIDTH

    packed: list[tuple[list[str], list[tuple[str, str]]]] = []   # (stages, units) of each part
    current: list[str] = []
    current_units: list[tuple[str, str]] = []
    for key, names in units.items():
        pieces = [names] if fits(names) else [[name] for name in names]  # a unit too large: stage by stage
        for piece in pieces:
            if current and not fits(current + piece):
                packed.append((current, current_units))
                current, current_units = [], []
            current = current + piece
            if key not in current_units:
                current_units.append(key)
    if current:
        packed.append((current, current_units))
    order = {name: i for i, name in enumerate(plan.names())}
    return [Part(_part_title(keys), tuple(sorted(names, key=order.get))) for names, keys in packed]


def _part_title(keys: list[tuple[str, str]]) -> str:
    families = [name for kind, name in keys if kind == "family"]
    systems = [name for kind, name in keys if kind == "system"]
    said = [", ".join(families)] if families else []
    if systems:
        said.append(("system " if len(systems) == 1 else "systems ") + ", ".join(systems))
    return "; ".join(said)


def drawing(plan: Plan, reduced: bool = False, view: str | int | None = None) -> Drawing:
    """The drawing `pforge plan` writes: the whole plan (view None), its families (`OVERVIEW`) or part
    N of `parts` (from 1; drawn with `drawn_inputs`'s edges)."""
    if view is None:
        return whole(plan, reduced)
    if view == OVERVIEW:
        return overview(plan)
    found = parts(plan)
    if not isinstance(view, int) or not 1 <= view <= len(found):
        raise ValueError(f"no part {view}: this plan is drawn in {len(found)} part(s), --part 1 to {len(found)}")
    return _part_drawing(plan, set(found[view - 1].stages))


def mermaid(plan: Plan, reduced: bool = False, view: str | int | None = None) -> str:
    """The stage DAG as a Mermaid flowchart (without the ``` fence), one line per stage in run order:
    its inputs `-->` it (`a & b --> c`); an input pinned to another run's artifact is a rounded
    node of its own, with a dotted arrow. `reduced`: only the edges no longer path implies
    (`drawn_inputs`), as the docs draw it. `view`: `OVERVIEW` (one node per stage family) or a part
    number (`parts`), whose stages read from other parts are stadium-shaped nodes."""
    return mermaid_text(drawing(plan, reduced, view))


def mermaid_text(drawn: Drawing) -> str:
    shapes = {STAGE: '["{}"]', OUTSIDE: '(["{}"])', PIN: '("{}")'}
    by_id = {node.id: node for node in drawn.nodes}
    declared: set[str] = set()

    def ref(node_id: str) -> str:
        if node_id in declared:
            return node_id
        declared.add(node_id)
        return node_id + shapes[by_id[node_id].kind].format(_label(by_id[node_id].label))

    lines = [f"flowchart {drawn.direction}"]
    for node in drawn.nodes:
        if node.kind != STAGE:
            continue
        sources = [a for a, b in drawn.edges if b == node.id]
        solid = [a for a in sources if by_id[a].kind != PIN]
        lines += [f"    {ref(a)}" for a in solid if by_id[a].kind == OUTSIDE and a not in declared]
        if solid:
            lines.append(f"    {' & '.join(ref(a) for a in solid)} --> {ref(node.id)}")
        lines += [f"    {ref(a)} -.-> {ref(node.id)}" for a in sources if by_id[a].kind == PIN]
        if not sources:
            lines.append(f"    {ref(node.id)}")
    return "\n".join(lines) + "\n"


def dot(plan: Plan, reduced: bool = False, view: str | int | None = None) -> str:
    """The stage DAG as Graphviz dot (`dot -Tsvg`): the same nodes and edges as `mermaid`."""
    drawn = drawing(plan, reduced, view)
    styles = {STAGE: "", PIN: ", style=rounded", OUTSIDE: ', style="rounded,dashed"'}
    kinds = {node.id: node.kind for node in drawn.nodes}
    lines = ["digraph plan {", f"    rankdir={'LR' if drawn.direction == 'LR' else 'TB'};", "    node [shape=box];"]
    lines += [f'    {node.id} [label="{_dot_label(node.label)}"{styles[node.kind]}];'
              for node in sorted(drawn.nodes, key=lambda n: n.kind != STAGE)]
    for node in drawn.nodes:
        if node.kind == STAGE:
            sources = [a for a, b in drawn.edges if b == node.id]
            lines += [f"    {a} -> {node.id};" for a in sources if kinds[a] != PIN]
            lines += [f"    {a} -> {node.id} [style=dashed];" for a in sources if kinds[a] == PIN]
    return "\n".join(lines + ["}"]) + "\n"


def _dot_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


DAG_FORMATS = {"mermaid": mermaid, "dot": dot}
