"""Numbers in the docs are generated, not typed: every block between `<!-- generated: SOURCE -->` and
`<!-- end generated -->` holds what docs/generate.py writes from its source now (a committed results
file; the study's tables are included by the site from the file the study runner rewrites); a block
whose number changed is reported stale, naming the page and the block, and rewritten; a marker naming a missing file or section is an error naming the page
and line; and the Results page carries no number outside a generated block."""
from __future__ import annotations

import re

import pytest

from tasks.config import PROJECT_ROOT
from tests.docs_scripts import docs_script

RESULTS_PAGE = PROJECT_ROOT / "docs" / "results.md"
RESULTS_FILE = """# bench_cpu

## Run one

| system | q/s |
|---|---:|
| ours | {ours} |
| peer | 3.8 |

## Run two

`the command`

| system | q/s |
|---|---:|
| ours | 4.0 |
"""




@pytest.fixture
def gen():
    return docs_script("generate")


@pytest.fixture
def project(tmp_path):
    """A project root with one committed results file (ours at 4.3 q/s)."""
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "bench_cpu.md").write_text(RESULTS_FILE.format(ours="4.3"), encoding="utf-8")
    return tmp_path


def _page(source: str, body: str = "") -> str:
    return f"# Page\n\nIntro.\n\n<!-- generated: {source} -->\n{body}<!-- end generated -->\n\nAfter.\n"


# ------------------------------------------------------------------------------ the committed docs
def test_every_generated_block_in_the_docs_is_current(gen):
    pages = gen.marked_pages()
    assert RESULTS_PAGE in pages and PROJECT_ROOT / "README.md" in pages
    stale = {}
    for page in pages:
        text = page.read_text(encoding="utf-8")
        rel = page.relative_to(PROJECT_ROOT).as_posix()
        written = gen.with_generated(text, rel)
        if written != text:
            stale[rel] = gen.stale_parts(text, written, rel)
    assert not stale, f"stale generated blocks (run `make docs-generate`): {stale}"


STUDY_TABLES = PROJECT_ROOT / "benchmarks" / "results" / "study_cpu.md"
STUDY_INCLUDE = re.compile(r'^--8<-- "benchmarks/results/study_cpu\.md:(?P<section>[a-z0-9-]+)"$', re.MULTILINE)


def test_the_results_page_includes_the_studys_committed_tables_section_by_section():
    # Included as the site is built (pymdownx.snippets sections), not copied: every record the study
    # runner commits rewrites study_cpu.md, and the page shows it without a regeneration.
    included = STUDY_INCLUDE.findall(RESULTS_PAGE.read_text(encoding="utf-8"))
    assert {"summary", "systems", "bars", "reproduction"} <= set(included), included
    tables = STUDY_TABLES.read_text(encoding="utf-8")
    for section in included:
        start, end = f"<!-- --8<-- [start:{section}] -->", f"<!-- --8<-- [end:{section}] -->"
        assert tables.count(start) == 1 and tables.count(end) == 1 and tables.index(start) < tables.index(end), section
    summary = tables.split("[start:summary] -->\n", 1)[1].split("\n", 1)[0]
    assert re.fullmatch(r"\d+ of \d+ rows measured .*", summary), summary


# ------------------------------------------------------------------------------ a stale block
def test_a_changed_number_is_reported_stale_naming_the_block_and_then_rewritten(gen, project):
    source = 'results benchmarks/results/bench_cpu.md "Run one"'
    page = project / "page.md"
    page.write_text(gen.with_generated(_page(source), "page.md", root=project), encoding="utf-8")
    assert "| ours | 4.3 |" in page.read_text(encoding="utf-8")
    # The benchmark is rerun: its committed file now says 4.6.
    (project / "benchmarks" / "results" / "bench_cpu.md").write_text(RESULTS_FILE.format(ours="4.6"), encoding="utf-8")
    old = page.read_text(encoding="utf-8")
    new = gen.with_generated(old, "page.md", root=project)
    assert "| ours | 4.6 |" in new and "4.3" not in new
    assert gen.stale_parts(old, new, "page.md") == [f"line 5: generated: {source}"]


def test_check_exits_1_naming_the_stale_page_and_block_and_a_rerun_rewrites_it(gen, project, monkeypatch, capsys):
    page = project / "page.md"
    page.write_text(_page("results benchmarks/results/bench_cpu.md table 2", "\n| ours | 3.9 |\n\n"), encoding="utf-8")
    monkeypatch.setattr(gen, "expected_pages",
                        lambda: {page: gen.with_generated(page.read_text(encoding="utf-8"), "page.md", root=project)})
    monkeypatch.setattr(gen, "orphan_pages", lambda: [])
    assert gen.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert f"stale: {page}: line 5: generated: results benchmarks/results/bench_cpu.md table 2" in out
    assert "3.9" in page.read_text(encoding="utf-8")  # --check rewrites nothing
    assert gen.main([]) == 0
    assert "| ours | 4.0 |" in page.read_text(encoding="utf-8")
    assert gen.main(["--check"]) == 0


