"""NQ-open reader: JSONL lines {"question": ..., "answer": [...]} (EfficientQA files add fields)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from tasks.errors import InputError
from tasks.readers._common import SeenIds, as_str_list, iter_json_lines, require_str


def iter_nq_open(path: str | Path, split: str = "", source: str = "nq_open") -> Iterator[dict]:
    """Questions (questions schema). qid is the record's `id` if it has one, otherwise
    f"{source}:{split}:{line_no}" with the 1-based line number in the file."""
    path = str(path)
    seen = SeenIds(path, "qid")
    with open(path, "rb") as f:
        for line_no, rec in iter_json_lines(f, path):
            loc = f"line {line_no}"
            if rec.get("id") is not None:
                qid = require_str(rec, "id", path, loc, coerce=True)
            else:
                qid = f"{source}:{split}:{line_no}"
            seen.add(qid, loc)
            question = require_str(rec, "question", path, loc)
            if "answer" not in rec:
                raise InputError(path, loc, "missing required field 'answer'")
            answers = as_str_list(rec["answer"], "answer", path, loc)
            if not answers or not all(a.strip() for a in answers):
                raise InputError(path, loc, "empty 'answer' (no answers or an empty string)")
            yield {"qid": qid, "question": question, "answers": answers, "split": split,
                   "source": source, "doc_id": None, "answer_spans": []}
