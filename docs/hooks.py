"""MkDocs hooks (mkdocs.yml `hooks:`): the corpus-scale study's figures, drawn from its committed
records each time the site is built (flows/study/figures.py draws them), so they cannot fall behind
the records and no image is committed. Each lands in the site as a generated file under
`assets/images/study/`; a page's reference to a figure the records do not give (yet) is replaced by
the sentence saying why, so a strict build passes and the page shows nothing that is not there.

The study is the one beside mkdocs.yml (`studies/squad-open/`), else the project's own."""
from __future__ import annotations

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


def on_page_markdown(markdown, page, config, files):
    from flows.study.figures import FIGURES, MISSING

    for name in FIGURES:
        reference = f"]({FOLDER}/{name})"
        if reference in markdown and files.get_file_from_path(f"{FOLDER}/{name}") is None:
            # the paragraph holding the figure (its caption and the image) gives way to why it is not drawn
            markdown = "\n\n".join(MISSING[name] if reference in paragraph else paragraph
                                    for paragraph in markdown.split("\n\n"))
    return markdown