@pytest.mark.parametrize("selector, shown", [
    ('"Run one"', "| ours | 4.3 |\n| peer | 3.8 |"),            # a heading alone: the section's body
    ('"Run two" table 1', "| ours | 4.0 |"),                      # the first table after the heading
    ("table 2", "| ours | 4.0 |"),                                # from the top of the file
    ("", "| ours | 4.3 |\n| peer | 3.8 |"),                       # nothing: the first table
])
def test_what_a_results_marker_selects(gen, project, selector, shown):
    content = gen.block_content(f"results benchmarks/results/bench_cpu.md {selector}", project)
    assert shown in content
    assert ("`the command`" in content) == (selector == '"Run two"')


# ------------------------------------------------------------------------------ bad markers
@pytest.mark.parametrize("source, message", [
    ('results benchmarks/results/bench_cpu.md "No such run"', 'bench_cpu.md has no heading that begins with "No such run"'),
    ("results benchmarks/results/missing.md", "no results file benchmarks/results/missing.md"),
    ('results benchmarks/results/bench_cpu.md "Run two" table 2', 'has 1 table(s) after heading "Run two", not table 2'),
    ('study squad-open "Bars"', "unknown source"),   # the site includes the study's tables: no copy goes stale
    ("survey squad-open summary", "unknown source"),
])
def test_a_marker_naming_a_missing_source_fails_with_the_page_and_line(gen, project, source, message):
    with pytest.raises(gen.GeneratedBlockError) as caught:
        gen.with_generated(_page(source), "docs/page.md", root=project)
    assert str(caught.value).startswith("docs/page.md:5: ") and message in str(caught.value), str(caught.value)


def test_a_block_without_its_end_marker_fails_with_the_page_and_line(gen, project):
    text = "# Page\n\n<!-- generated: results benchmarks/results/bench_cpu.md -->\n\nMore text.\n"
    with pytest.raises(gen.GeneratedBlockError, match=r"^page\.md:3: no `<!-- end generated -->`"):
        gen.with_generated(text, "page.md", root=project)


def test_a_marker_shown_in_a_code_fence_is_an_example_not_a_block(gen, project):
    text = "```markdown\n<!-- generated: results benchmarks/results/missing.md -->\n<!-- end generated -->\n```\n"
    assert gen.with_generated(text, "page.md", root=project) == text


def test_generate_check_fails_on_a_bad_marker_naming_it(gen, project, monkeypatch, capsys):
    page = project / "page.md"
    page.write_text(_page("results benchmarks/results/missing.md"), encoding="utf-8")
    monkeypatch.setattr(gen, "PROJECT_ROOT", project)
    monkeypatch.setattr(gen, "shipped_configs", lambda: [])  # no config page to plan
    monkeypatch.setattr(gen, "marked_pages", lambda: [page])
    assert gen.main(["--check"]) == 2
    assert "page.md:5: no results file benchmarks/results/missing.md" in capsys.readouterr().err


# ------------------------------------------------------------------------------ no typed number
# A paper's own numbering: the word after one of these names a part of the paper, not a result.
PAPER_REFERENCE = re.compile(r"\b(?:sections?|tables?|figures?|equations?|papers?)\s+(?P<ref>\d[\d.]*\d|\d)",
                             re.IGNORECASE)


def typed_numbers(text: str, gen, paper_references: bool = False) -> list[tuple[int, str]]:
    """(line, word) of each typed number: outside generated blocks, code fences and spans, headings,
    links and HTML comments, a word that holds a digit must begin with a letter (BM25, top-20, nDCG@10,
    v1.1 are names; 59.4, 2x, -0.5, 100-word are numbers). With `paper_references`, the number after
    "section", "table", "figure", "equation" or "paper" (section 4.1, table 2, paper 003) is the
    paper's numbering, not a result."""
    lines = text.split("\n")
    hidden = set()
    for block in gen.generated_blocks(text, "page"):
        hidden.update(range(block.first, block.last + 1))
    hidden.update(i for i, in_fence in enumerate(gen.fenced(lines)) if in_fence)
    hidden.update(i for i, line in enumerate(lines) if re.match(r"#{1,6} |--8<-- ", line))  # headings, includes
    prose = "\n".join("" if i in hidden else line for i, line in enumerate(lines))
    for hiding in (r"<!--.*?-->", r"`[^`]*`", r"!?\[[^\]]*\]\([^)]*\)"):
        prose = re.sub(hiding, lambda m: re.sub(r"[^\n]", " ", m.group()), prose, flags=re.DOTALL)
    if paper_references:
        prose = PAPER_REFERENCE.sub(lambda m: m.group()[:m.start("ref") - m.start()] + " " * len(m["ref"]), prose)
    found = []
    for word in re.finditer(r"\S+", prose):
        bare = word.group().lstrip("([{\"'*_~")
        if re.search(r"\d", bare) and not bare[:1].isalpha():
            found.append((prose.count("\n", 0, word.start()) + 1, word.group()))
    return found


