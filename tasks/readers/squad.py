"""SQuAD (v1.1 format) reader: articles as documents, questions with answer spans in them.

The JSON is streamed one article at a time with ijson (memory bounded by the largest article, not
by the file). A document's text is its paragraphs' contexts joined with "\\n\\n"; each answer
span is located in that joined text and checked against the answer string.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import ijson

from tasks.errors import InputError
from tasks.readers._common import SeenIds, Utf8CheckedReader, content_hash, require_str
from tasks.readers.download import OfficialFile, fetch

PARAGRAPH_SEP = "\n\n"

SQUAD_URLS: dict[str, tuple[str, str]] = {
    "dev-v1.1": ("https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v1.1.json",
                 "95aa6a52d5d6a735563366753ca50492a658031da74f301ac5238b03966972c9"),
    "train-v1.1": ("https://rajpurkar.github.io/SQuAD-explorer/dataset/train-v1.1.json",
                   "3527663986b8295af4f7fcdff1ba1ff3f72d07d61a20f487cb238a6ef92fd955"),
}


def _iter_articles(path: str | Path) -> Iterator[tuple[int, dict, list[str], str]]:
    """(article index, article, paragraph contexts, location) for each item of `data`."""
    path = str(path)
    n = 0
    with open(path, "rb") as raw:
        reader = Utf8CheckedReader(raw, path)
        articles = ijson.items(reader, "data.item", use_float=True)
        while True:
            try:
                article = next(articles)
            except StopIteration:
                break
            except ijson.JSONError as e:
                raise InputError(path, f"article {n} ({reader.position})",
                                 f"malformed JSON: {e}") from None
            loc = f"article {n}"
            if not isinstance(article, dict):
                raise InputError(path, loc, "article is not a JSON object")
            title = require_str(article, "title", path, loc)
            loc = f"article {n} ({title!r})"
            paragraphs = article.get("paragraphs")
            if not isinstance(paragraphs, list):
                raise InputError(path, loc, "missing required field 'paragraphs' (a list)")
            contexts = []
            for j, par in enumerate(paragraphs):
                if not isinstance(par, dict):
                    raise InputError(path, f"{loc}, paragraph {j}", "paragraph is not an object")
                contexts.append(require_str(par, "context", path, f"{loc}, paragraph {j}"))
            if not contexts:
                raise InputError(path, loc, "empty document text (no paragraphs)")
            yield n, article, contexts, loc
            n += 1
    if n == 0:
        raise InputError(path, "top level", "no articles found under 'data'")


def _doc_id(title: str) -> str:
    return f"squad:{title}"


def iter_squad_documents(path: str | Path, source: str = "squad") -> Iterator[dict]:
    """One document per SQuAD article (documents schema)."""
    seen = SeenIds(path, "doc_id")
    for _, article, contexts, loc in _iter_articles(path):
        title = article["title"]
        doc_id = _doc_id(title)
        seen.add(doc_id, loc)
        text = PARAGRAPH_SEP.join(contexts)
        yield {"doc_id": doc_id, "title": title.replace("_", " "), "text": text,
               "source": source, "content_hash": content_hash(text)}


def iter_squad_questions(path: str | Path, source: str = "squad", split: str = "") -> Iterator[dict]:
    """One question per SQuAD qa (questions schema), answer spans located in the document text."""
    path = str(path)
    seen = SeenIds(path, "qid")
    for _, article, contexts, loc in _iter_articles(path):
        doc_id = _doc_id(article["title"])
        offset = 0
        for j, (par, context) in enumerate(zip(article["paragraphs"], contexts)):
            qas = par.get("qas", [])
            if not isinstance(qas, list):
                raise InputError(path, f"{loc}, paragraph {j}", "field 'qas' must be a list")
            for k, qa in enumerate(qas):
                qloc = f"{loc}, paragraph {j}, question {k}"
                if not isinstance(qa, dict):
                    raise InputError(path, qloc, "question is not an object")
                qid = require_str(qa, "id", path, qloc, coerce=True)
                qloc = f"{loc}, paragraph {j}, qid {qid!r}"
                seen.add(qid, qloc)
                question = require_str(qa, "question", path, qloc)
                answers_in = qa.get("answers")
                if not isinstance(answers_in, list):
                    raise InputError(path, qloc, "missing required field 'answers' (a list)")
                if not answers_in and not qa.get("is_impossible", False):
                    raise InputError(path, qloc, "question has no answers")
                answers: list[str] = []
                spans: list[dict] = []
                for a in answers_in:
                    if not isinstance(a, dict):
                        raise InputError(path, qloc, "answer is not an object")
                    atext = require_str(a, "text", path, qloc)
                    start = a.get("answer_start")
                    if isinstance(start, float) and start.is_integer():
                        start = int(start)
                    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
                        raise InputError(path, qloc,
                                         f"answer {atext!r}: missing or invalid 'answer_start'")
                    if context[start:start + len(atext)] != atext:
                        raise InputError(
                            path, qloc,
                            f"answer {atext!r} does not occur at answer_start {start} of its "
                            f"paragraph (found {context[start:start + len(atext)]!r})")
                    if atext not in answers:
                        answers.append(atext)
                    span = {"start": offset + start, "end": offset + start + len(atext)}
                    if span not in spans:
                        spans.append(span)
                yield {"qid": qid, "question": question, "answers": answers, "split": split,
                       "source": source, "doc_id": doc_id, "answer_spans": spans}
            offset += len(context) + len(PARAGRAPH_SEP)


def squad_official(name: str) -> OfficialFile:
    """The pinned official SQuAD file SQUAD_URLS[name], cached as <name>.json."""
    if name not in SQUAD_URLS:
        raise KeyError(f"unknown SQuAD file {name!r}; known: {sorted(SQUAD_URLS)}")
    url, sha256 = SQUAD_URLS[name]
    return OfficialFile(f"{name}.json", url, sha256)


def download_squad(name: str, dest_dir: str | Path) -> Path:
    """Download SQUAD_URLS[name] into dest_dir (as <name>.json) and verify its sha256.

    An existing file with the right hash is reused. A hash mismatch raises InputError and leaves
    no file behind.
    """
    return fetch(squad_official(name), dest_dir)
