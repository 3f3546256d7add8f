"""Keep the docs' stage DAGs in step with `pforge plan`: a page per shipped config
(docs/configs/NAME.md, with its DAG and its YAML), their index (docs/configs/index.md), and every
DAG fence marked `<!-- dag: configs/NAME.yaml -->` in README.md and docs/ (e.g. the demo's), and the
site's Changelog page (docs/changelog.md, a copy of CHANGELOG.md).

    .venv/bin/python docs/gen_dags.py           # rewrite what changed (`make docs-dags`)
    .venv/bin/python docs/gen_dags.py --check   # exit 1 if a page is stale, rewriting nothing

tests/test_docs_site.py holds every DAG drawn in the docs to what `pforge plan --mermaid` writes.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT))  # run as a script from anywhere: the project's packages

CONFIGS = PROJECT_ROOT / "configs"
PAGES = PROJECT_ROOT / "docs" / "configs"
CHANGELOG = PROJECT_ROOT / "CHANGELOG.md"
CHANGELOG_PAGE = PROJECT_ROOT / "docs" / "changelog.md"
# A DAG fence: the marker naming its config (relative to the project root), then a mermaid fence.
MARKED_DAG = re.compile(r"<!-- dag: (?P<config>\S+) -->\n```mermaid\n(?P<dag>.*?)```", re.DOTALL)


def shipped_configs() -> list[Path]:
    return sorted(CONFIGS.glob("*.yaml"))


def dag_of(config: Path) -> str:
    """What `pforge plan CONFIG --mermaid FILE` writes."""
    from flows.plan import mermaid
    from flows.registry import plan_for
    from tasks.config import load_config

    return mermaid(plan_for(load_config(config)))


def marked_dags(text: str) -> list[tuple[str, str]]:
    """(config, DAG) of every marked fence in a page."""
    return [(m["config"], m["dag"]) for m in MARKED_DAG.finditer(text)]


def with_dags(text: str) -> str:
    """`text` with every marked fence holding its config's DAG as planned now."""
    return MARKED_DAG.sub(lambda m: f"<!-- dag: {m['config']} -->\n```mermaid\n{dag_of(PROJECT_ROOT / m['config'])}```",
                          text)


# ------------------------------------------------------------------------------ config pages
def header_comment(config: Path) -> str:
    """The comment lines that open a config file, without their `#`."""
    lines = []
    for line in config.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    return " ".join(lines)


def summary(config: Path, limit: int = 240) -> str:
    """The first sentence of the config's opening comment (cut at a word near `limit` characters),
    safe in a table cell."""
    text = header_comment(config)
    first = re.split(r"(?<=[.)])\s+(?=[A-Z`])", text, maxsplit=1)[0] if text else ""
    if len(first) > limit:
        first = first[:limit].rsplit(" ", 1)[0]
        if first.count("`") % 2:  # never leave a code span open
            first = first.rsplit("`", 1)[0]
        first = first.rstrip(",;:( ") + " ..."
    return first.replace("|", "\\|").replace("<", "&lt;")


def extends_of(config: Path) -> str | None:
    import yaml

    raw = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    return raw.get("extends") if isinstance(raw.get("extends"), str) else None


def stages_section(config: Path) -> str:
    """The page's DAG, or why there is none: a plan hashes the input files, so a config whose files
    are not here (DPR's 21M-passage TSV, say) cannot be planned, drawn or run until they are."""
    from tasks.errors import InputError

    rel = config.relative_to(PROJECT_ROOT).as_posix()
    try:
        dag = dag_of(config)
    except InputError as exc:
        return f"""Not drawn here: a plan hashes the config's input files, and `{Path(exc.path).name}` is not
under its `data_root` in this checkout. With the file in place, `pforge plan {rel} --mermaid FILE`
draws it."""
    return f"""Drawn by `pforge plan {rel} --mermaid FILE`: an arrow for each input a stage reads.

<!-- dag: {rel} -->
```mermaid
{dag}```"""


def config_page(config: Path) -> str:
    rel = config.relative_to(PROJECT_ROOT).as_posix()
    base = extends_of(config)
    extends = f" It extends [`{base}`]({Path(base).stem}.md): mappings merge, lists replace." if base else ""
    return f"""# {config.stem}

{summary(config) or rel}

`{rel}`.{extends}

```bash
pforge plan {rel}   # these stages in order, their versions, built or not
pforge run {rel}
```

## Stages

{stages_section(config)}

## The config

```yaml
--8<-- "{rel}"
```
"""


def index_page(configs: list[Path]) -> str:
    rows = "\n".join(f"| [{c.stem}]({c.stem}.md) | {f'`{extends_of(c)}`' if extends_of(c) else ''} | {summary(c)} |"
                     for c in configs)
    return f"""# Configs

Every shipped config (`configs/*.yaml`), with its stage DAG as `pforge plan` draws it. A config that
`extends:` another merges over it (mappings merge key by key, lists replace): see
[Concepts](../concepts.md#configs-and-extends). The variants of the embedded default are compared in
[Dense retrieval](../dense-retrieval.md); their results are on [Results](../results.md).

| config | extends | what it is |
|---|---|---|
{rows}
"""


def changelog_page() -> str:
    """The site's Changelog page: CHANGELOG.md as it stands (the changelog lives at the top level,
    as keep-a-changelog has it; the site's pages live under docs/)."""
    return ("<!-- Written by docs/gen_dags.py (`make docs-dags`) from CHANGELOG.md: edit that file. -->\n"
            + CHANGELOG.read_text(encoding="utf-8"))


def expected_pages() -> dict[Path, str]:
    """Every generated page and the text it should hold now."""
    configs = shipped_configs()
    pages = {PAGES / f"{c.stem}.md": config_page(c) for c in configs}
    pages[PAGES / "index.md"] = index_page(configs)
    for page in [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").rglob("*.md"))]:
        if page.parent != PAGES and page.exists():
            pages[page] = with_dags(page.read_text(encoding="utf-8"))
    pages[CHANGELOG_PAGE] = changelog_page()
    return pages


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for path, text in expected_pages().items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(path)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
    orphans = [p for p in PAGES.glob("*.md") if p.name != "index.md" and not (CONFIGS / f"{p.stem}.yaml").exists()]
    for orphan in orphans:  # the page of a config that is gone
        stale.append(orphan)
        if not check:
            orphan.unlink()
    for path in stale:
        print(f"{'stale' if check else 'wrote'}: {path.relative_to(PROJECT_ROOT)}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
