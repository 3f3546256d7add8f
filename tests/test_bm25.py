"""Lucene BM25 through Anserini inside this process's JVM (tasks/bm25)."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tasks.schemas import RUNS

PASSAGES = [
    ("p01", "Cats", "Cats are small carnivorous mammals that people keep as pets."),
    ("p02", "Dogs", "Dogs were domesticated from wolves and bark at strangers."),
    ("p03", "Zebra", "The zebra is an African equine with black and white stripes."),
    ("p04", "Xylophone", "A xylophone is a percussion instrument played with mallets."),
    ("p05", "Paris", "Paris is the capital and largest city of France."),
    ("p06", "Berlin", "Berlin is the capital of Germany and its largest city."),
    ("p07", "Rome", "Rome was the capital of the Roman Empire for centuries."),
    ("p08", "Volcano", "A volcano is a rupture in the crust through which lava escapes."),
    ("p09", "Glacier", "A glacier is a dense body of ice moving under its own weight."),
    ("p10", "Photosynthesis", "Plants convert light into chemical energy by photosynthesis."),
    ("p11", "Mitochondria", "Mitochondria are the powerhouse of the cell and make ATP."),
    ("p12", "Chess", "Chess is a board game for two players on a checkered board."),
    ("p13", "Football", "Football is played by two teams of eleven players with a ball."),
    ("p14", "Tennis", "Tennis players hit a ball over a net with rackets."),
    ("p15", "Jupiter", "Jupiter is the largest planet in the solar system."),
    ("p16", "Mars", "Mars is called the red planet because of iron oxide dust."),
    ("p17", "Saturn", "Saturn is a planet known for its prominent ring system."),
    ("p18", "Bread", "Bread is baked from a dough of flour and water."),
    ("p19", "Cheese", "Cheese is made from the milk of cows, goats or sheep."),
    ("p20", "Coffee", "Coffee is brewed from roasted seeds of the coffea plant."),
    ("p21", "Cities", "Many a capital city is the largest city of its country, but not every capital."),
]

QUERIES = [
    ("q-xylo", "percussion xylophone mallets"),
    ("q-capital", "capital largest city"),
    ("q-planet", "largest planet"),
    ("q\tweird id", "Which game\tis played on a checkered\nboard?"),
]


def _table(rows=PASSAGES) -> pa.Table:
    pids, titles, texts = zip(*rows)
    return pa.table({"pid": list(pids), "title": list(titles), "text": list(texts)})


@pytest.fixture(scope="module")
def jvm():
    from tasks.bm25.jvm import ensure_jvm

    ensure_jvm()  # starts once per process (~1 s); later calls are no-ops
    ensure_jvm()


@pytest.fixture(scope="module")
def index_dir(jvm, tmp_path_factory) -> Path:
    from tasks.bm25.index import build_bm25_index

    folder = tmp_path_factory.mktemp("bm25") / "index"
    seen = []
    stats = build_bm25_index(_table(), folder, threads=2, progress=seen.append)
    assert stats["documents"] == len(PASSAGES)
    assert stats["index_docs"] == len(PASSAGES)
    assert stats["seconds"] > 0
    assert seen and seen[-1] == len(PASSAGES)
    return folder


def test_anserini_jar_exists():
    from tasks.bm25.jvm import anserini_jar

    jar = anserini_jar()
    assert jar.is_file() and jar.name.startswith("anserini-") and jar.suffix == ".jar"


def test_jvm_is_java_21_with_anserini(jvm):
    from jnius import autoclass

    assert autoclass("java.lang.System").getProperty("java.version").startswith("21")
    autoclass("io.anserini.search.SearchCollection")


def test_jvm_bootstrap_sets_the_openai_key_pyserini_needs():
    """Importing pyserini.search.lucene builds an OpenAI client, which fails without
    OPENAI_API_KEY: ensure_jvm() must set a dummy one (conftest sets one too, so this runs in a
    fresh interpreter without it), and must keep a key the user set."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    script = (
        "import os\n"
        "assert 'OPENAI_API_KEY' not in os.environ or os.environ['OPENAI_API_KEY'] == 'sk-user'\n"
        "from tasks.bm25.jvm import ensure_jvm\n"
        "ensure_jvm()\n"
        "print('KEY=' + os.environ.get('OPENAI_API_KEY', ''))\n"
        "import sys\n"
        "if sys.argv[1] == 'import':\n"
        "    import pyserini.search.lucene  # noqa: F401\n"
        "    print('IMPORTED')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}

    def run(mode, **extra):
        out = subprocess.run([sys.executable, "-c", script, mode], cwd=root, env={**env, **extra},
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    out = run("import")
    assert "KEY=dummy-not-used" in out and "IMPORTED" in out
    assert "KEY=sk-user" in run("plain", OPENAI_API_KEY="sk-user")


def test_rare_term_ranks_its_passage_first(index_dir):
    from tasks.bm25.search import bm25_search

    runs = bm25_search(index_dir, QUERIES, k=5)
    assert runs.schema == RUNS
    top = {r["qid"]: r["pid"] for r in runs.to_pylist() if r["rank"] == 1}
    assert top["q-xylo"] == "p04"
    assert top["q\tweird id"] == "p12"  # tabs/newlines in the text are sanitised, qid kept as is
    assert top["q-planet"] == "p15"
    assert set(runs.column("system").to_pylist()) == {"bm25"}


def test_k_ranks_scores_and_query_order(index_dir):
    from tasks.bm25.search import bm25_search

    for k in (1, 3, 7):
        runs = bm25_search(index_dir, QUERIES, k=k, system="lucene")
        rows = runs.to_pylist()
        qids_in_order = list(dict.fromkeys(r["qid"] for r in rows))
        assert qids_in_order == [q for q, _ in QUERIES]  # input order kept
        for qid in qids_in_order:
            mine = [r for r in rows if r["qid"] == qid]
            assert 1 <= len(mine) <= k
            assert [r["rank"] for r in mine] == list(range(1, len(mine) + 1))
            scores = [r["score"] for r in mine]
            assert scores == sorted(scores, reverse=True)
            assert all(s > 0 for s in scores)
            assert len({r["pid"] for r in mine}) == len(mine)
        assert {r["system"] for r in rows} == {"lucene"}
    # a query matching many passages fills k exactly
    runs = bm25_search(index_dir, [("q", "capital largest city planet")], k=4)
    assert runs.num_rows == 4


def test_k1_and_b_change_scores(index_dir):
    from tasks.bm25.search import bm25_search

    q = [("q-capital", "capital largest city")]

    def scores(**kw):
        runs = bm25_search(index_dir, q, k=5, **kw)
        return dict(zip(runs.column("pid").to_pylist(), runs.column("score").to_pylist()))

    base = scores(k1=0.9, b=0.4)
    assert scores(k1=0.9, b=0.4) == base  # deterministic
    assert scores(k1=2.0, b=0.4) != base
    assert scores(k1=0.9, b=1.0) != base


def test_public_search_scores_equal_hand_computed_bm25(jvm, tmp_path):
    """bm25_search's scores for a tiny index, against Lucene's BM25 computed by hand:
    sum over query terms of idf * tf / (tf + k1 * (1 - b + b * dl / avgdl)),
    idf = ln(1 + (N - df + 0.5) / (df + 0.5)). Documents under 24 terms keep their exact length
    in Lucene's norms. k1 and b are far apart, so passing them swapped changes every score."""
    import math

    from tasks.bm25.index import build_bm25_index
    from tasks.bm25.search import bm25_search

    docs = {"d1": "alpha alpha bravo", "d2": "alpha charlie charlie charlie delta",
            "d3": "bravo delta", "d4": "echo foxtrot golf hotel india juliet"}
    build_bm25_index(pa.table({"pid": list(docs), "text": list(docs.values())}), tmp_path / "idx", threads=1)
    tokens = {pid: text.split() for pid, text in docs.items()}
    n_docs, avgdl = len(docs), sum(map(len, tokens.values())) / len(docs)

    def by_hand(query, k1, b):
        scores = {}
        for pid, toks in tokens.items():
            total = 0.0
            for term in query.split():
                tf, df = toks.count(term), sum(term in t for t in tokens.values())
                if tf:
                    idf = math.log(1 + (n_docs - df + 0.5) / (df + 0.5))
                    total += idf * tf / (tf + k1 * (1 - b + b * len(toks) / avgdl))
            if total:
                scores[pid] = total
        return scores

    queries = [("q1", "alpha"), ("q2", "charlie delta"), ("q3", "bravo alpha")]
    for k1, b in ((0.5, 0.9), (1.6, 0.2)):
        runs = bm25_search(tmp_path / "idx", queries, k=10, k1=k1, b=b).to_pylist()
        for qid, text in queries:
            got = {r["pid"]: r["score"] for r in runs if r["qid"] == qid}
            want = by_hand(text, k1, b)
            assert got.keys() == want.keys(), (qid, got, want)
            for pid in want:
                assert got[pid] == pytest.approx(want[pid], rel=1e-5), (qid, pid, k1, b)
            swapped = by_hand(text, b, k1)
            assert any(got[pid] != pytest.approx(swapped[pid], rel=1e-3) for pid in want)


def test_empty_and_hitless_queries(index_dir):
    from tasks.bm25.search import bm25_search

    empty = bm25_search(index_dir, [], k=10)
    assert empty.schema == RUNS and empty.num_rows == 0
    blank = bm25_search(index_dir, [("q1", ""), ("q2", "   \t\n")], k=10)
    assert blank.schema == RUNS and blank.num_rows == 0
    runs = bm25_search(index_dir, [("none", "qwertyuiopzxcv"), ("the", "the of and"),
                                   ("hit", "xylophone")], k=10)
    assert runs.schema == RUNS
    assert runs.column("qid").to_pylist() == ["hit"]  # no-hit queries are simply absent


def test_bad_arguments(index_dir, tmp_path):
    from tasks.bm25.search import bm25_search

    with pytest.raises(ValueError):
        bm25_search(index_dir, QUERIES, k=0)
    with pytest.raises(FileNotFoundError):
        bm25_search(tmp_path / "missing", QUERIES)


def test_index_from_record_batches_and_rebuild(jvm, tmp_path):
    from tasks.bm25.index import build_bm25_index, count_index_docs
    from tasks.bm25.search import bm25_search

    table = _table()
    folder = tmp_path / "idx"
    stats = build_bm25_index(iter(table.to_batches(max_chunksize=6)), folder, threads=3)
    assert stats["documents"] == len(PASSAGES) == count_index_docs(folder)
    # rebuilding replaces the index rather than appending to it
    build_bm25_index(table.slice(0, 3), folder, threads=1)
    assert count_index_docs(folder) == 3
    assert bm25_search(folder, [("q", "xylophone")], k=3).num_rows == 0


def test_index_count_check_raises_on_unindexed_passages(jvm, tmp_path):
    from tasks.bm25.index import build_bm25_index

    rows = PASSAGES[:3] + [("p-empty", "", "")]  # an empty document is not indexed by Anserini
    with pytest.raises(RuntimeError, match="input passages"):
        build_bm25_index(_table(rows), tmp_path / "idx", threads=1)


def test_missing_pid_column_raises(jvm, tmp_path):
    from tasks.bm25.index import build_bm25_index

    with pytest.raises(ValueError, match="pid"):
        build_bm25_index(pa.table({"text": ["a b c"]}), tmp_path / "idx")


def test_pid_with_whitespace_rejected(jvm, tmp_path):
    from tasks.bm25.index import build_bm25_index

    with pytest.raises(ValueError, match="whitespace"):
        build_bm25_index(_table([("p 1", "t", "some text")]), tmp_path / "idx")


def test_forge_batch_search_is_in_use_and_matches_anserini_searchcollection(index_dir, tmp_path):
    """The project's batch searcher must rank and score exactly like Anserini's SearchCollection."""
    from tasks.bm25 import search

    topics = tmp_path / "topics.tsv"
    search.write_topics(QUERIES, topics)
    forge_run, anserini_run = tmp_path / "forge.trec", tmp_path / "anserini.trec"
    assert search._run_forge_batch_search(index_dir, topics, forge_run, 10, 0.9, 0.4, 2), "javac-built helper missing"
    search._run_search_collection(["-index", str(index_dir), "-topics", str(topics), "-topicReader", "TsvInt",
                                   "-output", str(anserini_run), "-format", "trec", "-bm25", "-bm25.k1", "0.9",
                                   "-bm25.b", "0.4", "-hits", "10", "-threads", "1", "-quiet"])
    ours, theirs = search.read_trec_run(forge_run), search.read_trec_run(anserini_run)
    assert ours.num_rows == theirs.num_rows > 0
    assert ours.column("pid").to_pylist() == theirs.column("pid").to_pylist()
    assert ours.column("qidx").to_pylist() == theirs.column("qidx").to_pylist()
    assert ours.column("score").to_pylist() == pytest.approx(theirs.column("score").to_pylist(), abs=1e-4)
