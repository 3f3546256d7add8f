"""Each config's page opens with the config's whole opening comment (prose as paragraphs, indented
lines such as commands kept as written), never a description cut off mid-sentence."""
from __future__ import annotations

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
