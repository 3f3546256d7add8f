"""The evaluation report's figures (issue 26): the numbers behind each curve (against the metrics
table and the trainer's history), valid PNGs, and a report.md that links every one of them."""
from __future__ import annotations

import base64
import json
import random
import re
import struct

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from storage import Artifact
from storage.parquet import write_table
from tasks.evaluation import figures
from tasks.evaluation.bootstrap import compare_systems
from tasks.evaluation.evaluate import evaluate_runs
from tasks.evaluation.ir_metrics import ir_metrics
from tasks.evaluation.qa_metrics import qa_accuracy_metrics
from tasks.evaluation.stages import EvaluateParams, build_evaluation
from tasks.schemas import GOLD, PASSAGES, QUESTION_RESULTS, QUESTIONS, RUNS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LINK = re.compile(r"!\[[^\]]*\]\(([^)]+)\)")


# ---------------------------------------------------------------- helpers

def png_size(path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


def assert_real_png(path, min_bytes=8_000):
    """A PNG that decodes, of a plausible size, with something drawn on it (not one flat colour)."""
    from matplotlib.image import imread

    assert path.is_file() and path.stat().st_size >= min_bytes, path
    width, height = png_size(path)
    assert 300 <= width <= 2000 and 100 <= height <= 2000, (path, width, height)
    pixels = imread(path)
    assert pixels.shape[:2] == (height, width) and float(pixels[..., :3].std()) > 0.05


def questions_table(rows):
    """rows: (qid, answers, split)"""
    n = len(rows)
    return pa.table({"qid": [r[0] for r in rows], "question": ["?"] * n, "answers": [r[1] for r in rows],
                     "split": [r[2] for r in rows], "source": ["toy"] * n, "doc_id": [None] * n,
                     "answer_spans": [[]] * n}, schema=QUESTIONS)


def results_table(rows):
    """rows: (system, qid, split, first_hit_rank or None)"""
    return pa.table([pa.array([r[i] for r in rows], QUESTION_RESULTS.field(i).type) for i in range(4)],
                    schema=QUESTION_RESULTS)


def random_results(seed=0, systems=("a", "b", "c"), questions=60):
    rng = random.Random(seed)
    splits = ["train", "dev", "test"]
    return results_table([(s, f"q{i}", splits[i % 3], rng.choice([None, None, *range(1, 130)]))
                          for s in systems for i in range(questions)])


def toy_qa(depth=120, questions=30, seed=0):
    """Questions whose answer word sits in one passage each, and two systems' runs that place it
    at known ranks (some beyond 100, some nowhere): (questions, passages, gold, runs)."""
    rng = random.Random(seed)
    pids = [f"p{i}" for i in range(200)]
    passages = pa.table({"pid": pids, "doc_id": [f"d{i}" for i in range(200)], "title": pids,
                         "text": [f"filler text number {i} answer{i}" for i in range(200)],
                         "chunk_index": [0] * 200, "n_words": [5] * 200, "char_start": [0] * 200,
                         "char_end": [30] * 200}, schema=PASSAGES)
    splits = ["dev", "test"]
    qs = questions_table([(f"q{i}", [f"answer{i}"], splits[i % 2]) for i in range(questions)])
    gold = pa.table({"qid": [f"q{i}" for i in range(questions)], "pid": [f"p{i}" for i in range(questions)],
                     "relevance": [1] * questions}, schema=GOLD)
    rows = {"qid": [], "pid": [], "rank": [], "score": [], "system": []}
    for system in ("good", "bad"):
        for i in range(questions):
            others = [p for p in pids if p != f"p{i}"]
            rng.shuffle(others)
            ranked = others[:depth]
            # the answer's rank: some past 100 (not a hit at any k <= 100), some nowhere
            at = [1, 1, 2, 5, 20, 64, 100, 101, None][i % 9] if system == "good" else [3, 50, 99, None][i % 4]
            if at is not None and at <= depth:
                ranked[at - 1] = f"p{i}"
            for r, pid in enumerate(ranked, 1):
                rows["qid"].append(f"q{i}"), rows["pid"].append(pid), rows["rank"].append(r)
                rows["score"].append(float(-r)), rows["system"].append(system)
    runs = pa.table(rows, schema=RUNS)
    return qs, passages, gold, [runs.filter(pc.equal(runs.column("system"), s)) for s in ("good", "bad")]


def history_record(dev=True):
    """What train_bi_encoder writes to history.json: 8 steps, the dev metric at steps 0 (the
    untrained model), 4 and 8, step 4 kept."""
    history = [{"step": s, "loss": 2.0 / s, "lr": 1e-4} for s in range(1, 9)]
    record = {"history": history, "best_step": 8, "best_metric": None, "dev_curve": []}
    if dev:
        for step, value in ((4, 0.6), (8, 0.55)):
            history[step - 1].update(dev_metric=value, dev_metrics={"dev_top1": value})
        record.update(dev_curve=[[0, 0.3], [4, 0.6], [8, 0.55]], best_step=4, best_metric=0.6, start_metric=0.3)
    return record


def artifact(tmp_path, stage, tables=(), files=None, manifest=None):
    path = tmp_path / "store" / stage.replace(":", "_")
    path.mkdir(parents=True)
    for name, table in tables:
        write_table(path, table, name=name)
    for relative, text in (files or {}).items():
        (path / relative).parent.mkdir(parents=True, exist_ok=True)
        (path / relative).write_text(text)
    return Artifact(stage, "v1", path, manifest or {})


# ---------------------------------------------------------------- data

@pytest.mark.parametrize("split", ["all", "train", "dev", "test"])
def test_the_topk_curve_is_the_metrics_tables_top_k_accuracy_at_every_k(split):
    results = random_results()
    curves = figures.topk_accuracy_curves(results, split)
    assert list(curves) == ["a", "b", "c"] and all(len(c) == figures.CURVE_K for c in curves.values())
    ks = list(range(1, figures.CURVE_K + 1))
    metrics = qa_accuracy_metrics(results, ks).to_pylist()
    table = {(m["system"], m["k"]): m["value"] for m in metrics if m["metric"] == "top_k_accuracy" and m["split"] == split}
    for system, curve in curves.items():
        assert curve == [table[(system, k)] for k in ks]  # exactly: the same counts over the same questions
        assert curve == sorted(curve) and 0 <= curve[0] <= curve[-1] <= 1


def test_the_curve_of_an_evaluation_reaches_k_100_even_when_its_table_stops_earlier():
    questions, passages, gold, runs = toy_qa()
    short, *_ = evaluate_runs(questions, passages, gold, runs, title="t", ks=[1, 5])
    full, metrics, _ = evaluate_runs(questions, passages, gold, runs, title="t", ks=[1, 5, 20, 100])
    assert short.equals(full)  # first hits are looked for down to rank 100 either way
    curves = figures.topk_accuracy_curves(full, "all")
    table = {(m["system"], m["k"], m["split"]): m["value"] for m in metrics.to_pylist() if m["metric"] == "top_k_accuracy"}
    for split in ("all", "dev", "test"):
        for system, curve in figures.topk_accuracy_curves(full, split).items():
            for k in (1, 5, 20, 100):
                assert curve[k - 1] == table[(system, k, split)]
    ranks = {q: r for s, q, r in zip(full.column("system").to_pylist(), full.column("qid").to_pylist(),
                                     full.column("first_hit_rank").to_pylist()) if s == "good"}
    assert 100 in ranks.values() and max(r for r in ranks.values() if r) == 100  # 101 is past the depth
    assert curves["good"][99] == sum(r is not None for r in ranks.values()) / len(ranks) > curves["good"][98]


def test_the_recall_curve_of_a_qrels_only_evaluation_is_trec_evals_recall_at_every_k():
    rng = random.Random(3)
    splits = {f"q{i}": ("dev", "test")[i % 2] for i in range(24)}
    questions = questions_table([(q, [], s) for q, s in splits.items()])
    gold_rows = []
    for q in splits:
        for pid in rng.sample(range(150), rng.randint(1, 6)):
            gold_rows.append((q, f"p{pid}", rng.choice([0, 1, 2])))  # graded; 0 is judged not relevant
    gold = pa.table({"qid": [r[0] for r in gold_rows], "pid": [r[1] for r in gold_rows],
                     "relevance": [r[2] for r in gold_rows]}, schema=GOLD)
    rows = []
    for system in ("s1", "s2"):
        for q in splits:
            if rng.random() < 0.15:
                continue  # retrieved nothing: counts 0
            for r, pid in enumerate(rng.sample(range(150), 120), 1):
                rows.append((q, f"p{pid}", r, 0.0, system))
    # a reranker of the test questions only, shallower than 100
    rows += [(q, f"p{pid}", r, 0.0, "rerank") for q in splits if splits[q] == "test"
             for r, pid in enumerate(rng.sample(range(150), 30), 1)]
    runs_all = pa.table([pa.array([r[i] for r in rows], RUNS.field(i).type) for i in range(5)], schema=RUNS)
    runs = [runs_all.filter(pc.is_in(runs_all.column("system"), pa.array(names)))
            for names in (["s1", "s2"], ["rerank"])]
    ks = list(range(1, 101))
    for split in ("all", "dev", "test"):
        curves = figures.recall_curves(runs, questions, gold, split)
        assert set(curves) == ({"s1", "s2"} if split == "dev" else {"s1", "s2", "rerank"})
        for run in runs:
            # what the evaluation reports (ir_metrics on the run's own splits), at every k
            from tasks.evaluation.scope import questions_of_run

            _, run_gold = questions_of_run(run, questions, gold, splits)
            table = ir_metrics(run, run_gold, splits, p_at=(), recall_at=ks, ndcg_at=(), mrr_at=()).to_pylist()
            for system in set(run.column("system").to_pylist()) & set(curves):
                expected = [next(m["value"] for m in table if (m["system"], m["k"], m["split"]) == (system, k, split))
                            for k in ks]
                assert curves[system] == pytest.approx(expected, abs=1e-9)
        if "rerank" in curves:
            assert curves["rerank"][29] == curves["rerank"][99] > 0  # nothing retrieved past 30


def test_the_training_series_is_the_history():
    record = history_record()
    series = figures.training_series(json.loads(json.dumps(record)))  # as read back from history.json
    assert series["steps"] == [h["step"] for h in record["history"]] == list(range(1, 9))
    assert series["loss"] == [h["loss"] for h in record["history"]]
    assert series["dev_steps"] == [0, 4, 8] and series["dev"] == [0.3, 0.6, 0.55]  # the untrained model too
    assert series["dev_metric"] == "dev_top1" and series["best_step"] == 4
    plain = figures.training_series(history_record(dev=False))
    assert plain["dev"] == [] and plain["dev_metric"] is None and plain["best_step"] is None
    # a record without dev_curve: the dev values stored on the history entries
    legacy = {k: v for k, v in record.items() if k != "dev_curve"}
    assert figures.training_series(legacy)["dev_steps"] == [4, 8]


# ---------------------------------------------------------------- drawing

def test_each_figure_is_a_real_png(tmp_path):
    curves = figures.topk_accuracy_curves(random_results(systems=[f"system-{i}" for i in range(12)]))
    assert_real_png(figures.plot_curves(curves, tmp_path / "topk.png", ylabel="top-k accuracy", title="t"))
    assert_real_png(figures.plot_training(figures.training_series(history_record()), tmp_path / "train.png", title="t"))
    assert_real_png(figures.plot_training(figures.training_series(history_record(dev=False)), tmp_path / "plain.png",
                                          title="t"))
    long = {"history": [{"step": s, "loss": 1 / s + 0.01 * (s % 7), "lr": 1e-4} for s in range(1, 400)]}
    assert_real_png(figures.plot_training(figures.training_series(long), tmp_path / "long.png", title="t"))
    rows = compare_systems(random_results(), "a", "b", "test", [1, 20, 100], samples=200)
    rows += compare_systems(random_results(), "c", "b", "test", [20], samples=200)
    chart = figures.plot_comparisons(rows, tmp_path / "comparisons.png")
    assert_real_png(chart, min_bytes=4_000)
    # qrels comparisons (BEIR: nDCG@10) are labelled with the metrics table's names
    ndcg = [{**r, "metric": "ndcg_cut", "k": 10} for r in rows[:2]]
    assert [figures._compared(r) for r in ndcg + rows[:1]] == ["nDCG@10", "nDCG@10", "top-1"]
    assert_real_png(figures.plot_comparisons(ndcg, tmp_path / "ndcg.png"), min_bytes=4_000)
    assert png_size(chart)[1] < png_size(tmp_path / "topk.png")[1]  # a small chart
    for png in tmp_path.glob("*.png"):  # small enough for the UI summary to embed
        from flows.ui_artifacts import MAX_IMAGE_BYTES

        assert png.stat().st_size < MAX_IMAGE_BYTES


def test_the_trainers_loss_curve_is_drawn_by_the_shared_helpers(tmp_path):
    from tasks.training.loss_curve import plot_loss_curve

    plot_loss_curve(history_record()["history"], tmp_path / "loss_curve.png")
    assert_real_png(tmp_path / "loss_curve.png")


# ---------------------------------------------------------------- the evaluate stage

def evaluation_inputs(tmp_path):
    questions, passages, gold, runs = toy_qa()
    inputs = {"ingest_questions": artifact(tmp_path, "ingest_questions", [("questions", questions)]),
              "chunk": artifact(tmp_path, "chunk", [(None, passages)]),
              "link_gold": artifact(tmp_path, "link_gold", [(None, gold)]),
              "search:good": artifact(tmp_path, "search:good", [(None, runs[0])]),
              "search:bad": artifact(tmp_path, "search:bad", [(None, runs[1])]),
              "train:good": artifact(tmp_path, "train:good", files={"training/history.json": json.dumps(history_record())}),
              "pretrain:cc": artifact(tmp_path, "pretrain:cc",
                                      files={"training/history.json": json.dumps(history_record(dev=False))}),
              "train:old": artifact(tmp_path, "train:old")}  # no record kept: no figure, no failure
    params = EvaluateParams(title="toy", ks=[1, 5, 20, 100], match_type="string", ignore_identical_ids=False,
                            runs=["search:good", "search:bad"], compare=[("good", "bad")], compare_split="test",
                            compare_ks=[1, 20, 100], bootstrap_samples=200)
    return params, inputs


def test_the_report_links_every_figure_and_every_figure_exists(tmp_path):
    from flows.ui_artifacts import embed_images

    params, inputs = evaluation_inputs(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    build_evaluation(params, inputs, out)
    report = (out / "report.md").read_text()
    linked = LINK.findall(report)
    assert sorted(linked) == sorted(f"figures/{p.name}" for p in (out / "figures").glob("*.png"))
    assert set(linked) == {"figures/top_k_accuracy.png", "figures/comparisons.png",
                           "figures/training-train-good.png", "figures/training-pretrain-cc.png"}
    for link in linked:
        assert_real_png(out / link, min_bytes=4_000)
    assert report.index("## Top-k accuracy curve") < report.index("## Paired comparisons") < report.index(
        "## Training curves")
    assert "the test questions" in report and "kept step 4 (0.6000)" in report
    # The Prefect report artifact carries them inline: the UI cannot read the store's files.
    embedded = embed_images(report, out)
    assert embedded.count("](data:image/png;base64,") == len(linked) and "](figures/" not in embedded


def test_a_qrels_only_report_draws_recall_at_k(tmp_path):
    params, inputs = evaluation_inputs(tmp_path)
    questions = inputs["ingest_questions"].read_table("questions")
    no_answers = questions.set_column(2, "answers", pa.array([[]] * questions.num_rows, pa.list_(pa.string())))
    inputs["ingest_questions"] = artifact(tmp_path, "beir_questions", [("questions", no_answers)])
    params = params.model_copy(update={"compare": []})  # comparisons need answer matches
    out = tmp_path / "out"
    out.mkdir()
    build_evaluation(params, inputs, out)
    report = (out / "report.md").read_text()
    assert "## Recall@k curve" in report and "figures/recall_at_k.png" in LINK.findall(report)
    assert "figures/comparisons.png" not in report
    assert_real_png(out / "figures" / "recall_at_k.png")


def test_embedding_keeps_links_it_must_not_follow(tmp_path):
    from flows.ui_artifacts import MAX_IMAGE_BYTES, embed_images

    (tmp_path / "a.png").write_bytes(PNG_SIGNATURE + b"x")
    (tmp_path / "big.png").write_bytes(b"x" * (MAX_IMAGE_BYTES + 1))
    (tmp_path.parent / "outside.png").write_bytes(PNG_SIGNATURE)
    text = "![a](a.png) ![b](big.png) ![c](../outside.png) ![d](missing.png) ![e](https://x.org/e.png)"
    data = base64.b64encode(PNG_SIGNATURE + b"x").decode()
    assert embed_images(text, tmp_path) == f"![a](data:image/png;base64,{data}) " + text.split(" ", 1)[1]


def test_the_evaluate_stage_reads_every_trained_models_record(shared_data):
    from flows.registry import plan_for
    from tasks.config import PROJECT_ROOT, load_config

    plan = plan_for(load_config(PROJECT_ROOT / "configs" / "demo.yaml"))
    evaluate = plan["evaluate"]
    trained = {s.name for s in plan if s.name.startswith(("train:", "pretrain:"))}
    assert trained >= {"train:minilm-dpr", "train:stage1", "train:two-stage"}
    assert trained <= set(evaluate.inputs) and evaluate.code_version == "4"
