"""Readers on the real data in ../shared/data (skipped where it is absent)."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tasks import schemas
from tasks.readers.beir import (beir_splits, iter_beir_corpus, iter_beir_qrels, iter_beir_queries,
                                open_beir)
from tasks.readers.nq_open import iter_nq_open
from tasks.readers.squad import iter_squad_documents, iter_squad_questions
from tasks.readers.wikipedia import iter_wikipedia_documents

DATA = Path(__file__).parents[1].parent / "shared" / "data"
SQUAD = DATA / "squad" / "dev-v1.1-partial.json"
WIKI = DATA / "wikipedia" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
NFCORPUS = DATA / "beir" / "nfcorpus.zip"
NQ_DEV = DATA / "nq_open" / "NQ-open.dev.jsonl"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


def test_squad_documents_and_questions():
    docs = list(iter_squad_documents(need(SQUAD)))
    assert len(docs) == 48
    pa.Table.from_pylist(docs, schema=schemas.DOCUMENTS)
    assert docs[0]["doc_id"] == "squad:Super_Bowl_50" and docs[0]["title"] == "Super Bowl 50"
    assert len({d["doc_id"] for d in docs}) == 48
    questions = list(iter_squad_questions(SQUAD))
    assert len(questions) == 8764
    pa.Table.from_pylist(questions, schema=schemas.QUESTIONS)
    text = {d["doc_id"]: d["text"] for d in docs}
    n_spans = 0
    for q in questions:
        assert q["answers"] and len(set(q["answers"])) == len(q["answers"])
        assert q["answer_spans"]
        for span in q["answer_spans"]:
            assert text[q["doc_id"]][span["start"]:span["end"]] in q["answers"]
            n_spans += 1
    assert n_spans > len(questions)
    assert len({q["doc_id"] for q in questions}) == 40  # 8 articles have their qas held out


@pytest.fixture(scope="module")
def wiki():
    stats: dict = {}
    docs = list(iter_wikipedia_documents(need(WIKI), stats=stats))
    return docs, stats


def test_wikipedia_counts(wiki):
    docs, stats = wiki
    assert stats["pages"] == 206
    assert stats["redirects"] == 100
    assert stats["pages"] == stats["redirects"] + stats["non_article"] + stats["empty"] + stats["yielded"]
    assert stats["yielded"] == len(docs) == 106
    pa.Table.from_pylist(docs, schema=schemas.DOCUMENTS)
    assert all(d["doc_id"].startswith("wiki:") for d in docs)


def test_wikipedia_text_is_clean_prose(wiki):
    docs, _ = wiki
    for d in docs:
        t = d["text"]
        for markup in ("{{", "}}", "[[", "]]", "[[File", "[[Image", "<ref", "</ref", "{|", "|}",
                       "<!--", "''", "&nbsp;", "thumb|", "==", "Category:"):
            assert markup not in t, (d["title"], markup)
        assert "\n\n\n" not in t and "  " not in t and t == t.strip()
    by_title = {d["title"]: d for d in docs}
    assert by_title["Anarchism"]["doc_id"] == "wiki:12"
    assert by_title["Anarchism"]["text"].startswith("Anarchism is a political philosophy")
    assert by_title["Alabama"]["text"].startswith("Alabama is a state")
    assert by_title["Autism"]["text"].startswith("Autism is a neurodevelopmental disorder")
    assert "\n\n" in by_title["Anarchism"]["text"]


def test_nfcorpus_zip_and_folder(tmp_path):
    zpath = need(NFCORPUS)
    assert beir_splits(zpath) == ["dev", "test", "train"]
    docs = list(iter_beir_corpus(zpath))
    assert len(docs) == 3633
    pa.Table.from_pylist(docs, schema=schemas.DOCUMENTS)
    queries = list(iter_beir_queries(zpath))
    assert len(queries) == 3237
    pa.Table.from_pylist(queries, schema=schemas.QUESTIONS)
    counts = {s: sum(1 for _ in iter_beir_qrels(zpath, s)) for s in ("train", "dev", "test")}
    assert counts == {"train": 110575, "dev": 11385, "test": 12334}
    rows = list(iter_beir_qrels(zpath, "test"))
    pa.Table.from_pylist(rows, schema=schemas.QRELS)
    doc_ids = {d["doc_id"] for d in docs}
    qids = {q["qid"] for q in queries}
    assert all(r["qid"] in qids and r["doc_id"] in doc_ids for r in rows)
    # the same dataset unzipped into a folder (the dataset folder and its parent both work)
    import zipfile
    with zipfile.ZipFile(zpath) as z:
        z.extractall(tmp_path)
    with open_beir(tmp_path) as ds:
        assert beir_splits(ds) == ["dev", "test", "train"]
        assert sum(1 for _ in iter_beir_queries(ds)) == 3237
    assert sum(1 for _ in iter_beir_qrels(tmp_path / "nfcorpus", "dev")) == 11385


def test_nq_open_dev():
    qs = list(iter_nq_open(need(NQ_DEV), split="test"))
    assert len(qs) == 3610
    pa.Table.from_pylist(qs, schema=schemas.QUESTIONS)
    assert qs[0]["qid"] == "nq_open:test:1" and qs[0]["answers"] == ["14 December 1972 UTC", "December 1972"]
    assert len({q["qid"] for q in qs}) == 3610
