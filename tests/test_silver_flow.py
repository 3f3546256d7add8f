"""Paper 001 through the flow on the tiny SQuAD slice with tiny random BERTs: the cross-encoder
stage, silver pairs, a dual encoder on gold + silver with the weighted softmax, a distilled one,
a reranked BM25 run evaluated on the test split, and mined negatives judged by the classifier."""

import pytest

from flows.pipeline import pipeline
from storage import ArtifactStore
from tasks.config import PROJECT_ROOT, ConfigError, load_config

pytestmark = pytest.mark.usefixtures("flush_denormals")


def _config(tmp_path, checkpoint):
    import yaml

    model = {"base": str(checkpoint), "shared": True, "pooling": "mean", "normalize": True, "scale": 100.0}
    train = {"batch_size": 8, "max_steps": 2, "select_on_dev": False, "hard_negatives": 1, "passage_max_len": 96}
    config = {
        "extends": str(PROJECT_ROOT / "configs" / "tiny.yaml"),
        "negatives": {"drop_relevant_above": 0.99},
        # runtime onnx (auto is torch): silver, rerank and the judge score through ONNX Runtime here
        "cross_encoder": {"base": str(checkpoint), "dense_system": "zs", "report_max_questions": 10, "device": "cpu",
                          "runtime": "onnx",
                          "train": {"max_steps": 4, "batch_size": 8, "lr": 1.0e-3, "max_length": 96, "eval_every": 2}},
        # threshold 0: every candidate is kept, so the tiny run has silver pairs whatever p is
        "silver": {"queries": ["train"], "retriever": "zs", "top_k": 3, "threshold": 0.0, "max_queries": 12,
                   "shard_size": 10},
        "rerank": [{"run": "bm25", "depth": 5, "splits": ["test"]},
                   {"run": "zs", "depth": 5, "splits": ["dev", "test"], "mix": {"tune_k": 1}}],
        "dense": {"encode": {"batch_size": 16, "passage_max_len": 96, "query_max_len": 32},
                  "systems": [{"name": "zs", "model": model},
                              {"name": "weighted", "model": model,
                               "train": {"loss": "weighted", "pairs": ["gold", "silver"], **train}},
                              {"name": "distilled", "model": model,
                               "train": {"loss": "margin_mse", "max_questions": 16, "negative_pool": 3, **train}}]},
    }
    path = tmp_path / "silver.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def silver_run(prefect_harness, shared_data, tmp_path_factory, tiny_checkpoint):
    """The whole chain, built once: (config file, artifact root, stage -> version)."""
    tmp_path = tmp_path_factory.mktemp("silver")
    path = _config(tmp_path, tiny_checkpoint)
    return path, tmp_path / "artifacts", pipeline(config=load_config(path), root=str(tmp_path / "artifacts"))


def test_silver_pipeline(silver_run):
    _, root, versions = silver_run
    assert {"cross_encoder", "pairs:silver", "train:weighted", "train:distilled", "rerank:bm25-rerank"} <= set(versions)
    store = ArtifactStore(root)

    ce = store.get("cross_encoder", versions["cross_encoder"])
    stats = ce.manifest["stats"]
    assert set(stats["sources"]) == {"gold", "bm25", "dense", "document"} and stats["steps"] == 4
    # AUC and log loss at every evaluation; AUC picks the checkpoint
    assert [e["step"] for e in stats["dev_curve"]] == [2, 4] and stats["selected_by"] == "auc"
    assert all(0 <= e["auc"] <= 1 and e["log_loss"] > 0 for e in stats["dev_curve"])
    assert stats["dev_auc"] == max(e["auc"] for e in stats["dev_curve"])
    assert stats["seconds_all_attempts"] >= stats["seconds"] > 0
    report = store.sql("SELECT * FROM classification_report").to_pylist()
    assert [r["model"].split(" ")[0] for r in report] == ["majority", "dual", "cross-attention"]
    assert report[0]["recall"] == 0.0 and 0 < report[0]["accuracy"] < 1
    from sentence_transformers import CrossEncoder

    assert CrossEncoder(str(ce.path / "model"), device="cpu").predict([("a question", "a passage")]).shape == (1,)

    # Silver pairs: the retriever's top 3 minus gold, p^2 weights, in the pairs view beside gold.
    silver = store.sql("SELECT * FROM silver_pairs").to_pylist()
    assert silver and all(r["weight"] == pytest.approx(r["p"] ** 2) for r in silver)
    gold = {(r["qid"], r["pid"]) for r in store.sql("SELECT qid, pid FROM pairs WHERE source = 'gold'").to_pylist()}
    assert not gold & {(r["qid"], r["pid"]) for r in silver}
    assert store.sql("SELECT count(*) FROM pairs WHERE source = 'silver'").column(0)[0].as_py() == len(silver)
    scored = store.get("pairs", versions["pairs:silver"]).manifest["stats"]
    assert scored["runtime"] == "onnx" and scored["precision"] == "fp32"
    # checked against torch fp32 on the first pairs
    assert scored["reference"]["pairs"] > 0 and scored["reference"]["max_abs_p_diff"] < 1e-4
    by_source = store.get("pairs", versions["pairs:silver"]).manifest["stats"]["by_source"]["train"]
    assert by_source["queries"] == 12 and by_source["silver"] == len(silver)
    assert sum(b["pairs"] for b in by_source["p_histogram"]) == by_source["candidates"]

    weighted = store.get("dense_model", versions["train:weighted"]).manifest
    assert weighted["stats"]["examples"] > by_source["silver"] and "pairs:silver" in weighted["inputs"]
    assert "cross_encoder" in store.get("dense_model", versions["train:distilled"]).manifest["inputs"]

    # The reranked BM25 run: evaluated on the test split only, same passages per question as BM25's top 5.
    splits = store.sql("SELECT DISTINCT split FROM metrics WHERE system = 'bm25-rerank'").column(0).to_pylist()
    assert set(splits) == {"test", "all"}
    same = store.sql("""SELECT count(*) FROM (SELECT qid, pid FROM reranked_runs WHERE rank <= 5 AND system = 'bm25-rerank'
                        EXCEPT SELECT r.qid, r.pid FROM bm25_runs r JOIN questions q USING (qid)
                        WHERE r.rank <= 5 AND q.split = 'test')""").column(0)[0].as_py()
    assert same == 0

    # The mix: zs's top 5 of the dev and test questions, reordered; alpha the best on dev top-1, where
    # alpha 0 is zs's own order and 1 the classifier's (the evaluation's dev top-1 of each).
    mix = store.get("reranked_runs", versions["rerank:zs-rerank-mix"])
    curve = {float(a): v for a, v in mix.manifest["stats"]["tune_curve"].items()}
    assert len(curve) == 21 and mix.manifest["stats"]["tune_score"] == max(curve.values())
    assert curve[mix.manifest["stats"]["alpha"]] == max(curve.values())
    assert set(mix.manifest["inputs"]) >= {"rerank:zs-rerank", "search:zs"}

    def dev_top1(system):
        return store.sql(f"""SELECT value FROM metrics WHERE system = '{system}' AND split = 'dev'
                             AND metric = 'top_k_accuracy' AND k = 1""").column(0)[0].as_py()
    assert curve[0.0] == pytest.approx(dev_top1("zs")) and curve[1.0] == pytest.approx(dev_top1("zs-rerank"))
    heads = store.sql("""SELECT count(*) FROM (SELECT qid, pid FROM reranked_runs WHERE system = 'zs-rerank-mix'
                         AND rank <= 5 EXCEPT SELECT r.qid, r.pid FROM dense_runs r JOIN questions q USING (qid)
                         WHERE r.system = 'zs' AND r.rank <= 5 AND q.split IN ('dev', 'test'))""").column(0)[0].as_py()
    assert heads == 0
    report = (store.get("evaluation", versions["evaluate"]).path / "report.md").read_text()
    assert "## Cross-attention classifier" in report and "| majority (always false) | " in report
    assert "## Silver pairs" in report and f"| train | 12 | {by_source['candidates']} |" in report
    filtering = store.get("negatives", versions["negatives:bm25"]).manifest["stats"]["filtering"]
    assert filtering["candidates"] == filtering["kept"] + filtering["dropped_gold"] + filtering["dropped_answer"] + \
        filtering["dropped_relevant"]


