"""`pforge plan CONFIG`: the stages in run order with their planned versions and whether each is
built in the artifact root (nothing runs, nothing is written), and the stage DAG as Mermaid or dot.
The built state comes from the engine's own `run_stage` on the tiny config's first stages."""
import re

from flows.cli import main
from flows.plan import BUILT, NOT_BUILT, dot, mermaid, planned_stages
from flows.registry import plan_for
from storage import ArtifactStore
from tasks.config import PROJECT_ROOT, load_config
from tasks.engine import NoParams, Pinned, Plan, Stage, run_stage

TINY = PROJECT_ROOT / "configs" / "tiny.yaml"
ROW = re.compile(r"^\s*(\d+)\s+(\S+)\s+(\S+)\s+([0-9a-f]{16})\s+(built|not built)$")


def _rows(out: str) -> list[tuple[str, str, str, str]]:
    """(stage, artifact, version, state) of each stage line `pforge plan` printed."""
    return [m.groups()[1:] for m in map(ROW.match, out.splitlines()) if m]


def test_an_empty_root_shows_every_stage_in_run_order_not_built_and_stays_absent(shared_data, tmp_path, capsys):
    root = tmp_path / "no-store-yet"
    assert main(["--root", str(root), "plan", str(TINY)]) == 0
    out = capsys.readouterr().out
    plan = plan_for(load_config(TINY))
    assert _rows(out) == [(s.name, s.artifact, plan.planned_version(s.name), NOT_BUILT) for s in plan]
    assert [r[0] for r in _rows(out)] == ["ingest_documents", "ingest_questions", "chunk", "link_gold", "bm25_index",
                                          "bm25_search", "evaluate"]
    assert f"7 stages, 0 built, 7 to build, in {root} (no artifact store there yet)" in out
    assert not root.exists()  # a plan never creates a store


def test_stages_built_in_the_root_show_built_and_the_rest_not(shared_data, tmp_path, capsys, monkeypatch):
    plan = plan_for(load_config(TINY))
    store = ArtifactStore(tmp_path)
    done = {}
    for name in ("ingest_documents", "ingest_questions", "chunk"):  # seconds: no JVM, no model
        stage = plan[name]
        done[name] = run_stage(store, stage, {dep: done[dep] for dep in stage.inputs})
        assert done[name].version == plan.planned_version(name)  # what a pipeline run would register
    monkeypatch.setenv("PFORGE_HOME", str(tmp_path))  # --root, else $PFORGE_HOME: as every command
    assert main(["plan", str(TINY)]) == 0
    out = capsys.readouterr().out
    states = {stage: state for stage, _, _, state in _rows(out)}
    assert states == {"ingest_documents": BUILT, "ingest_questions": BUILT, "chunk": BUILT, "link_gold": NOT_BUILT,
                      "bm25_index": NOT_BUILT, "bm25_search": NOT_BUILT, "evaluate": NOT_BUILT}
    assert f"7 stages, 3 built, 4 to build, in {tmp_path.resolve()}\n" in out
    # Another version of a stage in the store is not this plan's: a changed parameter is "not built".
    cfg = load_config(TINY)
    changed = plan_for(cfg.model_copy(update={"chunk": cfg.chunk.model_copy(update={"words": 50})}))
    assert {s.name: s.state for s in planned_stages(changed, tmp_path)}["chunk"] == NOT_BUILT


def test_mermaid_and_dot_draw_one_node_per_stage_and_one_edge_per_input(shared_data, tmp_path, capsys):
    target = tmp_path / "dag" / "tiny.mmd"
    assert main(["--root", str(tmp_path / "store"), "plan", str(TINY), "--mermaid", str(target),
                 "--dot", str(tmp_path / "tiny.dot")]) == 0
    assert f"mermaid DAG: {target}" in capsys.readouterr().out
    plan = plan_for(load_config(TINY))
    text = target.read_text()
    assert text == mermaid(plan)
    assert text.startswith("flowchart TD\n")
    ids = {name: f"s{i}" for i, name in enumerate(plan.names())}
    for stage in plan:
        assert f'{ids[stage.name]}["{stage.name}"]' in text
        line = next(l for l in text.splitlines() if f'{ids[stage.name]}["' in l)
        drawn = line.split(" --> ")[0].strip().split(" & ") if " --> " in line else []
        assert sorted(drawn) == sorted(ids[d] for d in stage.inputs)
    edges = re.findall(r"(s\d+) -> (s\d+);", (tmp_path / "tiny.dot").read_text())
    assert sorted(edges) == sorted((ids[d], ids[s.name]) for s in plan for d in s.inputs)


