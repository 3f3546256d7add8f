"""Issue 11 pieces on hand-made cases: the 1:1:1 classifier sampler, silver filtering and weights,
distillation losses, reranking order, the cross-encoder's export and training. Seconds on CPU."""
import math

import numpy as np
import pyarrow as pa
import pytest
import torch

from models.cross_encoder import CrossEncoderModel
from models.losses import ListwiseKLLoss, MarginMSELoss, build_loss
from tasks.rerank.mix import choose_alpha, heads_of, mixed_run, standardised
from tasks.rerank.rerank import rerank_run
from tasks.schemas import GOLD, RUNS
from tasks.silver.classifier import (ClassifierTrainArgs, DevClassification, ShuffledBatches, auc, best_threshold,
                                     classification_metrics, train_classifier)
from tasks.silver.labelling import SCORED, candidates_from_runs, keep_silver, probability_histogram
from tasks.silver.sampling import classifier_pairs, held_out


def _passages():
    rows = [("d1-0", "d1", "paris is the capital of france"), ("d1-1", "d1", "the seine flows through the city"),
            ("d1-2", "d1", "the river is long"), ("d1-3", "d1", "paris again here"),
            ("d2-0", "d2", "what is the largest city"), ("d2-1", "d2", "title text passage"),
            ("d3-0", "d3", "where does the river flow")]
    return pa.table({"pid": [r[0] for r in rows], "doc_id": [r[1] for r in rows], "text": [r[2] for r in rows]})


def _runs(rows):
    return pa.table({"qid": [r[0] for r in rows], "pid": [r[1] for r in rows], "rank": [r[2] for r in rows],
                     "score": [float(-r[2]) for r in rows], "system": ["x"] * len(rows)}, schema=RUNS)


def test_classifier_pairs_are_one_to_one_to_one_and_never_gold_or_answers():
    questions = pa.table({"qid": ["q1", "q2"], "question": ["capital of france", "no gold"],
                          "answers": [["paris"], ["x"]]})
    gold = pa.table({"qid": ["q1"], "pid": ["d1-0"], "relevance": [1]}, schema=GOLD)
    # BM25: gold, an answer-bearing passage, then two clean ones (one below depth)
    bm25 = _runs([("q1", "d1-0", 1), ("q1", "d1-3", 2), ("q1", "d2-0", 3), ("q1", "d2-1", 4)])
    dense = _runs([("q1", "d1-3", 1), ("q1", "d3-0", 2), ("q1", "d2-1", 4)])
    pairs = classifier_pairs(questions, gold, _passages(), bm25, dense, depth=3, seed=1)
    by_source = {p.source: p for p in pairs}
    assert [p.source for p in pairs] == ["gold", "bm25", "dense", "document"]  # q2 has no gold: no pairs
    assert by_source["gold"].label == 1 and all(p.label == 0 for p in pairs[1:])
    assert by_source["bm25"].pid == "d2-0"           # the only clean one in its top 3
    assert by_source["dense"].pid == "d3-0"          # d1-3 holds "paris"; d2-1 is below depth
    assert by_source["document"].pid in {"d1-1", "d1-2"}  # the gold document, not the answer passage
    again = classifier_pairs(questions, gold, _passages(), bm25, dense, depth=3, seed=1)
    assert again == pairs  # seeded draws
    # Without a dense run the dense share is simply absent (1:1 BM25 : document).
    assert [p.source for p in classifier_pairs(questions, gold, _passages(), bm25, None, depth=3)] == \
        ["gold", "bm25", "document"]


def test_held_out_is_a_stable_ten_percent():
    qids = [f"q{i}" for i in range(4000)]
    share = sum(held_out(q, 0.1, 7) for q in qids) / len(qids)
    assert 0.085 < share < 0.115
    assert [held_out(q, 0.1, 7) for q in qids[:50]] == [held_out(q, 0.1, 7) for q in qids[:50]]


def test_silver_keeps_p_at_least_half_not_gold_with_p_squared_weights():
    runs = _runs([("q1", "a", 1), ("q1", "b", 2), ("q1", "c", 3), ("q2", "a", 1)])
    cands = candidates_from_runs(runs, {"q1": "first", "q2": "second"}, "train", top_k=2, known={("q1", "a")})
    assert [(c.qid, c.pid, c.rank) for c in cands] == [("q1", "b", 2), ("q2", "a", 1)]  # gold out, top-2 only
    scored = pa.table({"qid": ["q1", "q1", "q2", "q3"], "query": ["x"] * 4, "pid": ["b", "c", "a", "d"],
                       "rank": [1, 2, 1, 1], "p": [0.5, 0.49, 0.9, 0.2], "source": ["train"] * 4}, schema=SCORED)
    silver = keep_silver(scored, 0.5)
    assert silver.column("pid").to_pylist() == ["b", "a"]  # p >= 0.5 kept, 0.49 dropped
    assert silver.column("weight").to_pylist() == pytest.approx([0.25, 0.81])
    assert [b["pairs"] for b in probability_histogram([0.05, 0.5, 0.95, 1.0])] == [1, 0, 0, 1, 0, 2]