def test_the_threshold_keeps_exactly_the_candidates_at_or_above_it(silver_run, tmp_path):
    import yaml

    path, root, versions = silver_run
    store = ArtifactStore(root)
    first = store.get("pairs", versions["pairs:silver"])
    # A threshold taken from the scored p themselves: the median value, so the lower half is
    # dropped, the upper half kept, and the candidates with p equal to it test ">=" rather than ">".
    values = sorted(set(first.read_table("scored_candidates").column("p").to_pylist()))
    assert len(values) >= 2, values
    threshold = values[len(values) // 2]
    config = yaml.safe_load(path.read_text())
    config["silver"]["threshold"] = threshold
    path = tmp_path / "silver-threshold.yaml"
    path.write_text(yaml.safe_dump(config))
    rerun = pipeline(config=load_config(path), stage="pairs:silver", root=str(root))
    silver = store.get("pairs", rerun["pairs:silver"])
    assert silver.version != first.version and silver.manifest["stats"]["threshold"] == threshold

    scored = silver.read_table("scored_candidates").to_pylist()
    kept = silver.read_table("silver_pairs").to_pylist()
    gold = {(r["qid"], r["pid"]) for r in store.get("pairs", versions["pairs:gold"]).read_table().to_pylist()}
    assert kept and not gold & {(r["qid"], r["pid"]) for r in kept}
    assert all(r["p"] >= threshold and r["weight"] == pytest.approx(r["p"] ** 2) for r in kept), kept
    dropped = {(r["qid"], r["pid"]) for r in scored} - {(r["qid"], r["pid"]) for r in kept}
    assert dropped and dropped == {(r["qid"], r["pid"]) for r in scored if r["p"] < threshold}
    # the training pairs the stage hands to the trainers are the kept ones, weighted p^2
    pairs = silver.read_table().to_pylist()
    assert sorted((r["qid"], r["pid"], r["weight"]) for r in pairs) == sorted((r["qid"], r["pid"], r["weight"]) for r in kept)
    assert silver.manifest["stats"]["silver"] == len(kept) and silver.manifest["stats"]["candidates"] == len(scored)


def test_silver_config_errors(tmp_path):
    base = f"extends: {PROJECT_ROOT / 'configs' / 'tiny.yaml'}\n"
    cases = {
        "dense: {systems: [{name: s, train: {pairs: [gold, silver], loss: weighted}}]}": "cross_encoder",
        "cross_encoder: {}\ndense: {systems: [{name: s, train: {pairs: [gold, silver]}}]}": "loss: weighted",
        "cross_encoder: {dense_system: nope}": "dense_system",
        "rerank: [{run: bm25}]": "cross_encoder",
        "dense: {systems: [{name: s, train: {loss: dpr, loss_options: {queue: 3}}}]}": "does not take options",
    }
    for i, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"bad{i}.yaml"
        path.write_text(base + text + "\n")
        with pytest.raises(ConfigError, match=message):
            load_config(path)