@pytest.mark.parametrize("typed", ["gold-s1 reaches top-1 59.4.", "the hybrid is **2.4x** faster", "(-0.5, [-1.2, +0.1])",
                                   "on 2 cores", "passages of 100-word chunks", "at 1e-4"])
def test_the_rule_flags_a_typed_number(gen, typed):
    assert typed_numbers(f"Intro.\n\n{typed}\n", gen), typed


@pytest.mark.parametrize("named", ["BM25 and nDCG@10, top-20 and R@100 on SQuAD v1.1 with SmolLM2", "`k1: 0.9`",
                                   "## Quality on an H100 (2 cores)", "[paper 003](papers/negative-contrast.md)",
                                   "```bash\npforge run --epochs 10\n```", _page("results benchmarks/results/bench_cpu.md", "| ours | 4.3 |\n"),
                                   '--8<-- "benchmarks/results/study_cpu.md:systems"'])
def test_the_rule_passes_names_code_headings_links_includes_and_generated_blocks(gen, named):
    assert typed_numbers(named, gen) == [], named


def test_the_results_page_types_no_number(gen):
    found = typed_numbers(RESULTS_PAGE.read_text(encoding="utf-8"), gen)
    assert not found, ("numbers typed on docs/results.md (generate them from a committed result, "
                       f"or leave them out): {found}")


PAPER_PAGES = sorted(p for p in (PROJECT_ROOT / "docs" / "papers").glob("*.md") if p.name != "index.md")


def results_section(text: str) -> str:
    """A paper page from its `## Results` heading to its end, the lines before it blanked (so that
    line numbers stay the page's)."""
    head, heading, rest = text.partition("\n## Results\n")
    assert heading, "a paper page has a `## Results` section"
    return "\n" * (head.count("\n") + 1) + heading.lstrip("\n") + rest


@pytest.mark.parametrize("typed", ["section 4.1 gains 1.4", "table 2: 55.0", "paper 003 reaches 59.4"])
def test_a_paper_reference_exempts_only_the_number_after_it(gen, typed):
    assert [word for _, word in typed_numbers(f"Intro.\n\n{typed}\n", gen, paper_references=True)] == [typed.split()[-1]]


@pytest.mark.parametrize("named", ["paper 000 figure 2", "sections 4.2 and section 5.3 of paper 001", "Table 2, equation 3"])
def test_a_paper_reference_is_not_a_typed_number_on_a_paper_page(gen, named):
    assert typed_numbers(named, gen, paper_references=True) == [], named
    assert typed_numbers(named, gen), "elsewhere the rule still flags it"


@pytest.mark.parametrize("page", PAPER_PAGES, ids=[p.stem for p in PAPER_PAGES])
def test_the_results_section_of_a_paper_page_types_no_number(gen, page):
    assert len(PAPER_PAGES) == 4
    section = results_section(page.read_text(encoding="utf-8"))
    found = typed_numbers(section, gen, paper_references=True)
    assert not found, (f"numbers typed in the Results section of {page.relative_to(PROJECT_ROOT)} (generate them "
                       f"from a committed result, or leave them out): {found}")


@pytest.mark.parametrize("page", PAPER_PAGES, ids=[p.stem for p in PAPER_PAGES])
def test_a_paper_page_includes_its_papers_study_rows(page):
    paper = re.search(r"\(paper (\d{3})\)", page.read_text(encoding="utf-8").split("\n", 1)[0])[1]
    section = results_section(page.read_text(encoding="utf-8"))
    assert f"paper-{paper}" in STUDY_INCLUDE.findall(section), page.name


# ------------------------------------------------------------------------------ unmeasured columns
def test_a_column_no_row_measured_is_left_out_and_one_measured_anywhere_stays(gen, project):
    (project / "benchmarks" / "results" / "times_cpu.md").write_text(
        "# times\n\n## Times\n\n| CPU | pipeline | `make install` | measured |\n|---|---:|---:|---|\n"
        "| A | 12 min | - | 2026-12-02 |\n| B | 13 min | - | 2026-12-03 |\n", encoding="utf-8")
    shown = gen.block_content('results benchmarks/results/times_cpu.md "Times"', project)
    assert shown == "| CPU | pipeline | measured |\n|---|---:|---|\n| A | 12 min | 2026-12-02 |\n| B | 13 min | 2026-12-03 |"
    (project / "benchmarks" / "results" / "times_cpu.md").write_text(
        "# times\n\n## Times\n\n| CPU | `make install` |\n|---|---:|\n| A | - |\n| B | 4 min 2 s |\n", encoding="utf-8")
    assert "| B | 4 min 2 s |" in gen.block_content('results benchmarks/results/times_cpu.md "Times"', project)


