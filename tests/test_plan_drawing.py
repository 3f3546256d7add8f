"""A large plan's drawing (flows/plan.py): `pforge plan CONFIG --mermaid FILE --overview` draws one
node per stage family, `--part N` one of the parts of at most MAX_NODES nodes that hold every stage
once, each with the stages it reads from other parts; a plan that fits one drawing is one part, its
whole `--reduced` drawing."""
from __future__ import annotations

import re

import pytest

from flows.cli import main
from flows.plan import (COLLAPSED_ABOVE, MAX_NODES, MAX_WIDTH, OUTSIDE, OVERVIEW, STAGE, Drawing, Node, dot, drawing,
                        drawn_inputs, estimated_widths, family, fits_one_drawing, mermaid, mermaid_text, overview,
                        parts)
from flows.registry import plan_for
from tasks.config import PROJECT_ROOT, load_config
from tasks.engine import NoParams, Pinned, Plan, Stage

CONFIGS = PROJECT_ROOT / "configs"
DEMO, STUDY, TINY = CONFIGS / "demo.yaml", CONFIGS / "study.yaml", CONFIGS / "tiny.yaml"


@pytest.fixture(scope="module")
def demo():
    return plan_for(load_config(DEMO))


@pytest.fixture(scope="module")
def study():
    return plan_for(load_config(STUDY))


def _stage(name, inputs=(), **kw):
    return Stage(name, name.split(":")[0], "1", tuple(inputs), NoParams(), lambda p, i, o: None, **kw)


def test_the_demo_is_too_large_for_one_drawing_and_tiny_is_not(demo):
    assert not fits_one_drawing(demo) and len(demo.names()) > MAX_NODES
    tiny = plan_for(load_config(TINY))
    assert fits_one_drawing(tiny)
    assert [part.stages for part in parts(tiny)] == [tuple(tiny.names())]
    assert mermaid(tiny, view=1) == mermaid(tiny, reduced=True)  # a small plan is drawn as it always was


@pytest.mark.parametrize("config", [DEMO, STUDY], ids=["demo", "study"])
def test_parts_hold_every_stage_once_in_at_most_max_nodes_each(config):
    plan = plan_for(load_config(config))
    found = parts(plan)
    assert len(found) > 1
    assert sorted(name for part in found for name in part.stages) == sorted(plan.names())
    for i, part in enumerate(found, 1):
        drawn = drawing(plan, view=i)
        assert len(drawn.nodes) <= MAX_NODES, (i, part.title)
        assert [n.label for n in drawn.nodes if n.kind == STAGE] == list(part.stages)
    assert len(overview(plan).nodes) <= MAX_NODES


def test_a_part_draws_each_input_from_another_part_as_an_outside_node(demo):
    drawn_in = drawn_inputs(demo)
    for i, part in enumerate(parts(demo), 1):
        drawn = drawing(demo, view=i)
        labels = {node.id: node.label for node in drawn.nodes}
        kinds = {node.id: node.kind for node in drawn.nodes}
        for name in part.stages:
            target = next(node.id for node in drawn.nodes if node.label == name and node.kind == STAGE)
            sources = {labels[a] for a, b in drawn.edges if b == target}
            assert sources == set(drawn_in[name]), name   # the demo collapses nothing
            for a, b in drawn.edges:
                if b == target and labels[a] not in part.stages:
                    assert kinds[a] == OUTSIDE
    second = mermaid(demo, view=2)
    assert '    s10(["negatives:context"])\n    s10 --> s13["train:stage1"]\n' in second


def test_many_inputs_of_one_family_from_other_parts_are_one_node(study):
    last = drawing(study, view=len(parts(study)))
    evaluate = next(node.id for node in last.nodes if node.label == "evaluate")
    into = [node for node in last.nodes if (node.id, evaluate) in last.edges]
    searched = [dep for dep in drawn_inputs(study)["evaluate"] if family(dep) == "search"]
    assert len(searched) > COLLAPSED_ABOVE
    assert f"{len(searched)} search stages" in [node.label for node in into if node.kind == OUTSIDE]
    assert not any(node.label.startswith("search:") for node in into)