def test_a_dag_to_stdout_is_printed_alone(shared_data, tmp_path, capsys):
    assert main(["--root", str(tmp_path), "plan", str(TINY), "--mermaid", "-"]) == 0
    assert capsys.readouterr().out == mermaid(plan_for(load_config(TINY)))


def test_inputs_pinned_to_another_runs_artifact_are_drawn_and_noted_when_missing(tmp_path):
    def stage(name, inputs=(), **kw):
        return Stage(name, name.split(":")[0], "1", tuple(inputs), NoParams(), lambda p, i, o: None, **kw)

    plan = Plan([stage("pairs"), stage("train:b", ["pairs"], pinned={"init": Pinned("dense_model", "abc")}),
                 stage("train:c", pinned={"init": Pinned("dense_model", "abc")})])
    assert mermaid(plan).splitlines() == [
        "flowchart TD",
        '    s0["pairs"]',
        '    s0 --> s1["train:b"]',
        '    p1_0("dense_model (another run)") -.-> s1',
        '    p2_0("dense_model (another run)") -.-> s2["train:c"]',
    ]
    assert 'p1_0 -> s1 [style=dashed];' in dot(plan)
    missing = planned_stages(plan, tmp_path)
    assert missing[1].missing_pins == ("dense_model:abc",) and missing[0].missing_pins == ()
    # built (imported, say) without the other run's artifact: it is read, so nothing is missing
    from storage import Artifact

    run_stage(ArtifactStore(tmp_path), plan.stages["train:c"], {"init": Artifact("dense_model", "abc", tmp_path)})
    built = planned_stages(plan, tmp_path)
    assert built[2].state == BUILT and built[2].missing_pins == () and built[1].missing_pins == ("dense_model:abc",)
    assert planned_stages(plan, tmp_path / "no-root")[1].missing_pins == ("dense_model:abc",)   # no store: every pin
    run_stage(ArtifactStore(tmp_path), Stage("other", "dense_model", "1", (), NoParams(), lambda p, i, o: None), {})
    other = ArtifactStore(tmp_path).latest("dense_model")
    pinned_to_it = Plan([stage("train:d", pinned={"init": Pinned("dense_model", other.version)})])
    assert planned_stages(pinned_to_it, tmp_path)[0].missing_pins == ()   # the other run's artifact is there


def test_the_reduced_dag_leaves_out_only_the_edges_a_longer_path_implies(shared_data, tmp_path, capsys):
    def stage(name, inputs=()):
        return Stage(name, name.split(":")[0], "1", tuple(inputs), NoParams(), lambda p, i, o: None)

    # chunk -> evaluate and chunk -> search are implied (chunk -> encode -> search -> evaluate); questions -> search is not
    plan = Plan([stage("chunk"), stage("questions"), stage("encode", ["chunk"]),
                 stage("search", ["questions", "chunk", "encode"]), stage("evaluate", ["chunk", "search"])])
    assert mermaid(plan, reduced=True).splitlines() == [
        "flowchart TD", '    s0["chunk"]', '    s1["questions"]', '    s0 --> s2["encode"]',
        '    s1 & s2 --> s3["search"]', '    s3 --> s4["evaluate"]']
    assert "s0 -> s4;" in dot(plan) and "s0 -> s4;" not in dot(plan, reduced=True)
    # On a shipped config: fewer edges, the same nodes, and every dropped edge still a path of the drawing.
    from flows.plan import drawn_inputs

    demo = plan_for(load_config(PROJECT_ROOT / "configs" / "demo.yaml"))
    drawn = drawn_inputs(demo)
    reach = {}
    for st in demo:
        reach[st.name] = set(drawn[st.name]).union(*(reach[d] for d in drawn[st.name]))
    assert sum(map(len, drawn.values())) < sum(len(st.inputs) for st in demo)
    assert all(set(st.inputs) <= reach[st.name] for st in demo)
    capsys.readouterr()
    assert main(["--root", str(tmp_path), "plan", str(TINY), "--mermaid", "-", "--reduced"]) == 0
    assert capsys.readouterr().out == mermaid(plan_for(load_config(TINY)), reduced=True)


def test_a_bad_config_is_one_error_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nchunk: {words: -5}\n")
    assert main(["--root", str(tmp_path), "plan", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"pforge: error: {bad}: invalid config") and "chunk.words" in err[0]