def test_distillation_losses_against_hand_computed_values():
    class Identity(torch.nn.Module):
        similarity_scale = 1.0

    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    p = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    n = torch.tensor([[0.5, 0.0], [0.0, 0.0], [0.0, 0.2], [1.0, 0.0]])  # question-major, N = 2
    teacher = torch.tensor([[3.0, 1.0, 0.0], [2.0, 2.0, -1.0]])
    # student scores: q1 -> [1, 0.5, 0], q2 -> [1, 0.2, 0]
    margin = MarginMSELoss(Identity())
    expected = ((0.5 - 2) ** 2 + (1 - 3) ** 2 + (0.8 - 0) ** 2 + (1 - 3) ** 2) / 4
    assert margin.compute_loss_from_embeddings(q, p, n, teacher_scores=teacher).item() == pytest.approx(expected)

    kl = ListwiseKLLoss(Identity(), temperature=2.0)

    def softmax(xs):
        e = [math.exp(x) for x in xs]
        return [x / sum(e) for x in e]
    total = 0.0
    for s, t in (([1, 0.5, 0], [1.5, 0.5, 0]), ([1, 0.2, 0], [1, 1, -0.5])):
        ps, pt = softmax(s), softmax(t)
        total += sum(a * math.log(a / b) for a, b in zip(pt, ps))
    assert kl.compute_loss_from_embeddings(q, p, n, teacher_scores=teacher).item() == pytest.approx(total / 2, rel=1e-5)
    with pytest.raises(ValueError, match="teacher"):
        margin.compute_loss_from_embeddings(q, p, n)
    assert build_loss("margin_mse", Identity()).uses_teacher_scores


def _mix_case():
    """q1's head a, b, c (first-stage scores 3, 2, 0) reranked with logits 0, 1, 5; d below depth."""
    first = pa.table({"qid": ["q1"] * 4 + ["q2"] * 2, "pid": ["a", "b", "c", "d", "e", "f"], "rank": [1, 2, 3, 4, 1, 2],
                      "score": [3.0, 2.0, 0.0, -1.0, 1.0, 0.5], "system": ["x"] * 6}, schema=RUNS)
    logit = {"a": 0.0, "b": 1.0, "c": 5.0, "d": 99.0, "e": 0.0, "f": 2.0}
    reranked = rerank_run(first, {"q1": "Q1", "q2": "Q2"}, {p: p for p in logit},
                          lambda pairs: [logit[text] for _, text in pairs], depth=3, system="r")
    return first, reranked


def test_a_mix_orders_the_head_by_weighted_z_scores_and_keeps_the_tail():
    first, reranked = _mix_case()
    heads = heads_of(first, reranked, depth=3)
    assert heads["q1"].pids == ["a", "b", "c"] and heads["q1"].tail == ["d"]
    assert heads["q1"].first == pytest.approx(standardised(np.array([3.0, 2.0, 0.0])))
    assert heads["q1"].logit == pytest.approx(standardised(np.array([0.0, 1.0, 5.0])))

    def order(alpha):
        run = mixed_run(heads, alpha, "m")
        assert run.column("score").to_pylist()[:4] == sorted(run.column("score").to_pylist()[:4], reverse=True)
        return [p for q, p in zip(run.column("qid").to_pylist(), run.column("pid").to_pylist()) if q == "q1"]
    assert order(0.0) == ["a", "b", "c", "d"]          # the first stage's order
    assert order(1.0) == ["c", "b", "a", "d"]          # the classifier's; d stays below, its logit unused
    # z(first) = 1.069, 0.267, -1.336 and z(logit) = -0.926, -0.463, 1.389: c passes b at alpha 0.464,
    # a at 0.510; b passes a at 0.634
    assert order(0.45) == ["a", "b", "c", "d"]
    assert order(0.5) == ["a", "c", "b", "d"]
    assert order(0.6) == ["c", "a", "b", "d"]
    assert order(0.7) == ["c", "b", "a", "d"]
    run = mixed_run(heads, 0.0, "m")
    assert [p for q, p in zip(run.column("qid").to_pylist(), run.column("pid").to_pylist()) if q == "q2"] == ["e", "f"]
    assert set(run.column("system").to_pylist()) == {"m"}


