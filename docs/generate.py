"""Everything generated in the docs, kept in step with what it is generated from:

- a page per shipped config (docs/configs/NAME.md, with its DAG and its YAML) and their index
  (docs/configs/index.md);
- every DAG fence marked `<!-- dag: configs/NAME.yaml [--overview | --part N] -->` in README.md and docs/
  (e.g. the demo's), as `pforge plan --mermaid FILE --reduced [--overview | --part N]` draws it (each edge a
  longer path implies left out; a large plan as its stage families and in parts, flows/plan.py);
- every block between `<!-- generated: SOURCE -->` and `<!-- end generated -->` in README.md and docs/: a
  table or section of a committed results file (`results benchmarks/results/FILE.md ["HEADING"] [table N]`).
  (The study's tables are not copied: a site page includes them from benchmarks/results/study_cpu.md
  as it is built, `--8<-- "benchmarks/results/study_cpu.md:SECTION"`, since each record rewrites it.)
- the site's Changelog page (docs/changelog.md, a copy of CHANGELOG.md).

    .venv/bin/python docs/generate.py           # rewrite what changed (`make docs-generate`)
    .venv/bin/python docs/generate.py --check   # exit 1 naming each stale page and block, rewriting nothing

A marker naming a missing file, heading or table is an error naming the page and line (exit 2).
tests/test_docs_site.py and tests/test_docs_generated.py hold the docs to what this script writes now.
"""
from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import NamedTuple

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT))  # run as a script from anywhere: the project's packages

CONFIGS = PROJECT_ROOT / "configs"
PAGES = PROJECT_ROOT / "docs" / "configs"
CHANGELOG = PROJECT_ROOT / "CHANGELOG.md"
CHANGELOG_PAGE = PROJECT_ROOT / "docs" / "changelog.md"
# A DAG fence: the marker naming its config (relative to the project root) and the drawing's
# `pforge plan` option (none: the whole plan), then a mermaid fence.
MARKED_DAG = re.compile(r"<!-- dag: (?P<config>\S+)(?: (?P<view>--overview|--part [1-9][0-9]*))? -->\n"
                        r"```mermaid\n(?P<dag>.*?)```", re.DOTALL)


def shipped_configs() -> list[Path]:
    return sorted(CONFIGS.glob("*.yaml"))


def plan_of(config: Path):
    from flows.registry import plan_for
    from tasks.config import load_config

    return plan_for(load_config(config))


def view_of(option: str | None) -> str | int | None:
    """The `view` of flows.plan.mermaid that a `pforge plan` option names (`--overview`, `--part N`)."""
    from flows.plan import OVERVIEW

    if not option:
        return None
    return OVERVIEW if option == "--overview" else int(option.split()[1])


def dag_of(config: Path, option: str | None = None) -> str:
    """What `pforge plan CONFIG --mermaid FILE --reduced [OPTION]` writes: a large plan stays readable."""
    from flows.plan import mermaid

    return mermaid(plan_of(config), reduced=True, view=view_of(option))


def marker(config: str, option: str | None = None) -> str:
    return f"<!-- dag: {config}{f' {option}' if option else ''} -->"


def marked_dags(text: str) -> list[tuple[str, str | None, str]]:
    """(config, option, DAG) of every marked fence in a page (option: `--overview`, `--part N` or None)."""
    return [(m["config"], m["view"], m["dag"]) for m in MARKED_DAG.finditer(text)]


def with_dags(text: str) -> str:
    """`text` with every marked fence holding its config's DAG as planned now."""
    return MARKED_DAG.sub(lambda m: f"{marker(m['config'], m['view'])}\n```mermaid\n"
                                    f"{dag_of(PROJECT_ROOT / m['config'], m['view'])}```", text)


