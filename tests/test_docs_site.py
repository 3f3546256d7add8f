"""The documentation site (mkdocs.yml, docs/) as CI checks it: `mkdocs build --strict` passes with no
warning and fails on a broken link or anchor (so the check itself is proven); the README stays short
and links into pages that exist; every stage DAG drawn in the README and the docs is what
`pforge plan --mermaid --reduced [--overview | --part N]` writes now, and every page and block docs/generate.py writes (config pages,
DAGs, generated results tables, the Changelog) is current (tests/test_docs_generated.py tests the
generated blocks themselves)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from flows.cli import main
from tasks.config import PROJECT_ROOT, load_config
from tests.docs_scripts import build_site, docs_script

DOCS = PROJECT_ROOT / "docs"
README = PROJECT_ROOT / "README.md"
PAPER_PAGES = sorted(p for p in (DOCS / "papers").glob("*.md") if p.name != "index.md")
# What the build reads besides docs/: the files its snippets include (configs, the study's tables) and
# the modules the API page renders.
BUILD_INPUTS = ("configs", "benchmarks", "storage", "flows", "tasks", "models")


def test_the_site_builds_strictly_without_a_warning(tmp_path):
    site = tmp_path / "site"
    code, log = build_site(PROJECT_ROOT, site)
    assert code == 0, log[-5000:]
    assert "WARNING" not in log, log[-5000:]
    for page in ["getting-started", "concepts", "your-own-corpus", "operations", "benchmarks", "results",
                 "contributing", "api", "configs", "configs/demo", "papers", *(f"papers/{p.stem}" for p in PAPER_PAGES)]:
        assert (site / page / "index.html").exists(), page
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    for documented in ("storage.store.ArtifactStore", "storage.store.ArtifactStore.materialize", "storage.catalog.Catalog",
                       "storage.paths.resolve_root", "flows.search.search", "flows.promotion.promote",
                       "tasks.config.load_config", "flows.plan.mermaid"):
        assert f'id="{documented}"' in api, documented
    assert 'class="mermaid"' in (site / "getting-started" / "index.html").read_text(encoding="utf-8")
    # The config page's YAML comes from configs/ itself (a snippet), so it cannot go stale.
    assert "wikipedia_max_pages" in (site / "configs" / "demo" / "index.html").read_text(encoding="utf-8")
    # The study's stage times are drawn from its records as the site is built (docs/hooks.py).
    operations = (site / "operations" / "index.html").read_text(encoding="utf-8")
    assert "<code>encode:*</code>" in operations and "stage-times:" not in operations


@pytest.mark.parametrize("bad_link", ["no-such-page.md", "concepts.md#no-such-section"])
def test_a_broken_link_fails_the_strictbuild_site(tmp_path, bad_link):
    project = tmp_path / "project"
    shutil.copytree(DOCS, project / "docs")
    shutil.copy(PROJECT_ROOT / "mkdocs.yml", project / "mkdocs.yml")
    for name in BUILD_INPUTS:
        (project / name).symlink_to(PROJECT_ROOT / name)
    page = project / "docs" / "getting-started.md"
    page.write_text(page.read_text(encoding="utf-8") + f"\nSee [this]({bad_link}).\n", encoding="utf-8")
    code, log = build_site(project, tmp_path / "site")
    warnings = [line for line in log.splitlines() if line.startswith("WARNING")]
    assert code != 0 and "Aborted with 1 warnings in strict mode" in log, log[-3000:]
    assert len(warnings) == 1 and bad_link in warnings[0], warnings  # the copy is intact but for the bad link


def _headings(page: Path) -> set[str]:
    """The anchors MkDocs gives a page's headings (Python-Markdown's toc slugs)."""
    from markdown.extensions.toc import slugify

    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    return {slugify(re.sub(r"[`*]", "", m), "-") for m in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)}


def test_the_readme_is_short_and_links_into_pages_that_exist():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", text)
    for path, anchor in links:
        assert (PROJECT_ROOT / path).is_file(), path
        assert not anchor or anchor in _headings(PROJECT_ROOT / path), f"{path}#{anchor}"
    # One click from the README: running on your own corpus, each paper's stages, the latest results
    # with their commands (and the site's entry points).
    linked = {path for path, _ in links}
    wanted = {"docs/index.md", "docs/getting-started.md", "docs/your-own-corpus.md", "docs/results.md",
              "docs/benchmarks.md", *(p.relative_to(PROJECT_ROOT).as_posix() for p in PAPER_PAGES)}
    assert wanted <= linked, wanted - linked
    assert "make demo" in text and "make test" in text


@pytest.mark.parametrize("page", PAPER_PAGES, ids=[p.stem for p in PAPER_PAGES])
def test_each_paper_page_has_its_method_settings_configs_and_results(page):
    text = page.read_text(encoding="utf-8")
    assert "## Method, settings and configs" in text and "## Results" in text
    assert re.search(r"[Ss]ections? \d", text), "settings cite the paper's sections"
    assert re.search(r"\]\(\.\./configs/[a-z0-9-]+\.md\)", text), "links the pages of its configs"
    assert "|---" in text, "a results table"


def test_the_config_examples_of_your_own_corpus_validate(tmp_path):
    blocks = re.findall(r"```yaml\n(.*?)```", (DOCS / "your-own-corpus.md").read_text(encoding="utf-8"), re.DOTALL)
    examples = [b for b in blocks if b.startswith("name:")]
    assert len(examples) == 2
    for i, example in enumerate(examples):
        (tmp_path / f"example{i}.yaml").write_text(example, encoding="utf-8")
        load_config(tmp_path / f"example{i}.yaml")  # raises ConfigError, naming the field, if the page is wrong


def test_every_generated_page_and_block_is_current(shared_data):
    """What `docs/generate.py --check` checks: each config's page, every DAG fence and generated block,
    the Changelog page, and no page left of a config that is gone."""
    gen = docs_script("generate")
    stale = {gen.shown(p): parts for p, parts in gen.stale_pages(gen.expected_pages()).items()}
    assert not stale, f"stale docs pages (run `make docs-generate`): {stale}"
    pages = {p.stem for p in (DOCS / "configs").glob("*.md")} - {"index"}
    assert pages == {p.stem for p in gen.shipped_configs()}


def test_every_dag_in_the_docs_is_what_pforge_plan_writes_now(shared_data, tmp_path, capsys):
    gen = docs_script("generate")
    drawn = [(page, config, option, dag) for page in [README, *sorted(DOCS.rglob("*.md"))]
             for config, option, dag in gen.marked_dags(page.read_text(encoding="utf-8"))]
    configs = {config for _, config, _, _ in drawn}
    # Every shipped config is drawn, unless it cannot be planned here: a plan hashes the input files,
    # and DPR's passage TSV is not in ../shared/data. Its page says so, and `pforge plan` must agree.
    for config in sorted({f"configs/{p.name}" for p in gen.shipped_configs()} - configs):
        assert main(["--root", str(tmp_path / "store"), "plan", str(PROJECT_ROOT / config)]) == 2, config
        assert "not found" in capsys.readouterr().err, config
        assert "Not drawn here" in (DOCS / "configs" / f"{Path(config).stem}.md").read_text(encoding="utf-8")
    assert {page for page, config, _, _ in drawn if config == "configs/demo.yaml"} >= {
        README, DOCS / "index.md", DOCS / "getting-started.md"}
    written = {}
    for config, option in sorted({(config, option or "") for _, config, option, _ in drawn}):
        target = tmp_path / f"{Path(config).stem}{option.replace(' ', '')}.mmd"
        assert main(["--root", str(tmp_path / "store"), "plan", str(PROJECT_ROOT / config), "--mermaid", str(target),
                     "--reduced", *option.split()]) == 0
        written[config, option] = target.read_text(encoding="utf-8")
    capsys.readouterr()
    stale = [f"{page.relative_to(PROJECT_ROOT)}: {config} {option or ''}" for page, config, option, dag in drawn
             if dag != written[config, option or ""]]
    assert not stale, f"DAGs that differ from `pforge plan --mermaid --reduced` (run `make docs-generate`): {stale}"