def test_the_mix_weight_is_the_best_on_the_tuning_questions_and_ties_go_to_the_earlier():
    first, reranked = _mix_case()
    heads = heads_of(first, reranked, depth=3)

    def c_first(run):  # 1 when q1's top passage is c
        return float(run.filter(pa.compute.equal(run.column("rank"), 1)).column("pid").to_pylist()[0] == "c")
    alpha, curve = choose_alpha({"q1": heads["q1"]}, c_first, alphas=[0.0, 0.5, 0.7, 0.9, 1.0])
    assert alpha == 0.7 and curve == {0.0: 0.0, 0.5: 0.0, 0.7: 1.0, 0.9: 1.0, 1.0: 1.0}


def test_a_mix_refuses_a_rerank_that_lacks_the_head():
    first, reranked = _mix_case()
    with pytest.raises(ValueError, match=r"question 'q1': passage 'd' is in the first stage's top 4 but not in the rerank"):
        heads_of(first, reranked.filter(pa.compute.not_equal(reranked.column("pid"), "d")), depth=4)



def test_a_mix_refuses_a_rerank_of_another_depth(tmp_path):
    """Below its depth a reranked run keeps the first stage's ranks, so a deeper head would read
    them as logits without a passage missing: the stage compares the depths instead."""
    from storage import Artifact
    from tasks.rerank.stages import MixParams, build_mix

    first, reranked = _mix_case()
    params = MixParams(system="m", run_stage="search:x", rerank_stage="rerank:r", depth=4, alphas=[0.0, 1.0],
                       tune_split="dev", tune_k=1, tune_metric="auto", match_type="string")
    inputs = {"search:x": Artifact("dense_runs", "f1", tmp_path),
              "rerank:r": Artifact("reranked_runs", "r3", tmp_path, manifest={"parameters": {"depth": 3}})}
    with pytest.raises(ValueError, match=r"m: mixes a head of 4 but rerank:r \(r3\) reranked 3 passages a question"):
        build_mix(params, inputs, tmp_path / "out")
    assert heads_of(first, reranked, depth=4)["q1"].pids == ["a", "b", "c", "d"]  # what the check prevents

def test_rerank_orders_the_head_by_score_and_keeps_the_tail():
    run = _runs([("q1", "a", 1), ("q1", "b", 2), ("q1", "c", 3), ("q1", "d", 4), ("q2", "e", 1), ("q2", "f", 2)])
    logit = {"a": 0.1, "b": 2.0, "c": 1.0, "d": 9.0, "e": 0.0, "f": 0.0}
    seen = []

    def scorer(pairs):
        seen.extend(pairs)
        return [logit[text] for _, text in pairs]
    out = rerank_run(run, {"q1": "Q1", "q2": "Q2"}, {p: p for p in logit}, scorer, depth=3, system="r")
    rows = list(zip(out.column("qid").to_pylist(), out.column("pid").to_pylist(), out.column("rank").to_pylist()))
    # q1: head a, b, c reordered b, c, a; d (below depth) stays after, though its logit is high
    assert rows == [("q1", "b", 1), ("q1", "c", 2), ("q1", "a", 3), ("q1", "d", 4), ("q2", "e", 1), ("q2", "f", 2)]
    assert ("Q1", "d") not in seen and len(seen) == 5
    scores = out.column("score").to_pylist()
    assert scores[:4] == sorted(scores[:4], reverse=True)  # monotone with the new ranks


def test_classification_metrics_and_auc_by_hand():
    labels, scores = [1, 0, 1, 0, 0], [0.9, 0.8, 0.4, 0.3, 0.4]
    # positives 0.9 and 0.4 against negatives 0.8, 0.3, 0.4: wins 3 + 1 + tie 0.5 of 6
    assert auc(labels, scores) == pytest.approx((3 + 1 + 0.5) / 6)
    m = classification_metrics(labels, [s >= 0.5 for s in scores], scores)
    assert (m["accuracy"], m["precision"], m["recall"]) == pytest.approx((0.6, 0.5, 0.5))
    assert m["f1"] == pytest.approx(0.5)
    assert best_threshold(labels, scores) == pytest.approx(0.9)
    assert math.isnan(auc([1, 1], [0.1, 0.2]))


@pytest.fixture(scope="module")
def cross_encoder(checkpoint):
    return CrossEncoderModel.from_base(str(checkpoint), max_length=48)


def test_export_loads_in_sentence_transformers_with_the_same_scores(cross_encoder, tmp_path):
    from sentence_transformers import CrossEncoder

    pairs = [("what is the capital of france", "paris is the capital"), ("where does the seine flow", "the river"),
             ("who", "the largest city of the title passage text")]
    ours = cross_encoder.score(pairs, batch_size=2, device="cpu")
    folder = cross_encoder.save_pretrained(tmp_path / "ce")
    theirs = CrossEncoder(str(folder), device="cpu").predict(pairs, batch_size=2, show_progress_bar=False)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    reloaded = CrossEncoderModel.from_pretrained(folder)
    np.testing.assert_allclose(reloaded.score(pairs, device="cpu"), ours, atol=1e-6)
    assert reloaded.max_length == 48

