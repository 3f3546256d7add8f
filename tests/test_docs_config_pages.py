"""Each config's page opens with the config's whole opening comment (prose as paragraphs, indented
lines such as commands kept as written), never a description cut off mid-sentence; and draws its
stages readably: no diagram of more than flows.plan.MAX_NODES nodes, a large plan as an overview of
its stage families and parts that hold every stage once."""
from __future__ import annotations

import re

import pytest

from tasks.config import PROJECT_ROOT
from tests.docs_scripts import docs_script

gen = docs_script("generate")
CONFIGS = sorted((PROJECT_ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_the_config_page_carries_the_whole_opening_comment(config):
    page = (PROJECT_ROOT / "docs" / "configs" / f"{config.stem}.md").read_text(encoding="utf-8")
    opening = page.split("## Stages")[0]
    words = gen.header_comment(config).replace("<", "&lt;").split()
    assert " ".join(words) in " ".join(opening.replace("```text", " ").replace("```", " ").split())
    assert " ...\n" not in opening


def test_prose_lines_join_and_indented_lines_stay_as_written(tmp_path):
    config = tmp_path / "x.yaml"
    config.write_text("# First line of prose\n# goes on here.\n#\n# A second paragraph:\n#   pforge run x.yaml\n"
                      "#   pforge plan x.yaml\n# and after <it>.\nname: x\n", encoding="utf-8")
    assert gen.description(config) == ("First line of prose goes on here.\n\nA second paragraph:\n\n"
                                       "```text\npforge run x.yaml\npforge plan x.yaml\n```\n\nand after &lt;it>.")


# ------------------------------------------------------------------------------ the drawings
FENCE = re.compile(r"```mermaid\n(.*?)```", re.DOTALL)
DECLARED = re.compile(r"\b([a-z]\w*)(?:\[\"|\(\[\"|\(\")([^\"]*)\"")   # id["stage"], id(["outside"]), id("pin")
BOX = re.compile(r"\b[a-z]\w*\[\"([^\"]*)\"\]")                          # a stage drawn in this diagram
LARGE = {"demo", "squad-open", "study"}   # 26, 26 and 114 stages: too many for one drawing


def _plans():
    from flows.registry import plan_for
    from tasks.config import load_config
    from tasks.errors import InputError

    for config in CONFIGS:
        try:
            yield config, plan_for(load_config(config))
        except InputError:   # its files are not here: the page says it is not drawn
            continue


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_no_diagram_of_a_config_page_has_more_than_max_nodes(config):
    from flows.plan import MAX_NODES

    page = (PROJECT_ROOT / "docs" / "configs" / f"{config.stem}.md").read_text(encoding="utf-8")
    for i, dag in enumerate(FENCE.findall(page), 1):
        nodes = {node for node, _ in DECLARED.findall(dag)}
        assert len(nodes) <= MAX_NODES, f"{config.stem}: diagram {i} draws {len(nodes)} nodes"


def test_a_large_plans_page_draws_an_overview_and_parts_holding_every_stage(shared_data):
    from flows.plan import fits_one_drawing

    large = set()
    for config, plan in _plans():
        page = (PROJECT_ROOT / "docs" / "configs" / f"{config.stem}.md").read_text(encoding="utf-8")
        dags = FENCE.findall(page)
        boxes = [label for dag in dags for label in BOX.findall(dag)]
        if fits_one_drawing(plan):
            assert len(dags) == 1 and sorted(boxes) == sorted(plan.names()), config.stem
            continue
        large.add(config.stem)
        assert "<!-- dag: configs/" + config.name + " --overview -->" in page, config.stem
        # every stage is a box of exactly one part; the overview's boxes are families
        parts = [dag for dag in dags[1:]]
        assert sorted(label for dag in parts for label in BOX.findall(dag)) == sorted(plan.names()), config.stem
        assert len(parts) >= 2 and "### Part 2: " in page, config.stem
    assert LARGE <= large, LARGE - large
