"""BEIR dataset reader: corpus.jsonl, queries.jsonl and qrels/<split>.tsv, from a folder or a .zip.

`open_beir(path)` accepts the dataset folder (holding corpus.jsonl), a folder holding exactly one
such dataset folder (an unzipped archive), or the .zip as BEIR distributes it
(nfcorpus.zip -> nfcorpus/corpus.jsonl, ...). Every iter_* function accepts the same paths or an
already opened `BeirDataset`. Files are streamed line by line from the folder or the archive.
"""
from __future__ import annotations

import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

from tasks.errors import InputError
from tasks.readers._common import (SeenIds, content_hash, iter_json_lines, iter_lines,
                                   require_str)

CORPUS = "corpus.jsonl"
QUERIES = "queries.jsonl"
QRELS_DIR = "qrels"


class BeirDataset:
    """A BEIR dataset in a folder or a zip archive; `open(name)` gives a binary stream."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._zip: zipfile.ZipFile | None = None
        if self.path.is_dir():
            root = self.path
            if not (root / CORPUS).exists():
                subs = [d for d in root.iterdir() if d.is_dir() and (d / CORPUS).exists()]
                if len(subs) != 1:
                    raise InputError(self.path, "folder", f"no BEIR dataset ({CORPUS}) found")
                root = subs[0]
            self._root = root
            self._prefix = ""
        elif self.path.is_file():
            try:
                self._zip = zipfile.ZipFile(self.path)
            except zipfile.BadZipFile as e:
                raise InputError(self.path, "archive", f"not a zip file: {e}") from None
            self._names = set(self._zip.namelist())
            corpora = sorted(n for n in self._names
                             if n == CORPUS or n.endswith("/" + CORPUS))
            if not corpora:
                raise InputError(self.path, "archive", f"no {CORPUS} inside")
            corpora.sort(key=lambda n: n.count("/"))
            self._prefix = corpora[0][: -len(CORPUS)]
        else:
            raise FileNotFoundError(self.path)

    def display(self, name: str) -> str:
        """How a member is named in error messages."""
        if self._zip is not None:
            return f"{self.path}!{self._prefix}{name}"
        return str(self._root / name)

    def exists(self, name: str) -> bool:
        if self._zip is not None:
            return self._prefix + name in self._names
        return (self._root / name).is_file()

    def open(self, name: str) -> IO[bytes]:
        if not self.exists(name):
            raise InputError(self.display(name), "file", "missing from the BEIR dataset")
        if self._zip is not None:
            return self._zip.open(self._prefix + name)
        return open(self._root / name, "rb")

    def splits(self) -> list[str]:
        if self._zip is not None:
            prefix = f"{self._prefix}{QRELS_DIR}/"
            names = [n[len(prefix):] for n in self._names if n.startswith(prefix)]
        else:
            qdir = self._root / QRELS_DIR
            names = [p.name for p in qdir.iterdir()] if qdir.is_dir() else []
        return sorted(n[:-4] for n in names if n.endswith(".tsv") and "/" not in n and len(n) > 4)

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()

    def __enter__(self) -> "BeirDataset":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_beir(path: str | Path) -> BeirDataset:
    return path if isinstance(path, BeirDataset) else BeirDataset(path)


@contextmanager
def _dataset(path):
    if isinstance(path, BeirDataset):
        yield path
    else:
        ds = BeirDataset(path)
        try:
            yield ds
        finally:
            ds.close()


def beir_splits(path: str | Path | BeirDataset) -> list[str]:
    """The qrels splits present (names of qrels/<split>.tsv), sorted."""
    with _dataset(path) as ds:
        return ds.splits()


def iter_beir_corpus(path, source: str = "beir") -> Iterator[dict]:
    """Documents (documents schema) of corpus.jsonl; doc_id is the BEIR _id."""
    with _dataset(path) as ds:
        name = ds.display(CORPUS)
        seen = SeenIds(name, "doc_id")
        with ds.open(CORPUS) as f:
            for line_no, rec in iter_json_lines(f, name):
                loc = f"line {line_no}"
                doc_id = require_str(rec, "_id", name, loc, coerce=True)
                loc = f"line {line_no} (_id {doc_id!r})"
                seen.add(doc_id, loc)
                title = require_str(rec, "title", name, loc, allow_empty=True) \
                    if rec.get("title") is not None else ""
                text = require_str(rec, "text", name, loc)
                yield {"doc_id": doc_id, "title": title, "text": text, "source": source,
                       "content_hash": content_hash(text)}


def iter_beir_queries(path, source: str = "beir") -> Iterator[dict]:
    """Questions (questions schema) of queries.jsonl; BEIR queries carry no answer strings."""
    with _dataset(path) as ds:
        name = ds.display(QUERIES)
        seen = SeenIds(name, "qid")
        with ds.open(QUERIES) as f:
            for line_no, rec in iter_json_lines(f, name):
                loc = f"line {line_no}"
                qid = require_str(rec, "_id", name, loc, coerce=True)
                loc = f"line {line_no} (_id {qid!r})"
                seen.add(qid, loc)
                question = require_str(rec, "text", name, loc)
                yield {"qid": qid, "question": question, "answers": [], "split": "",
                       "source": source, "doc_id": None, "answer_spans": []}


def iter_beir_qrels(path, split: str) -> Iterator[dict]:
    """Rows {qid, doc_id, relevance} of qrels/<split>.tsv (header line skipped)."""
    member = f"{QRELS_DIR}/{split}.tsv"
    with _dataset(path) as ds:
        name = ds.display(member)
        with ds.open(member) as f:
            for line_no, line in iter_lines(f, name):
                if not line.strip():
                    continue
                fields = line.split("\t")
                if line_no == 1 and fields[:2] == ["query-id", "corpus-id"]:
                    continue
                if len(fields) != 3:
                    raise InputError(name, f"line {line_no}",
                                     f"expected 3 tab-separated fields (query-id, corpus-id, "
                                     f"score), got {len(fields)}")
                qid, doc_id, score = (x.strip() for x in fields)
                if not qid or not doc_id:
                    raise InputError(name, f"line {line_no}", "empty query-id or corpus-id")
                try:
                    relevance = int(score)
                except ValueError:
                    raise InputError(name, f"line {line_no}",
                                     f"score {score!r} is not an integer") from None
                yield {"qid": qid, "doc_id": doc_id, "relevance": relevance}
