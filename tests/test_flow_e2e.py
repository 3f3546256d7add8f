"""End to end through the Prefect flow on small slices of the real data."""
import bz2
import subprocess
import sys

import pytest

from flows.pipeline import pipeline
from storage import ArtifactStore
from tasks.config import PROJECT_ROOT, load_config

TINY = PROJECT_ROOT / "configs" / "tiny.yaml"


def _stages_built(store):
    return {(r["stage"], r["version"]) for r in store.list_artifacts()}


def test_tiny_pipeline_caches_reruns_one_stage_and_recomputes_downstream(prefect_harness, shared_data, tmp_path):
    root = str(tmp_path / "store")
    cfg = load_config(TINY)
    first = pipeline(config=cfg, root=root)
    assert list(first) == ["ingest_documents", "ingest_questions", "chunk", "link_gold", "bm25_index", "bm25_search", "evaluate"]
    store = ArtifactStore(tmp_path / "store")
    metrics = store.sql("SELECT metric, k, value FROM metrics WHERE system = 'bm25' AND split = 'all' AND metric = $1 ORDER BY k",
                        ["top_k_accuracy"]).to_pylist()
    assert [m["k"] for m in metrics] == [1, 5, 10, 20]
    values = [m["value"] for m in metrics]
    assert values == sorted(values) and 0.3 < values[0] <= values[-1] <= 1.0
    assert store.sql("SELECT count(DISTINCT doc_id) AS n FROM documents").column("n")[0].as_py() == 3
    n_questions = store.sql("SELECT count(*) AS n FROM questions").column("n")[0].as_py()
    assert store.sql("SELECT count(DISTINCT qid) AS n FROM bm25_runs").column("n")[0].as_py() == n_questions
    built = _stages_built(store)

    # Same config: every stage is a cache hit, no new artifact.
    assert pipeline(config=cfg, root=root) == first
    assert _stages_built(store) == built

    # One stage with a changed parameter: a new passages version, upstream untouched.
    changed = cfg.model_copy(update={"chunk": cfg.chunk.model_copy(update={"words": 60})})
    only_chunk = pipeline(config=changed, stage="chunk", root=root)
    assert only_chunk["chunk"] != first["chunk"]
    assert len(_stages_built(store)) == len(built) + 1

    # The full run on the changed config recomputes everything downstream of chunk.
    second = pipeline(config=changed, root=root)
    assert second["ingest_documents"] == first["ingest_documents"]
    assert second["ingest_questions"] == first["ingest_questions"]
    assert second["chunk"] == only_chunk["chunk"]
    for stage in ("link_gold", "bm25_index", "bm25_search", "evaluate"):
        assert second[stage] != first[stage]
    lineage = store.lineage("evaluation", second["evaluate"])
    assert {row["stage"] for row in lineage} >= {"evaluation", "bm25_runs", "bm25_index", "passages", "documents", "questions", "gold"}


def test_wikipedia_sample_and_squad_articles_in_one_corpus(prefect_harness, shared_data, tmp_path):
    cfg = load_config(TINY)
    data = cfg.data.model_copy(update={
        "squad": cfg.data.squad.model_copy(update={"max_articles": 1}),
        "wikipedia": ["wikipedia/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"],
        "wikipedia_max_pages": 40})
    versions = pipeline(config=cfg.model_copy(update={"data": data}), root=str(tmp_path), stage=None)
    store = ArtifactStore(tmp_path)
    rows = store.sql("SELECT source, count(*) AS n FROM documents GROUP BY 1").to_pylist()
    by_source = {r["source"]: r["n"] for r in rows}
    assert by_source == {"squad": 1, "wikipedia": 40}
    wiki_passages = store.sql("SELECT count(*) AS n FROM passages WHERE doc_id LIKE 'wiki:%'").column("n")[0].as_py()
    assert wiki_passages > 40
    assert store.get("evaluation", versions["evaluate"]) is not None


def test_bad_input_exits_non_zero_names_the_file_and_registers_nothing(tmp_path):
    good = bz2.compress(b"<mediawiki><page><title>A</title><ns>0</ns><id>1</id><revision><text>" + b"word " * 5000 + b"</text></revision></page></mediawiki>")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "truncated.xml.bz2").write_bytes(good[: len(good) // 2])
    squad = tmp_path / "data" / "squad.json"
    squad.write_text('{"version": "1.1", "data": [{"title": "T", "paragraphs": [{"context": "Some text here.", "qas": []}]}]}')
    config = tmp_path / "bad.yaml"
    config.write_text(f"name: bad\ndata:\n  data_root: {tmp_path / 'data'}\n  squad: {{path: squad.json, download: null}}\n"
                      "  wikipedia: [truncated.xml.bz2]\n")
    root = tmp_path / "store"
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "--root", str(root), "run", str(config)],
                          capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=300)
    assert proc.returncode != 0
    assert "truncated.xml.bz2" in proc.stderr
    assert ArtifactStore(root).list_artifacts("documents") == []


