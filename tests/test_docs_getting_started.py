"""Getting started is the page a newcomer reads first, in a few minutes: it fits about one screen and
a half of Markdown (the lines docs/generate.py writes, generated blocks' contents and DAG fences, are
not counted: they follow the results and the plan), and it keeps what a newcomer needs: the two
commands and how to pick the Python, what the demo runs and prints, its times, the Prefect UI
section the README links to, and a list of next steps. Every `getting-started.md#anchor` link of the
site and the README still finds its heading; the page types no number."""
from __future__ import annotations

import re

import pytest

from tasks.config import PROJECT_ROOT
from tests.docs_scripts import docs_script
from tests.test_docs_generated import typed_numbers

PAGE = PROJECT_ROOT / "docs" / "getting-started.md"
README = PROJECT_ROOT / "README.md"
MAX_LINES = 100  # about one screen and a half, its generated tables and the DAG aside
UI_SECTION = "Watching it in the Prefect UI"
UI_ANCHOR = "watching-it-in-the-prefect-ui"


@pytest.fixture(scope="module")
def gen():
    return docs_script("generate")


def written_lines(text: str, gen) -> list[str]:
    """The page's lines but those docs/generate.py writes: a generated block's content (its two markers
    stay, counted) and the mermaid fence after a `<!-- dag: ... -->` marker (the marker counted)."""
    lines = text.split("\n")
    dropped = set()
    for block in gen.generated_blocks(text, "getting-started.md"):
        dropped.update(range(block.first + 1, block.last))
    for match in gen.MARKED_DAG.finditer(text):
        first = text.count("\n", 0, match.start()) + 1  # the fence opens on the line after the marker
        dropped.update(range(first, text.count("\n", 0, match.end()) + 1))
    kept = [line for i, line in enumerate(lines) if i not in dropped]
    return kept[:-1] if kept and kept[-1] == "" else kept  # the file's final newline is no line


def sections(text: str) -> dict[str, str]:
    """Each `## ` section's title -> its body, up to the next `## ` heading."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2])}


def test_the_count_leaves_out_generated_contents_and_dag_fences_but_not_their_markers(gen):
    text = ("# Page\n\nIntro.\n\n<!-- generated: results benchmarks/results/x.md -->\n| a |\n|---|\n| 1 |\n"
            "<!-- end generated -->\n\n<!-- dag: configs/tiny.yaml -->\n```mermaid\nflowchart TD\n    a --> b\n```\n\n"
            "```bash\nmake demo\n```\n")
    assert written_lines(text, gen) == ["# Page", "", "Intro.", "", "<!-- generated: results benchmarks/results/x.md -->",
                                        "<!-- end generated -->", "", "<!-- dag: configs/tiny.yaml -->", "",
                                        "```bash", "make demo", "```"]


def test_the_page_fits_one_screen_and_a_half(gen):
    text = PAGE.read_text(encoding="utf-8")
    count = len(written_lines(text, gen))
    assert count <= MAX_LINES, (f"docs/getting-started.md has {count} lines besides its generated blocks and DAG "
                                f"(at most {MAX_LINES}): move reference material to operations.md or concepts.md "
                                "and leave a link")
    assert len(sections(text)) <= 7, list(sections(text))


def test_the_page_keeps_what_a_newcomer_needs():
    text = PAGE.read_text(encoding="utf-8")
    found = sections(text)
    install = found["Install and run"]
    assert "make demo" in install and "make test" in install, "the two commands"
    assert "make PYTHON=" in install and "requires-python" in install, "how to pick the Python"
    assert "What the demo runs" in found and "What it prints" in found and "How long it takes" in found
    assert 'demo_run_cpu.md "Times" -->' in found["How long it takes"], "the table of times, generated"
    ui = found[UI_SECTION]
    assert "PREFECT_API_URL" in ui and "pforge serve" in ui, "watching a run and starting one from the UI"
    assert ui.count("](assets/images/prefect-") >= 3, "the UI's screenshots"
    assert all((PROJECT_ROOT / "docs" / image).is_file()
               for image in re.findall(r"\]\((assets/images/[^)]+)\)", ui))
    steps = re.findall(r"^- \[[^\]]+\]\(([^)\s]+)\)", found["Next steps"], flags=re.MULTILINE)
    assert len(steps) >= 4 and all((PROJECT_ROOT / "docs" / s.split("#")[0]).is_file() for s in steps), steps
    assert list(found)[-1] == "Next steps"


def test_the_readme_links_the_prefect_ui_section_and_every_link_into_the_page_finds_its_heading():
    from markdown.extensions.toc import slugify

    page = PAGE.read_text(encoding="utf-8")
    unfenced = re.sub(r"```.*?```", "", page, flags=re.DOTALL)
    anchors = {slugify(re.sub(r"[`*]", "", title), "-") for title in re.findall(r"^#+ (.+)$", unfenced, flags=re.MULTILINE)}
    assert UI_ANCHOR in anchors
    readme = README.read_text(encoding="utf-8")
    assert f"docs/getting-started.md#{UI_ANCHOR}" in readme
    linking = [README, *(PROJECT_ROOT / "docs").rglob("*.md")]
    links = [(path.relative_to(PROJECT_ROOT).as_posix(), anchor) for path in linking
             for anchor in re.findall(r"getting-started\.md#([A-Za-z0-9_-]+)", path.read_text(encoding="utf-8"))]
    broken = [f"{path}: #{anchor}" for path, anchor in links if anchor not in anchors]
    assert not broken, f"links into docs/getting-started.md whose heading is gone: {broken}"


def test_the_page_types_no_number(gen):
    found = typed_numbers(PAGE.read_text(encoding="utf-8"), gen)
    assert not found, f"numbers typed on docs/getting-started.md (generate them, or leave them out): {found}"
