"""MkDocs hooks (mkdocs.yml `hooks:`): the corpus-scale study's figures and stage times, drawn from
its committed records each time the site is built (flows/study/figures.py draws the figures), so they
cannot fall behind the records and nothing drawn from them is committed. Each figure lands in the site
as a generated file under `assets/images/study/`; a page's reference to a figure the records do not
give (yet) is replaced by the sentence saying why, so a strict build passes and the page shows nothing
that is not there. A line `<!-- stage-times: FOLDER [scaled to N passages] -->` becomes the table of
`stage_times` (Operations' scale plan).

The study is the one beside mkdocs.yml (`studies/squad-open/`), else the project's own."""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project's packages, however mkdocs runs

STUDY = "squad-open"
FOLDER = "assets/images/study"


def _study(config):
    from flows.study.definition import load_study

    beside = Path(config["config_file_path"]).parent / "studies" / STUDY / "study.yaml"
    return load_study(beside if beside.is_file() else STUDY)


def on_files(files, config):
    from mkdocs.structure.files import File

    from flows.study.figures import study_figures

    for name, svg in study_figures(_study(config)).items():
        files.append(File.generated(config, f"{FOLDER}/{name}", content=svg))
    return files


STAGE_TIMES = re.compile(r"^<!-- stage-times: (?P<args>.+?) -->$", re.MULTILINE)


def on_page_markdown(markdown, page, config, files):
    from flows.study.figures import FIGURES, MISSING

    # the root is read only where a page asks for the stage times (a page without that line needs no config)
    markdown = STAGE_TIMES.sub(
        lambda m: "\n" + stage_times(Path(config["config_file_path"]).parent, *m["args"].split()) + "\n", markdown)

    for name in FIGURES:
        reference = f"]({FOLDER}/{name})"
        if reference in markdown and files.get_file_from_path(f"{FOLDER}/{name}") is None:
            # the paragraph holding the figure (its caption and the image) gives way to why it is not drawn
            markdown = "\n\n".join(MISSING[name] if reference in paragraph else paragraph
                                    for paragraph in markdown.split("\n\n"))
    return markdown


def _beside_or_own(root: Path, folder: str) -> Path:
    """`folder` beside mkdocs.yml, else the project's own (a copy of the docs built elsewhere)."""
    import flows

    beside = root / folder
    return beside if beside.is_dir() else Path(flows.__file__).resolve().parents[1] / folder


# A stage whose name ends in a system's name: its builds are one row of `stage_times` (`train:*`).
PER_SYSTEM = ("train", "encode", "index", "search", "rerank", "fusion", "pretrain")
PASSAGE_ROWS = ("passages", "embeddings")   # artifacts of a row per passage: their time scales with the corpus


def stage_times(root: Path, folder: str, *scaled: str) -> str:
    """The build time of each stage in the study records under `folder` (each record lists every stage
    behind its row, with its version, rows and build seconds): a stage version once, from a record that
    ran it (a backfilled record's figure only when no other has it); a system's stages as one row
    (`train:*`: median and range); a row per CPU. `scaled to N passages`: the time of a stage of a row per
    passage (chunking, encoding) at N passages, linear in them, on that CPU."""
    import json
    import statistics

    from flows.study.records import step_label

    target = None
    if scaled:
        if len(scaled) != 4 or scaled[:2] != ("scaled", "to") or scaled[3] != "passages" or not scaled[2].isdigit():
            raise ValueError(f"`{' '.join(scaled)}`: `scaled to N passages`")
        target = int(scaled[2])
    records = sorted(_beside_or_own(root, folder).glob("*.json"))
    if not records:
        raise ValueError(f"no study records in {folder}")
    builds: dict[tuple[str, str], dict] = {}
    for path in records:
        record = json.loads(path.read_text(encoding="utf-8"))
        machine = record.get("machine") or {}
        cpu = f"{machine.get('key', 'unknown CPU')}, {machine.get('cores', '?')} cores"
        for stage in record.get("stages") or []:   # another config's step as `CONFIG.yaml:STEP`
            key, backfilled = (step_label(stage), stage["version"]), bool(record.get("backfilled_from"))
            if key not in builds or (builds[key]["backfilled"] and not backfilled):
                builds[key] = {**stage, "step": key[0], "cpu": cpu, "backfilled": backfilled}
    rows: dict[tuple[str, str], list[dict]] = {}
    for build in sorted(builds.values(), key=lambda b: b.get("created_at") or ""):   # in the order they ran
        prefix = build["step"].split(":", 1)[0]
        name = f"{prefix}:*" if ":" in build["step"] and prefix in PER_SYSTEM else build["step"]
        rows.setdefault((name, build["cpu"]), []).append(build)
    header = ["stage", "builds", "rows", "build time, median (range)"]
    header += [f"at {target:,} passages, linear"] if target else []
    lines = ["| " + " | ".join(header + ["CPU"]) + " |", "|---|---:|---:|---:|" + ("---:|" if target else "") + "---|"]
    for (name, cpu), group in rows.items():
        seconds = sorted(b["build_s"] for b in group)
        median = statistics.median(seconds)
        spread = f" ({duration(seconds[0])} to {duration(seconds[-1])})" if len(seconds) > 1 else ""
        counts = sorted({b["rows"] for b in group if b.get("rows")})
        cells = [f"`{name}`", str(len(group)), " to ".join(f"{n:,}" for n in (counts[:1] + counts[-1:] if len(counts) > 1 else counts)) or "-",
                 duration(median) + spread]
        if target:
            per_row = [b["build_s"] / b["rows"] for b in group if b["artifact"] in PASSAGE_ROWS and b.get("rows")]
            cells.append(duration(statistics.median(per_row) * target) if per_row else "-")
        lines.append("| " + " | ".join(cells + [cpu]) + " |")
    return "\n".join(lines)


def duration(seconds: float) -> str:
    """`0.4 s`, `11.1 s`, `25 min 16 s`, `6 h 10 min`, `12.3 days`."""
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    if seconds < 3599.5:
        whole = round(seconds)
        return f"{whole // 60} min {whole % 60} s"
    if seconds < 86370:
        minutes = round(seconds / 60)
        return f"{minutes // 60} h {minutes % 60} min"
    return f"{seconds / 86400:.1f} days"
