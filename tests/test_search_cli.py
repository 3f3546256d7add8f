"""`pforge search` and `flows.search.search` over a tiny pipeline's artifacts: BM25, a dense system
whose encoder is a dense_model artifact (the one promoted), the DPR hybrid and an RRF fusion.
A question of the question set gets the pipeline's own run for it; a known question gets its
answer passage first; `--promoted` serves the promoted encoder. About a minute on 2 CPU cores."""
import json

import pytest

from flows.cli import main
from flows.pipeline import pipeline
from flows.promotion import promote
from flows.search import search
from storage import ArtifactStore
from tasks.config import PROJECT_ROOT, DenseConfig, DenseSystemConfig, FusionConfig, HybridConfig, load_config

MODEL = {"base": "minilm", "shared": True, "pooling": "mean", "normalize": True, "scale": 20.0}
QUESTION = "Who gave their name to Normandy, the region in France?"  # not a question of the set
ANSWER_TEXT = "gave their name to Normandy"  # in the first passage of the Normans article, only there


def _save_minilm(out):
    from models import BiEncoder
    from models.checkpoints import resolve_checkpoint

    BiEncoder.from_pretrained(resolve_checkpoint("minilm"), shared=True, pooling="mean", normalize=True,
                              scale=20.0).save_pretrained(out / "model")
    return {"stats": {"steps": 0}}