def test_getting_started_gives_the_make_install_time_only_when_a_committed_run_holds_one():
    import json

    runs = json.loads((PROJECT_ROOT / "benchmarks" / "results" / "demo_run_cpu.json").read_text(encoding="utf-8"))
    page = (PROJECT_ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    times = page.split('demo_run_cpu.md "Times" -->', 1)[1].split("<!-- end generated -->", 1)[0]
    assert ("`make install` |" in times) == any(run.get("install_s") for run in runs)


# ------------------------------------------------------------------------------ stage times (a hook)
def _record(stages, cpu="CPU X (family 1 model 2)", **extra):
    return {"machine": {"key": cpu, "cores": 2}, "stages": [
        {"step": step, "version": version, "artifact": artifact, "rows": rows, "build_s": seconds,
         "created_at": f"2026-12-01T00:00:{i:02d}"} for i, (step, version, artifact, rows, seconds) in enumerate(stages)],
        **extra}


def test_stage_times_lists_each_stage_version_once_and_a_systems_stages_as_one_row(tmp_path):
    import json

    hooks = docs_script("hooks")
    records = tmp_path / "studies" / "s" / "records"
    records.mkdir(parents=True)
    shared = [("chunk", "c1", "passages", 1000, 2.0), ("encode:a", "e1", "embeddings", 1000, 100.0)]
    (records / "a.json").write_text(json.dumps(_record(shared + [("train:a", "t1", "dense_model", 0, 600.0)])))
    (records / "b.json").write_text(json.dumps(_record(shared + [("train:b", "t2", "dense_model", 0, 1800.0),
                                                                 ("encode:b", "e2", "embeddings", 1000, 300.0)])))
    # a backfilled record's figure for a version another record measured is not the one shown
    (records / "c.json").write_text(json.dumps(_record([("chunk", "c1", "passages", 1000, 99.0)],
                                                       backfilled_from="docs at an older commit")))
    table = hooks.stage_times(tmp_path, "studies/s/records", "scaled", "to", "1000000", "passages").split("\n")
    assert table[0] == "| stage | builds | rows | build time, median (range) | at 1,000,000 passages, linear | CPU |"
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table[2:]}
    assert list(rows) == ["`chunk`", "`encode:*`", "`train:*`"]
    assert rows["`chunk`"] == "| `chunk` | 1 | 1,000 | 2.0 s | 33 min 20 s | CPU X (family 1 model 2), 2 cores |"
    assert "| 2 | 1,000 | 3 min 20 s (1 min 40 s to 5 min 0 s) | 2.3 days |" in rows["`encode:*`"]
    assert "| 2 | - | 20 min 0 s (10 min 0 s to 30 min 0 s) | - |" in rows["`train:*`"]
    with pytest.raises(ValueError, match="scaled to N passages"):
        hooks.stage_times(tmp_path, "studies/s/records", "scaled", "to", "many")


def test_stage_times_name_another_configs_step_by_its_config(tmp_path):
    """A row's record lists the steps of another config's run it needed first with their config:
    that generator is a row of its own, not the study's `qgen_model`."""
    import json

    hooks = docs_script("hooks")
    records = tmp_path / "studies" / "s" / "records"
    records.mkdir(parents=True)
    record = _record([("qgen_model", "g1", "qgen_model", 0, 4000.0), ("qgen_model", "g2", "qgen_model", 0, 300.0)])
    record["stages"][1]["config"] = "configs/squad-open.yaml"
    (records / "a.json").write_text(json.dumps(record))
    rows = [line.split(" | ")[0].lstrip("| ") for line in hooks.stage_times(tmp_path, "studies/s/records").split("\n")[2:]]
    assert rows == ["`qgen_model`", "`squad-open.yaml:qgen_model`"]


def test_operations_draws_the_studys_stage_times_from_its_records_as_the_site_is_built():
    hooks = docs_script("hooks")
    page = (PROJECT_ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    markers = hooks.STAGE_TIMES.findall(page)
    assert markers == ["studies/squad-open/records scaled to 21015324 passages"]
    table = hooks.stage_times(PROJECT_ROOT, *markers[0].split())
    assert "| `encode:*` |" in table and "| `chunk` |" in table
    rendered = hooks.on_page_markdown(page, None, {"config_file_path": str(PROJECT_ROOT / "mkdocs.yml")}, None)
    assert table in rendered and "<!-- stage-times:" not in rendered
