"""doc2query and two-stage training through the flow on the tiny SQuAD slice, with a tiny random
GPT-2 generator (a word-level tokenizer trained on the slice's text) and a tiny random BERT: the
plumbing, not the quality (that is the benchmarks' job)."""
import pytest

from flows.pipeline import pipeline
from storage import ArtifactStore
from tasks.config import PROJECT_ROOT, load_config

pytestmark = pytest.mark.usefixtures("flush_denormals")
TINY = PROJECT_ROOT / "configs" / "tiny.yaml"


def _config(generator, checkpoint):
    cfg = load_config(TINY).model_dump()
    model = {"base": str(checkpoint), "shared": True, "pooling": "mean", "normalize": True, "scale": 20.0}
    train = {"loss": "dpr", "batch_size": 4, "max_steps": 2, "select_on_dev": False, "hard_negatives": 1,
             "query_max_len": 16, "passage_max_len": 60}
    cfg["qgen"] = {"generator": str(generator),
                   "finetune": {"max_pairs": 12, "max_dev_pairs": 4, "batch_size": 4, "max_steps": 2, "eval_every": 1},
                   "generate": {"queries_per_passage": 2, "max_new_tokens": 6, "max_passages": 24, "shard_size": 10,
                                "batch_size": 8, "max_source_len": 64}}
    cfg["dense"] = {"encode": {"batch_size": 16, "passage_max_len": 60, "query_max_len": 16},
                    "systems": [{"name": "stage1", "model": model,
                                 "train": {**train, "pairs": ["synthetic"], "negatives": ["context"]}},
                                {"name": "stage2", "model": model, "init_from": "stage1",
                                 "train": {**train, "pairs": ["gold"], "negatives": ["bm25"]}}]}
    from tasks.config import PipelineConfig

    return PipelineConfig.model_validate(cfg)


def test_generator_synthetic_pairs_and_two_stage_training(prefect_harness, tmp_path, tiny_generator, checkpoint, monkeypatch):
    import tasks.qgen.finetune as finetune

    seen = {}
    real = finetune.finetune_generator

    def spy(generator, train_pairs, dev_pairs, *args, **kwargs):
        seen["train"], seen["dev"] = [q for _, q in train_pairs], [q for _, q in dev_pairs]
        return real(generator, train_pairs, dev_pairs, *args, **kwargs)

    monkeypatch.setattr(finetune, "finetune_generator", spy)
    cfg = _config(tiny_generator, checkpoint)
    versions = pipeline(config=cfg, root=str(tmp_path))
    store = ArtifactStore(tmp_path)

    # Only train-split questions reach the generator's training; dev questions score its checkpoints.
    split_of = {r["question"]: r["split"] for r in store.sql("SELECT question, split FROM questions").to_pylist()}
    assert len(seen["train"]) == 12 and {split_of[q] for q in seen["train"]} == {"train"}
    assert {split_of[q] for q in seen["dev"]} == {"dev"}
    qgen = store.get("qgen_model", versions["qgen_model"]).manifest["stats"]
    assert [step for step, _ in qgen["dev_curve"]] == [0, 1, 2]

    # At most C=2 distinct queries for each of the 24 sampled passages, in 3 shards of 10.
    queries = store.get("synthetic_queries", versions["synthetic_queries"])
    rows = queries.read_table().to_pylist()
    per_pid = {}
    for r in rows:
        per_pid.setdefault(r["pid"], []).append(r["query"].lower())
    assert len(per_pid) <= 24 and all(len(q) == len(set(q)) <= 2 for q in per_pid.values())
    stats = queries.manifest["stats"]
    assert stats["passages"] == 24 and stats["shards"] == 3 and stats["queries"] == len(rows)
    assert {"bleu4", "rougeL", "bm25_own_passage_first", "duplicate_share", "examples"} <= set(stats["quality"])
    # a GPT-2 generator: 'auto' resolves to torch, recorded beside the quality it measured
    assert (stats["runtime"], stats["quality"]["runtime"], stats["compute_type"]) == ("torch", "torch", "float32")
    made = store.get("pairs", versions["pairs:synthetic"]).manifest["stats"]
    assert (made["runtime"], made["compute_type"]) == ("torch", "float32") and 0 <= made["round_trip_kept"] <= 1

    # Synthetic pairs feed stage 1 with context negatives; stage 2 starts from stage 1 on gold pairs.
    pairs = store.sql("SELECT source, count(*) AS n FROM pairs GROUP BY 1 ORDER BY 1").to_pylist()
    assert [p["source"] for p in pairs] == ["gold", "synthetic"]
    assert store.sql("SELECT count(*) FROM negatives WHERE strategy = 'context' AND qid LIKE 'syn:%'").column(0)[0].as_py() > 0
    stage1 = store.get("dense_model", versions["train:stage1"]).manifest
    assert set(stage1["inputs"]) >= {"pairs:synthetic", "negatives:context"}
    stage2 = store.get("dense_model", versions["train:stage2"]).manifest
    assert stage2["inputs"]["train:stage1"]["version"] == versions["train:stage1"]
    report = (store.get("evaluation", versions["evaluate"]).path / "report.md").read_text()
    assert "## Synthetic queries" in report
    assert {"stage1", "stage2"} <= set(store.sql("SELECT DISTINCT system FROM metrics").column(0).to_pylist())
    assert pipeline(config=cfg, root=str(tmp_path)) == versions  # all cache hits


def test_sampled_passages_take_the_preferred_articles_first():
    import pyarrow as pa

    from tasks.qgen.stages import docs_of_splits, sample_passages

    questions = pa.table({"doc_id": ["a", "a", "b", "c"], "split": ["test", "test", "dev", "train"]})
    preferred = docs_of_splits(questions, ["dev", "test"])
    assert preferred == {"a", "b"}
    docs = ["c", "a", "x", "b", "c", "a", "y", "z"]
    passages = pa.table({"pid": [f"p{i}" for i in range(len(docs))], "doc_id": docs})
    picked = sample_passages(passages, 5, seed=1, preferred_docs=preferred)
    pids = picked.column("pid").to_pylist()
    assert {"p1", "p3", "p5"} <= set(pids) and len(pids) == 5 and pids == sorted(pids)  # corpus order
    assert sample_passages(passages, 5, seed=1, preferred_docs=preferred).equals(picked)  # seeded
    assert set(sample_passages(passages, 2, seed=1, preferred_docs=preferred).column("doc_id").to_pylist()) <= preferred
    assert sample_passages(passages, 8, seed=1).equals(passages)  # no limit reached: the whole corpus