@pytest.fixture(scope="module")
def built(prefect_harness, shared_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("search-store")
    store = ArtifactStore(root)
    # A trained encoder as the store holds one (MiniLM as shipped, saved as a bi-encoder): the
    # dense system serves it through init_from, as a later run serves a promoted model.
    encoder = store.materialize("dense_model", "1", {"system": "served", "note": "MiniLM as shipped"}, {}, _save_minilm)
    cfg = load_config(PROJECT_ROOT / "configs" / "tiny.yaml")
    dense = DenseConfig(systems=[DenseSystemConfig(name="served", model=MODEL, init_from=f"dense_model:{encoder.version}")],
                        hybrid=HybridConfig(system="served", tune_split="dev", tune_k=5))
    cfg = cfg.model_copy(update={"dense": dense, "fusion": [FusionConfig(name="rrf", method="rrf", runs=["bm25", "served"])]})
    versions = pipeline(config=cfg, root=str(root))
    return {"root": root, "store": ArtifactStore(root), "config": cfg, "versions": versions, "encoder": encoder.version}


def _answer_pid(store) -> str:
    rows = store.sql("SELECT pid FROM passages WHERE contains(text, $1)", [ANSWER_TEXT]).column(0).to_pylist()
    assert len(rows) == 1, rows
    return rows[0]


def _stored_run(store, view: str, system: str, qid: str, k: int) -> list[tuple[str, float]]:
    rows = store.sql(f"SELECT pid, score FROM {view} WHERE system = $1 AND qid = $2 ORDER BY rank LIMIT $3",
                     [system, qid, k]).to_pylist()
    return [(r["pid"], r["score"]) for r in rows]


def _test_question(store) -> tuple[str, str]:
    row = store.sql("SELECT qid, question FROM questions WHERE split = 'test' ORDER BY qid LIMIT 1").to_pylist()[0]
    return row["qid"], row["question"]


@pytest.mark.parametrize("system,view,stored_system", [
    ("bm25", "bm25_runs", "bm25"),
    ("served", "dense_runs", "served"),
    ("hybrid", "hybrid_runs", "hybrid(served)"),
    ("rrf", "hybrid_runs", "rrf"),
])
def test_a_question_of_the_set_gets_the_pipelines_own_run(built, system, view, stored_system):
    store = built["store"]
    qid, question = _test_question(store)
    result = search(question, system=system, k=10, store=store)
    assert result.system == stored_system and result.runs.stage == view
    expected = _stored_run(store, view, stored_system, qid, 10)
    assert [h.pid for h in result.hits] == [pid for pid, _ in expected]
    assert [h.score for h in result.hits] == pytest.approx([s for _, s in expected], rel=1e-4, abs=1e-5)
    assert [h.rank for h in result.hits] == list(range(1, 11))
    assert all(h.title and h.text and h.doc_id for h in result.hits)


@pytest.mark.parametrize("system,rank", [("bm25", 1), ("hybrid", 1), ("served", 2)])
def test_a_known_question_finds_its_answer_passage(built, system, rank):
    """Measured: BM25 and the hybrid rank the answer passage first, zero-shot MiniLM second."""
    store = built["store"]
    result = search(QUESTION, system=system, k=5, store=store)
    ranks = [h.rank for h in result.hits if h.pid == _answer_pid(store)]
    assert ranks and ranks[0] <= rank, [(h.pid, h.score) for h in result.hits]
    hit = result.hits[ranks[0] - 1]
    assert ANSWER_TEXT in hit.text and hit.title == "Normans" and hit.doc_id


def test_the_config_names_exactly_its_artifacts(built):
    store, versions = built["store"], built["versions"]
    assert search(QUESTION, system="served", k=3, store=store, config=built["config"]).runs.version == versions["search:served"]
    assert search(QUESTION, system="hybrid", k=3, store=store, config=built["config"]).runs.version == versions["hybrid"]
    with pytest.raises(ValueError, match="no system 'nope'"):
        search(QUESTION, system="nope", store=store, config=built["config"])


def test_promoted_encoder_serves_search_and_the_cli_prints_it(built, capsys):
    store, root = built["store"], built["root"]
    with pytest.raises(ValueError, match="no encoder has been promoted"):
        search(QUESTION, promoted=True, store=store)
    assert search(QUESTION, store=store, k=1).system == "bm25"  # nothing promoted: BM25 serves

    assert main(["--root", str(root), "promote", built["encoder"][:8]]) == 0
    assert built["encoder"] in capsys.readouterr().out
    store = ArtifactStore(root)
    for promoted in (True, False):  # --promoted, and the default once something is promoted
        result = search(QUESTION, promoted=promoted, store=store, k=3)
        assert (result.system, result.encoder, result.runs.version) == ("served", built["encoder"], built["versions"]["search:served"])

    assert main(["--root", str(root), "search", QUESTION, "--promoted", "-k", "2", "--chars", "60"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"served (dense_runs {built['versions']['search:served']}, encoder dense_model {built['encoder']}): "
                      f"top 2 for {QUESTION!r}")
    rank, score, *title, pid = out[1].split()
    assert (rank, " ".join(title)) == ("1", "Normans") and pid.startswith("[squad:Normans#") and float(score) > 0
    assert out[2].startswith("     ") and out[2].endswith(" ...") and len(out[2].strip()) <= 64
    assert len(out) == 5

    # A promoted encoder that no index was built with: --promoted says what to run; the default serves BM25.
    other = store.materialize("dense_model", "1", {"system": "unbuilt"}, {}, _save_minilm)
    promote(other.version, store=store)
    with pytest.raises(RuntimeError, match=f"promoted dense_model {other.version} has no FAISS index"):
        search(QUESTION, promoted=True, store=store)
    assert search(QUESTION, store=store, k=1).system == "bm25"


def test_cli_errors_are_one_line(built, capsys):
    root = str(built["root"])
    for argv, message in [(["search", "   "], "the question is empty"),
                          (["search", QUESTION, "--system", "nope"], "no system 'nope' has runs; systems: bm25, "),
                          (["search", QUESTION, "-k", "0"], "k must be >= 1")]:
        assert main(["--root", root, *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("pforge: error: ") and message in err[0], err


def test_a_question_of_more_terms_than_lucene_takes_is_cut_with_a_warning(built, capsys, caplog):
    """Lucene refuses a query of more than 1,024 clauses (one per distinct analysed term): the
    question is cut to its longest prefix that fits, with a warning, for BM25 and every fusion."""
    from tasks.bm25.search import _distinct_terms, fit_clause_limit

    filler = " ".join(f"zq{i}x" for i in range(1500))
    long_question = f"{QUESTION} {filler}"
    cut = fit_clause_limit(long_question, 1024)
    assert _distinct_terms(cut) == 1024 and long_question.startswith(cut) and _distinct_terms(cut + " zzz1") == 1025
    for system in ("bm25", "rrf"):
        assert main(["--root", str(built["root"]), "search", long_question, "--system", system, "-k", "3"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[1].split()[2] == "Normans", out  # the question's own words still find the answer
    assert any("more distinct terms than Lucene's 1024 clauses" in r.getMessage() for r in caplog.records)

    # The pipeline's batch search of questions: one long question among others fails none of them.
    import pyarrow.compute as pc

    from tasks.bm25.search import bm25_search

    index = built["store"].latest("bm25_index").subdir("index")
    batch = bm25_search(index, [("a", QUESTION), ("long", long_question), ("b", "Normandy region")], k=3, threads=1)
    alone = bm25_search(index, [("a", QUESTION), ("b", "Normandy region")], k=3, threads=1)
    assert batch.filter(pc.not_equal(batch["qid"], "long")).to_pylist() == alone.to_pylist()
    assert batch.filter(pc.equal(batch["qid"], "long")).num_rows == 3


def test_gc_keeps_what_the_promoted_encoder_serves(built, tmp_path, capsys):
    """A later config's artifacts of the same stages and systems make the promoted encoder's
    embeddings, index and runs (and everything built on them) no longer the newest: gc keeps what
    the promotion serves anyway, and search --promoted answers as before."""
    import shutil
    import time

    import pyarrow as pa

    from storage import write_table

    root = tmp_path / "copy"
    shutil.copytree(built["root"], root)
    store = ArtifactStore(root)
    assert main(["--root", str(root), "promote", built["encoder"]]) == 0
    before = search(QUESTION, promoted=True, store=store, k=3)
    served = [before.runs, *(store.get(r["stage"], r["version"]) for r in before.runs.manifest["inputs"].values())]
    assert {a.stage for a in served} >= {"dense_runs", "embeddings", "faiss_index", "dense_model"}

    def newer(stage, variant, n):
        time.sleep(0.002)
        return store.materialize(stage, "1", {"later": n}, {}, lambda out: {
            "stats": {"rows": write_table(out, pa.table({"pid": ["x"]}))}, "variant": variant})

    stale = newer("dense_runs", {"system": "served"}, 1)
    # A newer one of every stage and system built on the served ones, so none of those keeps them.
    uses = {(r["stage"], json.dumps(r["variant"] or {}, sort_keys=True)) for r in store.list_artifacts()
            if r["stage"] != "dense_model" and {(a.stage, a.version) for a in served} & {
                (i["stage"], i["version"]) for i in store.lineage(r["stage"], r["version"])}}
    later = [newer(stage, json.loads(variant), 2) for stage, variant in sorted(uses)]
    assert main(["--root", str(root), "gc"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("removed ")
    assert not stale.path.exists() and all(a.path.is_dir() for a in later + served)
    after = search(QUESTION, promoted=True, store=ArtifactStore(root), k=3)
    assert (after.runs.version, [h.pid for h in after.hits]) == (before.runs.version, [h.pid for h in before.hits])
    assert main(["--root", str(root), "search", QUESTION, "--promoted", "-k", "1"]) == 0