def test_beir_nfcorpus_through_the_flow_gives_graded_ndcg(prefect_harness, shared_data, tmp_path):
    cfg = load_config(PROJECT_ROOT / "configs" / "nfcorpus.yaml")
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={
        "beir": cfg.data.beir.model_copy(update={"qrels_splits": ["test"]})})})
    pipeline(config=cfg, root=str(tmp_path))
    store = ArtifactStore(tmp_path)
    assert store.sql("SELECT count(*) AS n FROM passages").column("n")[0].as_py() == 3633  # whole documents
    assert store.sql("SELECT count(*) AS n FROM questions WHERE split = 'test'").column("n")[0].as_py() == 323
    assert store.sql("SELECT max(relevance) AS m FROM gold").column("m")[0].as_py() == 2  # graded
    ndcg = store.sql("SELECT value FROM metrics WHERE metric = 'ndcg_cut' AND k = 10 AND split = 'test'").column("value")[0].as_py()
    assert 0.2 < ndcg < 0.5  # BM25 on NFCorpus: about 0.32 (BEIR)
    assert store.sql("SELECT count(*) AS n FROM metrics WHERE metric = 'top_k_accuracy'").column("n")[0].as_py() == 0


def test_explicit_article_lists_choose_the_test_split_and_absent_squad_fails_cleanly(shared_data, tmp_path, monkeypatch):
    from flows.registry import plan_for
    from tasks.engine import run_stage
    from tasks.errors import InputError

    def run(name, cfg, inputs):
        return run_stage(store, plan_for(cfg)[name], inputs)

    cfg = load_config(TINY)
    store = ArtifactStore(tmp_path)
    documents = run("ingest_documents", cfg, {})
    first = documents.read_table(columns=["doc_id", "title"]).to_pylist()[0]
    first_title = first["title"]
    split = cfg.split.model_copy(update={"articles": {"test": [first_title]}})
    questions = run("ingest_questions", cfg.model_copy(update={"split": split}),
                          {"ingest_documents": documents}).read_table("questions")
    in_test = {d for d, s in zip(questions.column("doc_id").to_pylist(), questions.column("split").to_pylist()) if s == "test"}
    assert in_test == {first["doc_id"]}

    monkeypatch.setenv("PFORGE_DOWNLOADS", str(tmp_path / "downloads"))
    monkeypatch.setattr("urllib.request.urlopen", lambda *a, **k: (_ for _ in ()).throw(OSError("offline")))
    absent = cfg.data.squad.model_copy(update={"path": "squad/absent.json", "download": "dev-v1.1"})
    with pytest.raises(InputError, match=r"absent\.json.*dev-v1\.1.*offline"):
        run("ingest_documents", cfg.model_copy(update={"data": cfg.data.model_copy(update={"squad": absent})}), {})


def test_verify_names_one_flipped_byte_of_a_tiny_run_and_repair_rebuilds_exactly_that_version(
        prefect_harness, shared_data, tmp_path, capsys):
    from flows.cli import main

    root = tmp_path / "store"
    cfg = load_config(TINY)
    first = pipeline(config=cfg, root=str(root))
    store = ArtifactStore(root)
    created = {(r["stage"], r["version"]): r["created_at"] for r in store.list_artifacts()}
    passages = store.get("passages", first["chunk"])
    damaged = sorted((passages.path / "data").rglob("*.parquet"))[0]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x01
    damaged.write_bytes(bytes(data))
    capsys.readouterr()

    assert main(["--root", str(root), "verify"]) == 1
    out = capsys.readouterr().out
    assert str(damaged.relative_to(passages.path)) in out and "1 damaged" in out, out
    assert main(["--root", str(root), "verify", "--repair"]) == 1
    capsys.readouterr()
    # Every reader of the passages is built, yet the repaired version is rebuilt, and only it.
    assert pipeline(config=cfg, root=str(root)) == first
    after = {(r["stage"], r["version"]): r["created_at"] for r in ArtifactStore(root).list_artifacts()}
    assert set(after) == set(created)
    assert [key for key in created if after[key] != created[key]] == [("passages", first["chunk"])]
    assert main(["--root", str(root), "verify"]) == 0