def test_the_overview_draws_a_node_per_family_and_no_edge_a_longer_path_implies(demo):
    drawn = overview(demo)
    families = list(dict.fromkeys(family(name) for name in demo.names()))
    assert [family(node.label.split(" ")[0].rstrip(":")) for node in drawn.nodes] == families
    assert families[:3] == ["ingest", "chunk", "gold"] and {"train", "encode", "index", "search", "evaluate"} <= set(families)
    ids = {family(node.label.split(" ")[0].rstrip(":")): node.id for node in drawn.nodes}
    assert (ids["chunk"], ids["bm25"]) in drawn.edges
    assert (ids["ingest"], ids["search"]) not in drawn.edges   # ingest -> chunk -> ... -> search says it
    text = mermaid(demo, view=OVERVIEW)
    assert '    f0["ingest (2 stages)"]\n    f0 --> f1["chunk"]\n' in text
    assert 'f11["evaluate"]' in text


def test_the_overview_keeps_a_loop_of_families_and_pins_to_another_run():
    # search -> negatives -> train -> encode -> index -> search: mined negatives train the next round.
    plan = Plan([_stage("chunk"), _stage("train:a", ["chunk"]), _stage("encode:a", ["train:a"]),
                 _stage("index:a", ["encode:a"]), _stage("search:a", ["index:a"]),
                 _stage("negatives:mined", ["search:a"]), _stage("train:b", ["negatives:mined"],
                                                              pinned={"init": Pinned("dense_model", "abc")})])
    drawn = overview(plan)
    ids = {family(node.label.split(" ")[0].rstrip(":")): node.id for node in drawn.nodes}
    assert (ids["search"], ids["negatives"]) in drawn.edges and (ids["negatives"], ids["train"]) in drawn.edges
    text = mermaid(plan, view=OVERVIEW)
    assert '    p1_0("dense_model (another run)") -.-> f1\n' in text
    assert 'f2["encode:a"]' in text and 'f1["train (2 stages)"]' in text


def test_a_part_is_packed_only_while_its_drawing_stays_narrow(study):
    # The study's fusion, rerank and evaluation stages fit 16 nodes together, but drawn together
    # their labels shrank below legibility on the page: they are parts of their own.
    found = parts(study)
    assert all(min(estimated_widths(drawing(study, view=i))) <= MAX_WIDTH for i in range(1, len(found) + 1))
    assert [part.title for part in found[-3:]] == ["fusion", "rerank", "evaluate"]


def test_a_wide_fan_into_one_stage_is_drawn_left_to_right_and_a_chain_top_down(study):
    assert drawing(study, view=len(parts(study))).direction == "LR"   # the evaluation reads every run
    assert mermaid(study, view=len(parts(study))).startswith("flowchart LR\n")
    assert drawing(study, view=2).direction == "TD"                   # systems: train -> encode -> index -> search
    chain = Drawing(tuple(Node(f"s{i}", f"stage-{i}") for i in range(4)), (("s0", "s1"), ("s1", "s2"), ("s2", "s3")))
    assert mermaid_text(chain).startswith("flowchart TD\n")


def test_pforge_plan_writes_the_overview_and_each_part(shared_data, tmp_path, capsys, demo):
    target = tmp_path / "overview.mmd"
    assert main(["--root", str(tmp_path / "store"), "plan", str(DEMO), "--mermaid", str(target), "--overview",
                 "--dot", str(tmp_path / "overview.dot")]) == 0
    assert target.read_text() == mermaid(demo, view=OVERVIEW)
    assert (tmp_path / "overview.dot").read_text() == dot(demo, view=OVERVIEW)
    assert f"mermaid DAG: {target}" in capsys.readouterr().out
    for i in range(1, len(parts(demo)) + 1):
        assert main(["--root", str(tmp_path / "store"), "plan", str(DEMO), "--mermaid", "-", "--part", str(i)]) == 0
        assert capsys.readouterr().out == mermaid(demo, view=i)
    labels = re.findall(r's\d+\["([^"]+)"\]', "".join(mermaid(demo, view=i) for i in range(1, len(parts(demo)) + 1)))
    assert sorted(labels) == sorted(demo.names())   # every stage drawn once as a box


def test_a_part_the_plan_does_not_have_is_one_error_line(shared_data, tmp_path, capsys, demo):
    assert main(["--root", str(tmp_path), "plan", str(DEMO), "--mermaid", "-", "--part", "99"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"drawn in {len(parts(demo))} part(s)" in err[0], err
    with pytest.raises(SystemExit):
        main(["plan", str(DEMO), "--overview", "--part", "1"])   # one view at a time
