"""Every reader raises InputError naming the file and the place on each kind of bad input."""
from __future__ import annotations

import bz2
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from tasks.errors import InputError
from tasks.readers import squad as squad_mod
from tasks.readers.beir import (beir_splits, iter_beir_corpus, iter_beir_qrels, iter_beir_queries,
                                open_beir)
from tasks.readers.dpr import iter_dpr_passages, iter_dpr_qa
from tasks.readers.nq_open import iter_nq_open
from tasks.readers.squad import download_squad, iter_squad_documents, iter_squad_questions
from tasks.readers.wikipedia import iter_wikipedia_documents, wikitext_to_text


def fails(gen, path, *where):
    with pytest.raises(InputError) as info:
        list(gen)
    msg = str(info.value)
    assert str(path) in msg, msg
    for w in where:
        assert w in msg, msg
    return msg


# ---------------------------------------------------------------- SQuAD
def squad_json(articles):
    return {"version": "1.1", "data": articles}


def article(title="A_b", contexts=("First para.", "Second para here."), qas=None):
    pars = []
    for i, c in enumerate(contexts):
        pars.append({"context": c, "qas": (qas or {}).get(i, [])})
    return {"title": title, "paragraphs": pars}


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def test_squad_good_small(tmp_path):
    qa = {"id": "q1", "question": "Which?", "answers": [
        {"answer_start": 0, "text": "Second"}, {"answer_start": 0, "text": "Second"},
        {"answer_start": 7, "text": "para"}]}
    p = write_json(tmp_path / "s.json", squad_json([article(qas={1: [qa]})]))
    (doc,) = iter_squad_documents(p, source="x")
    assert doc == {"doc_id": "squad:A_b", "title": "A b", "text": "First para.\n\nSecond para here.",
                   "source": "x", "content_hash": hashlib.sha256(doc["text"].encode()).hexdigest()}
    (q,) = iter_squad_questions(p)
    assert q["answers"] == ["Second", "para"]
    assert q["answer_spans"] == [{"start": 13, "end": 19}, {"start": 20, "end": 24}]
    assert q["doc_id"] == "squad:A_b" and q["split"] == ""


