"""Issue 25's recipe through the flow: a BEIR-format corpus without training questions adapts a
dual encoder with a generator and a cross-encoder that another config's run trained (pinned by
version): queries generated for its passages, negatives mined for them (BM25, a dense miner,
random), the teacher's scores, Margin-MSE and silver students; evaluated on the corpus's own
qrels, which no training stage reads. Tiny random models: the plumbing, not the quality."""
import json

import pytest
import yaml

from flows.pipeline import pipeline
from flows.registry import config_references, plan_for
from storage import ArtifactStore
from tasks.config import PROJECT_ROOT, load_config

pytestmark = pytest.mark.usefixtures("flush_denormals")


def _beir_from_squad(folder, squad_file, articles=3, per_split=6):
    """SQuAD paragraphs as a BEIR corpus (the tiny generator's vocabulary is theirs), with dev and
    test qrels and no train queries."""
    data = json.loads(squad_file.read_text())["data"][:articles]
    paragraphs = [(p["context"], p["qas"]) for a in data for p in a["paragraphs"]]
    (folder / "qrels").mkdir(parents=True)
    with open(folder / "corpus.jsonl", "w") as corpus:
        for i, (context, _) in enumerate(paragraphs):
            corpus.write(json.dumps({"_id": f"d{i}", "title": "", "text": context}) + "\n")
    queries, qrels = [], {"dev": [], "test": []}
    for i, (_, qas) in enumerate(paragraphs[: 2 * per_split]):
        split = "dev" if i < per_split else "test"
        queries.append({"_id": f"q{i}", "text": qas[0]["question"]})
        qrels[split].append(f"q{i}\td{i}\t1")
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    for split, rows in qrels.items():
        (folder / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    return len(paragraphs)


def _configs(tmp_path, generator, checkpoint):
    source = {
        "extends": str(PROJECT_ROOT / "configs" / "tiny.yaml"), "name": "source",
        "qgen": {"generator": str(generator),
                 "finetune": {"max_pairs": 8, "max_dev_pairs": 4, "batch_size": 4, "max_steps": 1},
                 "generate": {"max_passages": 4, "max_new_tokens": 4, "runtime": "torch"}},
        "cross_encoder": {"base": str(checkpoint), "report_max_questions": 4, "device": "cpu",
                          "train": {"max_steps": 2, "batch_size": 8, "lr": 1.0e-3, "max_length": 64}},
    }
    model = {"base": str(checkpoint), "shared": True, "pooling": "mean", "normalize": True, "scale": 20.0}
    train = {"batch_size": 4, "max_steps": 2, "select_on_dev": False, "hard_negatives": 1, "negative_pool": 3,
             "passage_max_len": 64, "query_max_len": 16}
    target = {
        "name": "adapt-tiny",
        "data": {"data_root": str(tmp_path), "beir": {"path": "corpus", "qrels_splits": ["dev", "test"]}},
        "chunk": {"words": 0}, "bm25": {"k": 20, "threads": 1},
        "qgen": {"generator": "source.yaml:qgen_model", "finetune": {"enabled": False},
                 "generate": {"queries_per_passage": 2, "max_new_tokens": 6, "batch_size": 8, "max_source_len": 64,
                              "shard_size": 10, "runtime": "torch"}},
        "cross_encoder": {"model": "source.yaml:cross_encoder", "device": "cpu"},
        "negatives": {"bm25": {"depth": 5, "splits": [], "synthetic": True},
                      "random": {"depth": 5, "splits": [], "synthetic": True},
                      "dense": {"zs-mined": {"system": "zs", "depth": 5, "splits": [], "synthetic": True}}},
        "silver": {"queries": ["synthetic"], "retriever": "zs", "top_k": 3, "threshold": 0.0, "max_queries": 12,
                   "shard_size": 10},
        "dense": {"encode": {"batch_size": 16, "passage_max_len": 64, "query_max_len": 16},
                  "systems": [{"name": "zs", "model": model},
                              {"name": "mmse", "model": model,
                               "train": {"loss": "margin_mse", "pairs": ["synthetic"], "negatives": ["bm25", "zs-mined"],
                                         **train}},
                              {"name": "silver", "model": model,
                               "train": {"loss": "weighted", "pairs": ["synthetic", "silver"], "negatives": ["random"],
                                         **train}}]},
        "evaluation": {"ks": [1, 5, 10], "compare": [["mmse", "zs"]], "compare_ks": [10], "bootstrap_samples": 200},
    }
    (tmp_path / "source.yaml").write_text(yaml.safe_dump(source))
    (tmp_path / "target.yaml").write_text(yaml.safe_dump(target))
    return tmp_path / "source.yaml", tmp_path / "target.yaml"


@pytest.fixture(scope="module")
def adapted(prefect_harness, shared_data, tmp_path_factory, tiny_generator, tiny_checkpoint):
    tmp_path = tmp_path_factory.mktemp("adapt")
    passages = _beir_from_squad(tmp_path / "corpus", shared_data / "squad" / "dev-v1.1-partial.json")
    source, target = _configs(tmp_path, tiny_generator, tiny_checkpoint)
    root = tmp_path / "artifacts"
    # `upto`: only what the generator and the classifier need of the source config (no evaluation)
    built = pipeline(config=load_config(source), root=str(root), upto="qgen_model")
    built |= pipeline(config=load_config(source), root=str(root), upto="cross_encoder")
    versions = pipeline(config=load_config(target), root=str(root))
    return ArtifactStore(root), built, versions, passages, target


def test_the_generator_and_teacher_of_another_run_are_pinned_by_version(adapted):
    store, built, versions, passages, target = adapted
    assert {"qgen_model", "cross_encoder", "bm25_search"} <= set(built)
    assert not {"synthetic_queries", "evaluate"} & set(built)  # run upto the two models, not the rest
    plan = plan_for(load_config(target))
    generate = plan["synthetic_queries"]
    assert "qgen_model" not in plan.stages  # nothing fine-tunes here: the source's generator writes
    assert generate.pinned["generator"].version == built["qgen_model"]
    assert generate.params.generator == f"qgen_model:{built['qgen_model']}"
    references = {r.stage: r for r in config_references(load_config(target))}   # what a study builds first
    assert {(r.config.name, r.artifact, r.version) for r in references.values()} == {
        ("source.yaml", "qgen_model", built["qgen_model"]), ("source.yaml", "cross_encoder", built["cross_encoder"])}
    teacher = store.get("cross_encoder", versions["cross_encoder"]).manifest["stats"]
    assert teacher["imported_from"] == f"cross_encoder:{built['cross_encoder']}"
    assert teacher["trained_by_source"]["training_pairs"] > 0
    # queries for every passage of the corpus (C = 2, duplicates dropped)
    queries = store.get("synthetic_queries", versions["synthetic_queries"]).read_table()
    assert set(queries.column("pid").to_pylist()) == {f"d{i}#0" for i in range(passages)}  # whole documents


def test_generated_queries_get_mined_negatives_without_their_own_passage(adapted):
    store, _, versions, _, _ = adapted
    own = {r["qid"]: r["pid"] for r in store.get("pairs", versions["pairs:synthetic"]).read_table().to_pylist()}
    for strategy in ("bm25", "zs-mined", "random"):
        artifact = store.get("negatives", versions[f"negatives:{strategy}"])
        rows = artifact.read_table().to_pylist()
        assert rows and {r["qid"] for r in rows} <= set(own), strategy
        assert all(r["pid"] != own[r["qid"]] for r in rows), strategy
        assert artifact.manifest["stats"]["synthetic_queries"] == len(own)
        # mined queries reach their depth (5) unless the corpus runs out
        per_query = {}
        for r in rows:
            per_query[r["qid"]] = per_query.get(r["qid"], 0) + 1
        assert max(per_query.values()) == 5


def test_students_train_on_generated_queries_only_and_the_teacher_is_summarised(adapted):
    store, _, versions, _, _ = adapted
    mmse = store.get("dense_model", versions["train:mmse"]).manifest
    teacher = mmse["stats"]["teacher"]
    # GPL labels only what trains: per step 4 questions, each its positive and 1 drawn of its pool of 3
    assert teacher["pairs_scored"] == mmse["stats"]["steps"] * 4 * (1 + 1)
    assert set(teacher["positive"]) == {"p5", "p25", "p50", "p75", "p95"}
    assert 0 <= teacher["positive_above_all_negatives"] <= 1
    # no train stage reads the corpus's qrels: their pairs are the generated and silver ones
    for name in ("train:mmse", "train:silver"):
        inputs = store.get("dense_model", versions[name]).manifest["inputs"]
        pairs = [stage for stage in inputs if stage.startswith("pairs:")]
        assert pairs and not {"pairs:gold"} & set(pairs)
    silver = store.get("pairs", versions["pairs:silver"]).manifest["stats"]["by_source"]
    assert list(silver) == ["synthetic"] and silver["synthetic"]["queries"] == 12


def test_the_adapted_systems_are_evaluated_on_the_corpus_qrels(adapted):
    store, _, _, _, _ = adapted
    ndcg = store.sql("SELECT system, value FROM metrics WHERE metric = 'ndcg_cut' AND k = 10 AND split = 'test'")
    assert {"bm25", "zs", "mmse", "silver"} <= set(ndcg.column("system").to_pylist())
    assert store.sql("SELECT count(*) FROM comparisons WHERE system_a = 'mmse'").column(0)[0].as_py() == 1


def test_pforge_compare_resamples_ndcg_on_a_corpus_without_answers(adapted, capsys):
    from flows.cli import main

    store, _, versions, _, _ = adapted
    stage_row = store.sql("SELECT * FROM comparisons WHERE system_a = 'mmse'").to_pylist()[0]
    assert stage_row["metric"] == "ndcg_cut" and stage_row["k"] == 10
    assert main(["--root", str(store.root), "compare", "mmse", "zs", "-k", "10", "--samples", "200",
                 "--evaluation", versions["evaluate"]]) == 0
    out = capsys.readouterr().out
    assert f"| mmse | zs | test | nDCG@10 | {100 * stage_row['a']:.1f} | {100 * stage_row['b']:.1f} |" in out


def test_the_teacher_can_fine_tune_on_the_generated_queries(adapted, tmp_path):
    """cross_encoder.queries: synthetic: the imported classifier trains further on the corpus's
    generated queries (own passage positive, BM25 and document negatives); nothing of the qrels."""
    store, built, versions, _, target = adapted
    raw = yaml.safe_load(target.read_text())
    raw["cross_encoder"] = {"model": "source.yaml:cross_encoder", "queries": "synthetic", "device": "cpu",
                            "max_questions": 40, "report_max_questions": 4,
                            "train": {"max_steps": 2, "batch_size": 8, "lr": 1.0e-3, "max_length": 64, "eval_every": 1}}
    tuned_config = target.parent / "target-tuned-teacher.yaml"
    tuned_config.write_text(yaml.safe_dump(raw))
    cfg = load_config(tuned_config)
    stage = plan_for(cfg)["cross_encoder"]
    assert stage.pinned["start"].version == built["cross_encoder"] and "pairs:synthetic" in stage.inputs
    tuned = pipeline(config=cfg, root=str(store.root), upto="cross_encoder")
    assert tuned["pairs:synthetic"] == versions["pairs:synthetic"]  # the same queries as the recipe's
    stats = store.get("cross_encoder", tuned["cross_encoder"]).manifest["stats"]
    # one passage per document here (whole BEIR documents): no document negatives to draw
    assert set(stats["sources"]) == {"gold", "bm25"} and stats["steps"] == 2
    assert stats["training_pairs"] + stats["dev_pairs"] <= 40 * 3  # 40 queries: a positive and up to 2 negatives each
    assert tuned["cross_encoder"] != versions["cross_encoder"]


def test_a_root_that_imported_the_generated_queries_runs_without_the_source_generator(adapted, tmp_path):
    """A study machine imports the generated queries another one exported: the target config's
    run reads them, although the generator they came from (the source run's) is not in its root."""
    from storage.transfer import export_artifact, import_artifact

    store, built, versions, _, target = adapted
    description = export_artifact(store, store.get("synthetic_queries", versions["synthetic_queries"]), tmp_path)
    fresh = ArtifactStore(tmp_path / "fresh")
    import_artifact(fresh, description)
    # BM25 negatives: the queries' own inputs (the BM25 index among them) are built here too
    again = pipeline(config=load_config(target), root=str(fresh.root), upto="negatives:bm25")
    assert again["synthetic_queries"] == versions["synthetic_queries"] and "bm25_index" in again
    assert again["negatives:bm25"] == versions["negatives:bm25"]
    assert fresh.get("qgen_model", built["qgen_model"]) is None


def test_a_study_record_of_an_adapted_row_keeps_the_source_runs_steps_it_needed(adapted, tmp_path):
    """The row's record lists the source config's steps behind the generator and the teacher it
    read (each once, with its config) beside its own; the price of such a step is that build's,
    never that of a step of the same name in the row's own config."""
    from flows.study.definition import load_study
    from flows.study.estimate import measured_steps, price_step
    from flows.study.runner import record_row
    from flows.study.status import Plans

    store, built, versions, _, target = adapted
    folder = tmp_path / "studies" / "adapt"
    folder.mkdir(parents=True)
    (folder / "study.yaml").write_text(yaml.safe_dump({
        "name": "adapt", "default_config": str(target),
        "rows": [{"name": "mmse", "stage": "search:mmse", "priority": 1}]}))
    study = load_study(folder / "study.yaml")
    machine = {"key": "a CPU", "threads": 1, "sgemm_gflops": 10.0}
    path = record_row(study, study.row("mmse"), Plans(study), store.root, machine, {"commit": "c" * 40, "dirty": False},
                      repo=None)
    stages = json.loads(path.read_text())["stages"]
    own = [s for s in stages if "config" not in s]
    source = {s["step"]: s for s in stages if s.get("config")}
    assert {"train:mmse", "search:mmse", "synthetic_queries"} <= {s["step"] for s in own}
    assert {s["config"] for s in source.values()} == {str(target.parent / "source.yaml")}   # outside the project: its path
    assert source["qgen_model"]["version"] == built["qgen_model"]
    assert source["cross_encoder"]["version"] == built["cross_encoder"]
    works = [(s["artifact"], s["version"]) for s in stages]
    assert len(works) == len(set(works))   # a build the row's own steps list is not listed again

    measured = measured_steps({"r": json.loads(path.read_text())})
    same_build = price_step("qgen_model", measured, machine, None, ("source.yaml", f"qgen_model@{built['qgen_model']}"))
    assert same_build.seconds == pytest.approx(source["qgen_model"]["build_s"]) and same_build.basis == "this CPU"
    by_name = price_step("qgen_model", measured, machine, None, ("source.yaml", "qgen_model@another-version"))
    assert by_name.seconds == pytest.approx(source["qgen_model"]["build_s"])   # that config's step, as its record ran it
    assert price_step("qgen_model", measured, machine, None, ("other.yaml", "qgen_model@another-version")).seconds is None
    assert price_step("qgen_model", measured, machine).seconds is None   # not the row's own config's step
