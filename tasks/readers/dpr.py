"""DPR file readers: the passage TSV (psgs_w100.tsv) and the QA CSV files (*.qa.csv).

Both split lines on b"\\n" only: some DPR questions contain U+0085, which str.splitlines() and
text-mode universal newlines would treat as a line break.
"""
from __future__ import annotations

import ast
import csv
from pathlib import Path
from typing import Iterator

from tasks.errors import InputError
from tasks.readers._common import SeenIds, iter_lines, open_maybe_bz2

PASSAGES_HEADER = ["id", "text", "title"]


def iter_dpr_passages(path: str | Path) -> Iterator[dict]:
    """Passages (passages schema) of a DPR psgs TSV with header id<TAB>text<TAB>title.

    Fields follow csv quoting (DPR writes text as "..." with "" for a quote). doc_id is the title
    (all passages of one article share it); chunk_index counts the passages of a title in file
    order. char_start/char_end are None: the article text is not known here.
    """
    path = str(path)
    seen = SeenIds(path, "pid")
    chunk_counts: dict[str, int] = {}
    with open_maybe_bz2(path) as f:
        for line_no, line in iter_lines(f, path):
            loc = f"line {line_no}"
            if not line.strip():
                continue
            try:
                fields = next(csv.reader([line], delimiter="\t", strict=True))
            except csv.Error as e:
                raise InputError(path, loc, f"malformed TSV: {e}") from None
            if line_no == 1:
                if fields != PASSAGES_HEADER:
                    raise InputError(path, loc, f"expected header {PASSAGES_HEADER}, got {fields}")
                continue
            if len(fields) != 3:
                raise InputError(path, loc, f"expected 3 tab-separated fields, got {len(fields)}")
            pid, text, title = fields
            if not pid.strip():
                raise InputError(path, loc, "missing required field 'id'")
            seen.add(pid, loc)
            if not text.strip():
                raise InputError(path, f"{loc} (id {pid!r})", "empty passage text")
            chunk_index = chunk_counts.get(title, 0)
            chunk_counts[title] = chunk_index + 1
            yield {"pid": pid, "doc_id": title, "title": title, "text": text,
                   "chunk_index": chunk_index, "n_words": len(text.split()),
                   "char_start": None, "char_end": None}


def iter_dpr_qa(path: str | Path, source: str = "dpr", split: str = "") -> Iterator[dict]:
    """Questions (questions schema) of a DPR .qa.csv: question<TAB>python-literal answer list.

    qid is f"{source}:{split}:{line_no}" (1-based line number). The answer list is the last
    tab-separated field (a Python literal never holds a raw tab), so a tab inside a question stays
    part of the question.
    """
    path = str(path)
    with open_maybe_bz2(path) as f:
        for line_no, line in iter_lines(f, path):
            loc = f"line {line_no}"
            if not line.strip():
                continue
            if "\t" not in line:
                raise InputError(path, loc, "expected question<TAB>answers")
            question, literal = line.rsplit("\t", 1)
            if not question.strip():
                raise InputError(path, loc, "empty question")
            try:
                answers = ast.literal_eval(literal.strip())
            except (ValueError, SyntaxError, MemoryError, RecursionError) as e:
                raise InputError(path, loc,
                                 f"answers are not a Python literal list: {e.__class__.__name__}"
                                 ) from None
            if not isinstance(answers, (list, tuple)) or not all(isinstance(a, str) for a in answers):
                raise InputError(path, loc, "answers must be a list of strings")
            if not answers:
                raise InputError(path, loc, "empty answer list")
            yield {"qid": f"{source}:{split}:{line_no}", "question": question,
                   "answers": list(answers), "split": split, "source": source, "doc_id": None,
                   "answer_spans": []}