def test_squad_malformed_json(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"data": [{"title": "A", "paragraphs": [{"context": "x", "qas": []}]}, {"title": ',
                 encoding="utf-8")
    fails(iter_squad_documents(p), p, "article 1", "malformed JSON")


def test_squad_missing_field(tmp_path):
    p = write_json(tmp_path / "s.json", squad_json([{"title": "A", "paragraphs": [{"qas": []}]}]))
    fails(iter_squad_documents(p), p, "article 0", "paragraph 0", "'context'")
    qa = {"id": "q1", "answers": [{"answer_start": 0, "text": "First"}]}
    p = write_json(tmp_path / "s2.json", squad_json([article(qas={0: [qa]})]))
    fails(iter_squad_questions(p), p, "q1", "'question'")


def test_squad_duplicate_ids(tmp_path):
    p = write_json(tmp_path / "s.json", squad_json([article("T"), article("T")]))
    fails(iter_squad_documents(p), p, "article 1", "duplicate doc_id")
    qa = {"id": "q1", "question": "?", "answers": [{"answer_start": 0, "text": "First"}]}
    p = write_json(tmp_path / "s2.json", squad_json([article(qas={0: [qa], 1: [qa]})]))
    fails(iter_squad_questions(p), p, "paragraph 1", "duplicate qid 'q1'")


def test_squad_empty_text(tmp_path):
    p = write_json(tmp_path / "s.json", squad_json([article(contexts=("ok", "  "))]))
    fails(iter_squad_documents(p), p, "article 0", "paragraph 1", "empty")
    qa = {"id": "q1", "question": " ", "answers": [{"answer_start": 0, "text": "First"}]}
    p = write_json(tmp_path / "s2.json", squad_json([article(qas={0: [qa]})]))
    fails(iter_squad_questions(p), p, "q1", "empty 'question'")


def test_squad_answer_span_mismatch(tmp_path):
    qa = {"id": "q7", "question": "?", "answers": [{"answer_start": 3, "text": "First"}]}
    p = write_json(tmp_path / "s.json", squad_json([article(qas={0: [qa]})]))
    fails(iter_squad_questions(p), p, "q7", "does not occur")


def test_squad_non_utf8(tmp_path):
    p = tmp_path / "s.json"
    p.write_bytes(b'{"data": [\n{"title": "A\xff", "paragraphs": []}]}')
    fails(iter_squad_documents(p), p, "line 2", "byte offset 23", "UTF-8")


def test_download_squad(tmp_path, monkeypatch):
    src = tmp_path / "remote.json"
    src.write_bytes(b'{"data": []}')
    good = hashlib.sha256(src.read_bytes()).hexdigest()
    monkeypatch.setitem(squad_mod.SQUAD_URLS, "dev-v1.1", (src.as_uri(), good))
    out = download_squad("dev-v1.1", tmp_path / "dl")
    assert out == tmp_path / "dl" / "dev-v1.1.json" and out.read_bytes() == src.read_bytes()
    assert download_squad("dev-v1.1", tmp_path / "dl") == out  # cached, verified
    monkeypatch.setitem(squad_mod.SQUAD_URLS, "dev-v1.1", (src.as_uri(), "0" * 64))
    with pytest.raises(InputError) as info:
        download_squad("dev-v1.1", tmp_path / "dl2")
    assert src.as_uri() in str(info.value) and "sha256" in str(info.value)
    assert list((tmp_path / "dl2").iterdir()) == []
    assert squad_mod.SQUAD_URLS["train-v1.1"][0].startswith("https://rajpurkar.github.io/")


# ---------------------------------------------------------------- Wikipedia
NS = "http://www.mediawiki.org/xml/export-0.10/"


def page(title, pid, text, ns=0, redirect=None):
    red = f'<redirect title="{redirect}" />' if redirect else ""
    return (f"<page><title>{title}</title><ns>{ns}</ns><id>{pid}</id>{red}<revision><id>9</id>"
            f'<text xml:space="preserve">{text}</text></revision></page>\n')


def dump(*pages):
    return f'<mediawiki xmlns="{NS}" version="0.10">\n' + "".join(pages) + "</mediawiki>\n"


WIKITEXT = ("{{Infobox person|name=X}}'''Foo''' is a [[bar|thing]] in [[Paris]].&lt;ref&gt;{{cite web|url=u}}"
            "&lt;/ref&gt; [[File:x.jpg|thumb|A caption [[y]]]]\n\nSecond   paragraph.&lt;!-- hidden --&gt;\n"
            "{| class=wikitable\n|a||b\n|}\n== History ==\nOld times.\n== References ==\n* a ref\n"
            "[[Category:Things]]\n[[de:Foo]]")


def test_wikipedia_small_dump_plain_and_bz2(tmp_path):
    xml = dump(page("Foo", 1, WIKITEXT), page("Bar", 2, "#REDIRECT [[Foo]]", redirect="Foo"),
               page("Talk:Foo", 3, "talk", ns=1), page("Empty", 4, "{{stub}}"))
    plain = tmp_path / "d.xml"
    plain.write_text(xml, encoding="utf-8")
    packed = tmp_path / "d.xml.bz2"
    packed.write_bytes(bz2.compress(xml.encode()))
    for p in (plain, packed):
        stats = {}
        (doc,) = iter_wikipedia_documents(p, stats=stats)
        assert stats == {"pages": 4, "redirects": 1, "non_article": 1, "empty": 1, "yielded": 1}
        assert doc["doc_id"] == "wiki:1" and doc["title"] == "Foo"
        assert doc["text"] == "Foo is a thing in Paris.\n\nSecond paragraph.\n\nOld times."


def test_wikitext_to_text_drops_markup():
    text = wikitext_to_text("A [[:Category:Cats|cat list]] and [http://x.org site] &amp; more.__NOTOC__")
    assert text == "A cat list and site & more."


def test_wikipedia_truncated_bz2(tmp_path):
    import random
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa"]
    pages = (page(f"P{i}", i, " ".join(rng.choice(words) + str(rng.randrange(999)) for _ in range(400)))
             for i in range(1, 120))
    data = bz2.compress(dump(*pages).encode(), compresslevel=1)  # 100 kB blocks: several of them
    p = tmp_path / "t.xml.bz2"
    p.write_bytes(data[: len(data) * 3 // 4])
    fails(iter_wikipedia_documents(p), p, "truncated", "after page 'P")


def test_wikipedia_malformed_xml(tmp_path):
    p = tmp_path / "m.xml"
    p.write_text(dump(page("Good", 1, "Text.")) .replace("</mediawiki>", "<page><title>Bad</oops>"),
                 encoding="utf-8")
    fails(iter_wikipedia_documents(p), p, "line 3", "after page 'Good'", "malformed XML")


def test_wikipedia_missing_field_and_duplicate_id(tmp_path):
    p = tmp_path / "m.xml"
    p.write_text(dump(page("A", 1, "x."), "<page><title>B</title><ns>0</ns><revision/></page>"),
                 encoding="utf-8")
    fails(iter_wikipedia_documents(p), p, "page 2 ('B')", "'id'")
    p.write_text(dump(page("A", 1, "x."), page("B", 1, "y.")), encoding="utf-8")
    fails(iter_wikipedia_documents(p), p, "page 2 ('B')", "duplicate page id '1'")


def test_wikipedia_non_utf8(tmp_path):
    p = tmp_path / "n.xml.bz2"
    p.write_bytes(bz2.compress(dump(page("A", 1, "x.")).encode() .replace(b"x.", b"x\xe9.")))
    fails(iter_wikipedia_documents(p), p, "line 2", "UTF-8")


# ---------------------------------------------------------------- BEIR
def beir_dir(tmp_path, corpus=None, queries=None, qrels=None) -> Path:
    root = tmp_path / "ds"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_bytes(corpus if corpus is not None else
                                        b'{"_id": "d1", "title": "T", "text": "hello"}\n')
    (root / "queries.jsonl").write_bytes(queries if queries is not None else
                                         b'{"_id": "q1", "text": "hi?"}\n')
    (root / "qrels" / "test.tsv").write_bytes(qrels if qrels is not None else
                                              b"query-id\tcorpus-id\tscore\r\nq1\td1\t1\r\n")
    return root


def test_beir_small_zip(tmp_path):
    root = beir_dir(tmp_path)
    z = tmp_path / "ds.zip"
    with zipfile.ZipFile(z, "w") as zf:
        for f in root.rglob("*"):
            if f.is_file():
                zf.write(f, "ds/" + f.relative_to(root).as_posix())
    assert beir_splits(z) == ["test"]
    assert list(iter_beir_qrels(z, "test")) == [{"qid": "q1", "doc_id": "d1", "relevance": 1}]
    (doc,) = iter_beir_corpus(z, source="nf")
    assert doc["doc_id"] == "d1" and doc["source"] == "nf" and doc["title"] == "T"
    bad = beir_dir(tmp_path / "b", corpus=b'{"_id": "d1", "text": "a"}\n{"_id": "d1", "text": "b"}\n')
    with zipfile.ZipFile(tmp_path / "bad.zip", "w") as zf:
        zf.write(bad / "corpus.jsonl", "x/corpus.jsonl")
    fails(iter_beir_corpus(tmp_path / "bad.zip"), "bad.zip!x/corpus.jsonl", "line 2", "duplicate doc_id")
    assert beir_splits(tmp_path / "b") == ["test"]  # parent folder of the dataset folder
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no BEIR dataset"):
        open_beir(tmp_path / "empty")


def test_beir_malformed_json(tmp_path):
    root = beir_dir(tmp_path, corpus=b'{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": \n')
    fails(iter_beir_corpus(root), root / "corpus.jsonl", "line 2", "malformed JSON")


def test_beir_missing_field_and_empty_text(tmp_path):
    root = beir_dir(tmp_path, corpus=b'{"_id": "d1", "title": "x"}\n',
                    queries=b'{"_id": "q1", "text": "a"}\n{"_id": "q2", "text": ""}\n')
    fails(iter_beir_corpus(root), root / "corpus.jsonl", "line 1", "'text'")
    fails(iter_beir_queries(root), root / "queries.jsonl", "line 2", "empty 'text'")


def test_beir_duplicate_query(tmp_path):
    root = beir_dir(tmp_path, queries=b'{"_id": "q1", "text": "a"}\n\n{"_id": "q1", "text": "b"}\n')
    fails(iter_beir_queries(root), root / "queries.jsonl", "line 3", "duplicate qid 'q1'")


def test_beir_bad_qrels(tmp_path):
    root = beir_dir(tmp_path, qrels=b"query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\n")
    fails(iter_beir_qrels(root, "test"), root / "qrels" / "test.tsv", "line 3", "3 tab-separated")
    root = beir_dir(tmp_path / "2", qrels=b"q1\td1\thigh\n")
    fails(iter_beir_qrels(root, "test"), root / "qrels" / "test.tsv", "line 1", "not an integer")
    fails(iter_beir_qrels(root, "dev"), root / "qrels" / "dev.tsv", "missing")


def test_beir_non_utf8(tmp_path):
    root = beir_dir(tmp_path, corpus=b'{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": "\xc3("}\n')
    fails(iter_beir_corpus(root), root / "corpus.jsonl", "line 2", "UTF-8")


# ---------------------------------------------------------------- NQ-open
def test_nq_open_good_and_ids(tmp_path):
    p = tmp_path / "nq.jsonl"
    p.write_text('{"question": "q a", "answer": ["x"]}\n{"question": "q b", "answer": ["y", "z"], "id": 7}\n')
    qs = list(iter_nq_open(p, split="dev", source="nq"))
    assert [q["qid"] for q in qs] == ["nq:dev:1", "7"]
    assert qs[1]["answers"] == ["y", "z"] and qs[1]["doc_id"] is None and qs[1]["answer_spans"] == []


@pytest.mark.parametrize("content, where, what", [
    (b'{"question": "a", "answer": ["x"]}\n{"question": "b", "answer": ["x"\n', "line 2", "malformed JSON"),
    (b'{"question": "a"}\n', "line 1", "'answer'"),
    (b'{"answer": ["x"]}\n', "line 1", "'question'"),
    (b'{"question": "", "answer": ["x"]}\n', "line 1", "empty 'question'"),
    (b'{"question": "a", "answer": []}\n', "line 1", "empty 'answer'"),
    (b'{"question": "a", "answer": "x"}\n', "line 1", "list of strings"),
    (b'{"id": 1, "question": "a", "answer": ["x"]}\n{"id": 1, "question": "b", "answer": ["x"]}\n',
     "line 2", "duplicate qid '1'"),
    (b'{"question": "a", "answer": ["x"]}\n{"question": "\xff", "answer": ["x"]}\n', "line 2", "UTF-8"),
])
def test_nq_open_bad(tmp_path, content, where, what):
    p = tmp_path / "nq.jsonl"
    p.write_bytes(content)
    fails(iter_nq_open(p), p, where, what)


# ---------------------------------------------------------------- DPR
def test_dpr_passages_good(tmp_path):
    p = tmp_path / "psgs.tsv"
    p.write_text('id\ttext\ttitle\n1\t"Aaron ( or ; ""Ahärôn"") is a prophet"\tAaron\n'
                 '2\tsecond chunk\tAaron\n3\tother\tBee\n', encoding="utf-8")
    ps = list(iter_dpr_passages(p))
    assert ps[0] == {"pid": "1", "doc_id": "Aaron", "title": "Aaron",
                     "text": 'Aaron ( or ; "Ahärôn") is a prophet', "chunk_index": 0, "n_words": 8,
                     "char_start": None, "char_end": None}
    assert [(x["pid"], x["chunk_index"]) for x in ps] == [("1", 0), ("2", 1), ("3", 0)]


@pytest.mark.parametrize("content, where, what", [
    (b"pid\ttext\ttitle\n", "line 1", "header"),
    (b"id\ttext\ttitle\n1\tonly two\n", "line 2", "3 tab-separated"),
    (b'id\ttext\ttitle\n1\t"bad "quote\tT\n', "line 2", "malformed TSV"),
    (b"id\ttext\ttitle\n1\ta\tT\n1\tb\tT\n", "line 3", "duplicate pid '1'"),
    (b"id\ttext\ttitle\n1\t \tT\n", "line 2", "empty passage text"),
    (b"id\ttext\ttitle\n1\ta\tT\n2\t\x80\tT\n", "line 3", "UTF-8"),
])
def test_dpr_passages_bad(tmp_path, content, where, what):
    p = tmp_path / "psgs.tsv"
    p.write_bytes(content)
    fails(iter_dpr_passages(p), p, where, what)


def test_dpr_qa_good_splits_on_newline_only(tmp_path):
    p = tmp_path / "nq-test.qa.csv"
    p.write_bytes("who is\u0085 here?\t['A', \"B's\"]\r\nsecond\t['x\\ty']\n".encode())
    qs = list(iter_dpr_qa(p, split="test"))
    assert [q["question"] for q in qs] == ["who is\u0085 here?", "second"]
    assert qs[0]["answers"] == ["A", "B's"] and qs[1]["answers"] == ["x\ty"]
    assert qs[0]["qid"] == "dpr:test:1" and qs[1]["qid"] == "dpr:test:2"


@pytest.mark.parametrize("content, where, what", [
    (b"q\t['a']\nno tab here\n", "line 2", "question<TAB>answers"),
    (b"q\t['a'\n", "line 1", "Python literal"),
    (b"q\t'a'\n", "line 1", "list of strings"),
    (b"\t['a']\n", "line 1", "empty question"),
    (b"q\t[]\n", "line 1", "empty answer list"),
    (b"q\t['a']\nq\xfe\t['a']\n", "line 2", "UTF-8"),
])
def test_dpr_qa_bad(tmp_path, content, where, what):
    p = tmp_path / "x.qa.csv"
    p.write_bytes(content)
    fails(iter_dpr_qa(p), p, where, what)