# --------------------------------------------------------------------------- generated blocks
# A generated block: its opening marker names its source; the lines up to the end marker are its content.
GENERATED_OPEN = re.compile(r"<!-- generated: (?P<source>.+?) -->")
GENERATED_END = "<!-- end generated -->"
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(?P<hashes>#{1,6}) (?P<title>.+?)\s*#*$")


class GeneratedBlockError(ValueError):
    """A marker naming a source that does not exist (a file, a heading, a table), or a block
    without its end marker; the message names the page and line."""


class Block(NamedTuple):
    source: str  # the marker's text after `generated:`
    first: int  # index of the opening marker's line
    last: int  # index of the end marker's line

    @property
    def line(self) -> int:
        """The opening marker's line number, as an editor shows it."""
        return self.first + 1


def fenced(lines: list[str]) -> list[bool]:
    """For each line, whether it lies in a code fence (the fence lines included): a marker or heading
    shown there as an example is not one."""
    inside, flags = False, []
    for line in lines:
        opens_or_closes = bool(FENCE.match(line))
        flags.append(inside or opens_or_closes)
        inside ^= opens_or_closes
    return flags


def generated_blocks(text: str, page: str) -> list[Block]:
    """Every generated block of a page, outside code fences, in order."""
    lines, blocks, opened = text.split("\n"), [], None  # opened: the block whose end is still to come
    for i, (line, in_fence) in enumerate(zip(lines, fenced(lines))):
        if in_fence:
            continue
        marker = GENERATED_OPEN.fullmatch(line.strip())
        if marker and opened is not None:
            raise GeneratedBlockError(f"{page}:{opened.line}: no `{GENERATED_END}` before the next marker "
                                      f"(line {i + 1})")
        if marker:
            opened = Block(marker["source"], i, -1)
        elif line.strip() == GENERATED_END:
            if opened is None:
                raise GeneratedBlockError(f"{page}:{i + 1}: `{GENERATED_END}` without its opening marker")
            blocks.append(opened._replace(last=i))
            opened = None
    if opened is not None:
        raise GeneratedBlockError(f"{page}:{opened.line}: no `{GENERATED_END}` after this marker")
    return blocks


def with_generated(text: str, page: str, root: Path | None = None) -> str:
    """`text` with every generated block holding what its source gives now (a blank line either side,
    so that a table renders after the HTML comment); sources are read under `root` (the project's)."""
    lines = text.split("\n")
    for block in reversed(generated_blocks(text, page)):  # from the end: earlier indices stay valid
        try:
            content = block_content(block.source, root or PROJECT_ROOT)
        except (GeneratedBlockError, ValueError) as exc:
            raise GeneratedBlockError(f"{page}:{block.line}: {exc}") from None
        lines[block.first + 1:block.last] = ["", *content.split("\n"), ""]
    return "\n".join(lines)


def block_content(source: str, root: Path) -> str:
    """What a marker's source gives: `results FILE ["HEADING"] [table N]`, a column no row measured
    (every cell `-`) left out."""
    kind, *args = shlex.split(source)
    if kind == "results" and args:
        return without_unmeasured_columns(results_content(root, *args))
    raise ValueError(f"unknown source `{source}`: `results FILE [\"HEADING\"] [table N]`")


def table_cells(row: str) -> list[str]:
    """The cells of a table row whose in-cell pipes are escaped (`with_cell_pipes_escaped`)."""
    return [cell.strip() for cell in re.split(r"(?<=\s)\|(?=\s)", " " + row.strip().strip("|") + " ")]


def without_unmeasured_columns(text: str) -> str:
    """`text` with each table's columns that no row fills (every data cell `-`) left out: a result the
    committed file does not hold (a `make install` nobody timed) is not shown as a column of dashes."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        j = i
        while j < len(lines) and lines[j].startswith("|"):
            j += 1
        if j == i:
            out.append(lines[i])
            i += 1
            continue
        rows = [table_cells(row) if k != 1 else row.strip().strip("|").split("|") for k, row in enumerate(lines[i:j])]
        data = rows[2:]
        keep = [c for c in range(len(rows[0]))
                if not data or any(c >= len(row) or row[c] != "-" for row in data)]
        if len(keep) < len(rows[0]):
            kept = [[row[c] for c in keep if c < len(row)] for row in rows]
            out += [f"| {' | '.join(row)} |" if k != 1 else f"|{'|'.join(row)}|" for k, row in enumerate(kept)]
        else:
            out += lines[i:j]
        i = j
    return "\n".join(out)


def results_content(root: Path, file: str, *selector: str) -> str:
    """What a results source names in a committed results file: with `table N`, table N after the
    first heading that begins with HEADING (without a heading, from the top of the file); with a
    heading alone, that section's body; with neither, the file's first table."""
    heading, n = results_selector(selector)
    path = root / file
    if not path.is_file():
        raise ValueError(f"no results file {file}")
    lines = path.read_text(encoding="utf-8").split("\n")
    start = heading_index(lines, heading, file) if heading is not None else -1
    if heading is not None and n is None:
        return section_body(lines, start)
    return nth_table(lines[start + 1:], n or 1, file, heading)


def results_selector(selector: tuple[str, ...]) -> tuple[str | None, int | None]:
    """(HEADING or None, N or None) from `["HEADING"] [table N]`."""
    words, n = list(selector), None
    if len(words) >= 2 and words[-2] == "table":
        if not words[-1].isdigit() or int(words[-1]) < 1:
            raise ValueError(f"`table {words[-1]}`: a table number from 1")
        n, words = int(words[-1]), words[:-2]
    if len(words) > 1:
        raise ValueError(f"`{' '.join(selector)}`: one quoted heading, then `table N`")
    return (words[0] if words else None), n


def headings(lines: list[str]) -> list[tuple[int, int, str]]:
    """(index, level, title) of every heading outside code fences."""
    found = []
    for i, (line, in_fence) in enumerate(zip(lines, fenced(lines))):
        match = None if in_fence else HEADING.match(line)
        if match:
            found.append((i, len(match["hashes"]), match["title"]))
    return found


def heading_index(lines: list[str], heading: str, file: str) -> int:
    """The index of the first heading whose title begins with `heading`."""
    for i, _, title in headings(lines):
        if title.startswith(heading):
            return i
    raise ValueError(f"{file} has no heading that begins with \"{heading}\"")


def section_body(lines: list[str], start: int) -> str:
    """The lines after the heading at `start` up to the next heading of its level or above, trimmed."""
    level = next(lvl for i, lvl, _ in headings(lines) if i == start)
    end = next((i for i, lvl, _ in headings(lines) if i > start and lvl <= level), len(lines))
    return "\n".join(lines[start + 1:end]).strip()


def nth_table(lines: list[str], n: int, file: str, heading: str | None) -> str:
    """Table `n` of `lines` (tables pasted inside a fence count: the files keep the scripts' raw output)."""
    tables = tables_in(lines)
    if len(tables) < n:
        after = f" after heading \"{heading}\"" if heading is not None else ""
        raise ValueError(f"{file} has {len(tables)} table(s){after}, not table {n}")
    return "\n".join(with_cell_pipes_escaped(row) for row in tables[n - 1])


def with_cell_pipes_escaped(row: str) -> str:
    """A table row with each `|` inside a cell escaped (`max |dp|`, `KL(p || q)` in the scripts' headers),
    so that the table renders as the file meant it: a column separator has a space or the line's end on
    either side; the `|---|` row is left as it is."""
    if re.fullmatch(r"[|:\- ]+", row):
        return row

    def separator_or_escaped(pipe: re.Match) -> str:
        i = pipe.start()
        spaced = (i == 0 or row[i - 1] == " ") and (i == len(row) - 1 or row[i + 1] == " ")
        return "|" if spaced else "\\|"

    return re.sub(r"(?<!\\)\|", separator_or_escaped, row)


def tables_in(lines: list[str]) -> list[list[str]]:
    """Every Markdown table (a run of lines that begin with `|`), in order."""
    tables, current = [], []
    for line in lines + [""]:
        if line.startswith("|"):
            current.append(line.rstrip())
        elif current:
            tables.append(current)
            current = []
    return tables


def stale_parts(old: str, new: str, page: str) -> list[str]:
    """What differs between a page as it is and as generated now: each DAG fence and generated block by
    its line, else the page as a whole (a page written whole, or one whose markers changed)."""
    old_dags, new_dags = list(MARKED_DAG.finditer(old)), list(MARKED_DAG.finditer(new))
    old_blocks, new_blocks = generated_blocks(old, page), generated_blocks(new, page)
    if len(old_dags) != len(new_dags) or len(old_blocks) != len(new_blocks):
        return ["the page"]
    old_lines, new_lines = old.split("\n"), new.split("\n")
    parts = [f"line {old.count(chr(10), 0, a.start()) + 1}: dag {a['config']}" + (f" {a['view']}" if a["view"] else "")
             for a, b in zip(old_dags, new_dags) if a["dag"] != b["dag"]]
    parts += [f"line {a.line}: generated: {a.source}" for a, b in zip(old_blocks, new_blocks)
              if old_lines[a.first:a.last + 1] != new_lines[b.first:b.last + 1]]
    return parts or ["the page"]


# ------------------------------------------------------------------------------ config pages
def header_lines(config: Path) -> list[str]:
    """The comment lines that open a config file, without their `#` and the one space after it."""
    lines = []
    for line in config.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[2:] if line.startswith("# ") else line[1:])
    return lines


def header_comment(config: Path) -> str:
    """The opening comment as one line of prose."""
    return " ".join(line.strip() for line in header_lines(config))


def description(config: Path) -> str:
    """The whole opening comment as Markdown: its prose lines as paragraphs, and each run of lines
    indented further (a command, an aligned list) kept as written in a text block."""
    parts: list[tuple[bool, list[str]]] = []   # (indented, lines)
    for line in header_lines(config):
        indented = line.startswith(" ")
        if not line.strip():
            parts.append((False, []))   # a bare `#` ends a paragraph
        elif parts and parts[-1][0] == indented:
            parts[-1][1].append(line)
        else:
            parts.append((indented, [line]))
    blocks = []
    for indented, lines in filter(lambda part: part[1], parts):
        if indented:
            blocks.append("```text\n" + "\n".join(line[2:] if line.startswith("  ") else line for line in lines) + "\n```")
        else:
            blocks.append(" ".join(line.strip() for line in lines).replace("<", "&lt;"))
    return "\n\n".join(blocks)


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
    """The page's DAG (a large plan's overview and parts), or why there is none: a plan hashes the input
    files, so a config whose files are not here (DPR's 21M-passage TSV, say) cannot be planned, drawn or
    run until they are."""
    from flows.plan import MAX_NODES, fits_one_drawing, parts
    from tasks.errors import InputError

    rel = config.relative_to(PROJECT_ROOT).as_posix()
    try:
        plan = plan_of(config)
    except InputError as exc:
        return f"""Not drawn here: a plan hashes the config's input files, and `{Path(exc.path).name}` is not
under its `data_root` in this checkout. With the file in place, `pforge plan {rel} --mermaid FILE --reduced`
draws it."""
    if fits_one_drawing(plan):
        return f"""Drawn by `pforge plan {rel} --mermaid FILE --reduced`: an arrow for each input a stage reads,
left out where a longer path already leads there (`--mermaid FILE` alone draws every one).

{fence(rel)}"""
    found = parts(plan)
    drawn_parts = "\n\n".join(f"""### Part {i}: {part.title}

`pforge plan {rel} --mermaid FILE --part {i}`:

{fence(rel, f"--part {i}")}""" for i, part in enumerate(found, 1))
    return f"""Its {len(plan.names())} stages are drawn in {len(found) + 1} pictures of at most {MAX_NODES} nodes each
(`pforge plan {rel} --mermaid FILE --reduced` draws them in one): first the stage
families, then the stages in {len(found)} parts. An arrow stands for each input a stage reads, left out
where a longer path already leads there; in a part, a rounded node is a stage drawn in another
part (or, as "N search stages", several of one family).

### Stage families

`pforge plan {rel} --mermaid FILE --overview`: a box per family (`train` holds
every `train:NAME`), an arrow where a stage of one reads a stage of the other.

{fence(rel, "--overview")}

{drawn_parts}"""


def fence(config: str, option: str | None = None) -> str:
    """A marked DAG fence of `config` (relative to the project root) as `pforge plan` draws it now."""
    return f"{marker(config, option)}\n```mermaid\n{dag_of(PROJECT_ROOT / config, option)}```"


def config_page(config: Path) -> str:
    rel = config.relative_to(PROJECT_ROOT).as_posix()
    base = extends_of(config)
    extends = f" It extends [`{base}`]({Path(base).stem}.md): mappings merge, lists replace." if base else ""
    return f"""# {config.stem}

{description(config) or rel}

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
    return ("<!-- Written by docs/generate.py (`make docs-generate`) from CHANGELOG.md: edit that file. -->\n"
            + CHANGELOG.read_text(encoding="utf-8"))


def marked_pages() -> list[Path]:
    """The hand-written pages that may hold DAG fences and generated blocks."""
    pages = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").rglob("*.md"))]
    return [p for p in pages if p.parent != PAGES and p != CHANGELOG_PAGE and p.exists()]


def expected_pages() -> dict[Path, str]:
    """Every generated page and the text it should hold now."""
    configs = shipped_configs()
    pages = {PAGES / f"{c.stem}.md": config_page(c) for c in configs}
    pages[PAGES / "index.md"] = index_page(configs)
    for page in marked_pages():
        rel = page.relative_to(PROJECT_ROOT).as_posix()
        pages[page] = with_generated(with_dags(page.read_text(encoding="utf-8")), rel)
    pages[CHANGELOG_PAGE] = changelog_page()
    return pages


def stale_pages(pages: dict[Path, str]) -> dict[Path, list[str]]:
    """Each page that differs from what it should hold, with what differs."""
    stale = {}
    for path, text in pages.items():
        old = path.read_text(encoding="utf-8") if path.exists() else None
        if old != text:
            stale[path] = ["missing"] if old is None else stale_parts(old, text, path.name)
    return stale


def orphan_pages() -> list[Path]:
    """The page of each config that is gone."""
    return [p for p in PAGES.glob("*.md") if p.name != "index.md" and not (CONFIGS / f"{p.stem}.yaml").exists()]


def shown(path: Path) -> str:
    return str(path.relative_to(PROJECT_ROOT) if path.is_relative_to(PROJECT_ROOT) else path)


def rewrite(path: Path, text: str | None) -> str:
    """Write a page (None: remove it, the page of a config that is gone); says which it did."""
    if text is None:
        path.unlink()
        return "removed"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return "wrote"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    try:
        pages = expected_pages()
    except GeneratedBlockError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stale = stale_pages(pages)
    stale.update({orphan: ["its config is gone"] for orphan in orphan_pages()})
    for path, parts in stale.items():
        if check:
            print(f"stale: {shown(path)}: {'; '.join(parts)}")
        else:
            print(f"{rewrite(path, pages.get(path))}: {shown(path)}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