def test_bf16_scoring_autocasts_on_the_cpu_and_stays_near_fp32(cross_encoder):
    pairs = [("what is the capital of france", "paris is the capital"), ("where does the seine flow", "the river")]
    dtypes = []
    first_linear = next(m for m in cross_encoder.modules() if isinstance(m, torch.nn.Linear))
    hook = first_linear.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    try:
        fp32 = cross_encoder.logits(pairs, device="cpu")
        bf16 = cross_encoder.logits(pairs, device="cpu", bf16=True)
    finally:
        hook.remove()
    assert dtypes == [torch.float32, torch.bfloat16]  # the products ran in bf16, on the CPU too
    assert bf16.dtype == np.float32
    # bf16 keeps 8 significant bits: a tiny model's logits move by a few units of 2^-8 of their size
    np.testing.assert_allclose(bf16, fp32, atol=0.05 * max(1.0, float(np.abs(fp32).max())))


def _toy_task():
    positives = [("capital of france", "paris is the capital of france"), ("where does the seine flow", "the seine flows through paris")]
    negatives = [("capital of france", "the river is long"), ("where does the seine flow", "what is the largest city")]
    pairs = (positives + negatives) * 4
    return pairs, ([1] * 2 + [0] * 2) * 4


def test_classifier_training_learns_and_resumes_exactly(checkpoint, tmp_path):
    pairs, labels = _toy_task()
    args = ClassifierTrainArgs(lr=1e-3, batch_size=4, max_steps=6, warmup_ratio=0.0, checkpoint_every=3, seed=3)

    torch.manual_seed(0)
    full = CrossEncoderModel.from_base(str(checkpoint), max_length=32)
    before = full.score(pairs[:4], device="cpu")
    result = train_classifier(full, pairs, labels, args, tmp_path / "full", device="cpu")
    after = full.score(pairs[:4], device="cpu")
    assert result["history"][-1]["loss"] < result["history"][0]["loss"]
    assert (after[:2] - after[2:]).mean() > (before[:2] - before[2:]).mean()  # positives pulled above negatives

    # A run killed after its step-3 checkpoint: drop what came later, start again on the folder.
    import shutil

    shutil.rmtree(tmp_path / "full" / "checkpoints" / "step-0000006")
    torch.manual_seed(1)  # a different start: everything must come from the checkpoint
    resumed = CrossEncoderModel.from_base(str(checkpoint), max_length=32)
    result = train_classifier(resumed, pairs, labels, args, tmp_path / "full", device="cpu")
    assert result["resumed_from"].endswith("step-0000003")
    for a, b in zip(full.state_dict().values(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b)


def test_shuffled_batches_state_continues_mid_epoch():
    a = ShuffledBatches(10, 3, seed=1)
    it = iter(a)
    first = [next(it), next(it)]
    b = ShuffledBatches(10, 3, seed=1)
    b.load_state_dict({"epoch": 0, "position": 1, "n": 10, "batch_size": 3})
    assert list(b)[0] == first[1]
    with pytest.raises(ValueError, match="sampler state"):
        b.load_state_dict({"epoch": 0, "position": 0, "n": 11, "batch_size": 3})


class _FixedScores:
    def __init__(self, p):
        self.p = np.asarray(p, dtype=np.float64)

    def score(self, pairs, batch_size=64):
        return self.p[:len(pairs)]


def test_the_dev_metric_that_picks_the_classifier_is_auc_so_a_base_rate_model_cannot_win():
    labels = [1, 0, 0, 1, 0, 0] * 10                      # base rate 1/3, like 1:1:1 negatives
    pairs = [("q", "p")] * len(labels)
    base_rate = _FixedScores([1 / 3] * len(labels))       # calibrated, ranks nothing
    ranking = _FixedScores([0.9 if y else 0.6 for y in labels])  # ranks perfectly, over-confident
    by_auc, by_loss = DevClassification(pairs, labels), DevClassification(pairs, labels, primary="log_loss")
    flat, sharp = by_auc(base_rate), by_auc(ranking)
    assert flat["log_loss"] < sharp["log_loss"]           # log loss prefers the base-rate model ...
    assert (flat["auc"], sharp["auc"]) == (0.5, 1.0)      # ... AUC the one that separates the classes
    assert by_auc.primary_metric == "auc" and by_auc.greater_is_better
    assert by_loss.primary_metric == "log_loss" and not by_loss.greater_is_better
    with pytest.raises(ValueError, match="auc or log_loss"):
        DevClassification(pairs, labels, primary="f1")
