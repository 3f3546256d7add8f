"""Embedding fusion (paper 003 section 4.4): scaled concatenation, hand-computed rankings, dev-only
tuning of the coefficients, alignment errors, config checks and the fusion:NAME stage (seconds, no
models)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from storage import ArtifactStore, write_table
from tasks.compute.embeddings import embeddings_table, query_vectors_table
from tasks.compute.search import QUERY_VECTORS
from tasks.engine import NoParams, Stage, run_stage
from tasks.fusion.embedding import (align_vectors, fuse_vectors, fused_passage_index, retrieve, rows_in_order,
                                    tune_coefficients)
from tasks.fusion.stages import FusionConfig
from tasks.fusion.stages import stages as fusion_stages
from tasks.schemas import GOLD, QUESTIONS, RUNS

# A hand-made 2-model example over passages a, b, c (model A and model B, two dimensions each).
PIDS = ["a", "b", "c"]
P_A = np.array([[3, 1], [2, 5], [0, 7]], np.float32)
P_B = np.array([[0, 0], [1, 2], [4, 2]], np.float32)
# q1: A scores a 3, b 2, c 0; B scores a 0, b 2.5, c 4. With coefficient w on B, a scores 3,
# b 2 + 2.5w, c 4w: a comes first for w < 0.4, b for 0.4 < w < 4/3, c for w > 4/3.
# q3 asks the same (same vectors); in the stage test it is a test question whose gold disagrees.
QIDS = ["q1", "q3"]
Q_A = np.array([[1, 0], [1, 0]], np.float32)
Q_B = np.array([[0.5, 1], [0.5, 1]], np.float32)
GRID = (0.0, 0.25, 0.5, 1.0, 2.0)


def ranking(run: pa.Table, qid: str) -> list[str]:
    rows = sorted((r["rank"], r["pid"]) for r in run.to_pylist() if r["qid"] == qid)
    return [pid for _, pid in rows]


def top1_accuracy(gold: dict[str, str]):
    """Share of the run's questions whose rank-1 passage is their gold one (a stand-in tune metric)."""
    def score(run: pa.Table) -> float:
        qids = set(run["qid"].to_pylist())
        return sum(ranking(run, q)[0] == gold[q] for q in qids) / len(qids)
    return score


# ---------------------------------------------------------------- fusing vectors
def test_fused_scores_are_the_coefficient_weighted_sum_of_model_scores():
    rng = np.random.default_rng(0)
    dims, coefs = (4, 6, 3), (1.0, 0.5, 2.0)
    passages = [rng.normal(size=(20, d)).astype(np.float32) for d in dims]
    queries = [rng.normal(size=(5, d)).astype(np.float32) for d in dims]
    fused_q = fuse_vectors(queries, coefs)
    assert fused_q.shape == (5, sum(dims)) and fused_q.dtype == np.float32
    expected = sum(c * q @ p.T for c, q, p in zip(coefs, queries, passages))
    got = fused_q @ fuse_vectors(passages, [1.0] * 3).T
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # One FAISS retrieval over the fused index returns exactly those scores, best first.
    pids, qids = [f"p{i}" for i in range(20)], [f"q{i}" for i in range(5)]
    run = retrieve(fused_passage_index(passages), pids, queries, qids, coefs, k=20)
    assert run.schema.equals(RUNS) and run.num_rows == 100
    for i, q in enumerate(qids):
        order = [f"p{j}" for j in np.argsort(-expected[i], kind="stable")]
        assert ranking(run, q) == order
        scores = {r["pid"]: r["score"] for r in run.to_pylist() if r["qid"] == q}
        assert [scores[f"p{j}"] for j in range(20)] == pytest.approx(expected[i].tolist(), rel=1e-5, abs=1e-5)


def test_fuse_vectors_checks_its_inputs():
    with pytest.raises(ValueError, match="2 vector sets but 1 coefficients"):
        fuse_vectors([P_A, P_B], [1.0])
    with pytest.raises(ValueError, match="different row counts"):
        fuse_vectors([P_A, P_B[:2]], [1.0, 1.0])


def test_hand_made_fused_ranking_differs_from_each_model():
    index = fused_passage_index([P_A, P_B])
    only_a = retrieve(fused_passage_index([P_A]), PIDS, [Q_A], QIDS, [1.0], k=3)
    only_b = retrieve(fused_passage_index([P_B]), PIDS, [Q_B], QIDS, [1.0], k=3)
    fused = retrieve(index, PIDS, [Q_A, Q_B], QIDS, [1.0, 1.0], k=3, system="ens")
    # q1 by hand: a = 1*3 + 1*0 = 3, b = 1*2 + 1*2.5 = 4.5, c = 1*0 + 1*4 = 4.
    assert ranking(only_a, "q1") == ["a", "b", "c"]
    assert ranking(only_b, "q1") == ["c", "b", "a"]
    assert ranking(fused, "q1") == ["b", "c", "a"]
    assert {r["pid"]: r["score"] for r in fused.to_pylist() if r["qid"] == "q1"} == pytest.approx(
        {"a": 3.0, "b": 4.5, "c": 4.0})
    assert set(fused["system"].to_pylist()) == {"ens"}
    # Coefficient 0.5 on B: a = 3, b = 2 + 0.5 * 2.5 = 3.25, c = 0.5 * 4 = 2.
    assert ranking(retrieve(index, PIDS, [Q_A, Q_B], QIDS, [1.0, 0.5], k=3), "q1") == ["b", "a", "c"]


# ---------------------------------------------------------------- tuning
@pytest.mark.parametrize("gold,coefficient", [
    ("c", 2.0),    # c first needs 4w > 3 and 4w > 2 + 2.5w: w > 4/3, only 2.0 on the grid
    ("b", 1.0),    # b first for 0.4 < w < 4/3: 0.5 and 1.0 tie, the start (1.0) stays
    ("a", 0.25),   # a first for w < 0.4: 0 and 0.25 tie, 0.25 is the smaller change from 1.0
])
def test_tuning_picks_the_coefficient_the_dev_questions_prefer(gold, coefficient):
    index = fused_passage_index([P_A, P_B])
    chosen, scores = tune_coefficients(index, PIDS, [Q_A[:1], Q_B[:1]], ["q1"], top1_accuracy({"q1": gold}),
                                       k=3, grid=GRID)
    assert chosen == (1.0, coefficient)
    assert scores[chosen] == 1.0 and set(scores) == {(1.0, w) for w in GRID}


def test_tuning_three_models_and_nan_scores():
    index = fused_passage_index([P_A, P_B, P_B])
    # B twice: only the sum of the two B coefficients matters; c first needs it above 4/3.
    chosen, scores = tune_coefficients(index, PIDS, [Q_A[:1], Q_B[:1], Q_B[:1]], ["q1"],
                                       top1_accuracy({"q1": "c"}), k=3, grid=GRID, rounds=3)
    assert chosen == (1.0, 1.0, 1.0) and scores[chosen] == 1.0  # 1 + 1 > 4/3 already: nothing moves
    chosen, _ = tune_coefficients(index, PIDS, [Q_A[:1], Q_B[:1], Q_B[:1]], ["q1"], lambda run: float("nan"),
                                  k=3, grid=GRID)
    assert chosen == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="at least two models"):
        tune_coefficients(index, PIDS, [Q_A[:1]], ["q1"], lambda run: 0.0)


# ---------------------------------------------------------------- alignment
def test_alignment_puts_every_model_in_the_first_models_order():
    pids, (a, b) = align_vectors([("A", PIDS, P_A), ("B", ["c", "a", "b"], P_B[[2, 0, 1]])])
    assert pids == PIDS and np.array_equal(a, P_A) and np.array_equal(b, P_B)
    assert np.array_equal(rows_in_order(PIDS, P_A, ["c", "a"], "A"), P_A[[2, 0]])


def test_alignment_errors_name_the_system_missing_a_pid_or_qid():
    with pytest.raises(ValueError, match=r"B: no vector for 1 pid\(s\), e.g. \['c'\]"):
        align_vectors([("A", PIDS, P_A), ("B", ["a", "b"], P_B[:2])])
    with pytest.raises(ValueError, match=r"A: no vector for 1 pid\(s\) that B has, e.g. \['d'\]"):
        align_vectors([("A", PIDS, P_A), ("B", [*PIDS, "d"], np.vstack([P_B, P_B[:1]]))])
    with pytest.raises(ValueError, match=r"B: no vector for 1 qid\(s\), e.g. \['q9'\]"):
        rows_in_order(QIDS, Q_B, ["q1", "q9"], "B", "qid")
    with pytest.raises(ValueError, match="B: the same pid has several vectors"):
        align_vectors([("A", PIDS, P_A), ("B", ["a", "a", "b"], P_B)])
    with pytest.raises(ValueError, match="B: 2 pids for 3 vectors"):
        align_vectors([("A", PIDS, P_A), ("B", ["a", "b"], P_B)])


# ---------------------------------------------------------------- configuration
def test_config_refuses_bm25_and_repeats_in_an_embedding_fusion():
    with pytest.raises(ValueError, match="fusion 'ens': embedding fusion concatenates dense embeddings and run 'bm25'"):
        FusionConfig(name="ens", method="embedding", runs=["A", "bm25"])
    with pytest.raises(ValueError, match="lists a system twice"):
        FusionConfig(name="ens", method="embedding", runs=["A", "A"])
    with pytest.raises(ValueError, match="grid is for method embedding"):
        FusionConfig(name="lin", runs=["A", "bm25"], grid=[0.5])
    FusionConfig(name="lin", runs=["A", "bm25"])  # linear and rrf still fuse BM25


def test_a_config_file_with_bm25_in_an_embedding_fusion_names_file_and_field(tmp_path):
    from tasks.config import ConfigError, load_config

    path = tmp_path / "ens.yaml"
    path.write_text("name: ens\ndata: {squad: {path: a.json}}\n"
                    "fusion: [{name: ens, method: embedding, runs: [zero-shot, bm25]}]\n")
    with pytest.raises(ConfigError, match=r"ens\.yaml.*fusion\.0.*'bm25' has none"):
        load_config(path)


def _fake(name: str, artifact: str, system: str, runs: bool = False) -> Stage:
    return Stage(name, artifact, "1", (), NoParams(), lambda p, i, o: None, produces_runs=runs,
                 variant={"system": system})


# The dense and BM25 stages of a plan, as the fusion family sees them.
EARLIER = [_fake("bm25_search", "bm25_runs", "bm25", True),
           *(_fake(f"{kind}:{s}", artifact, s, kind == "search")
             for s in ("A", "B") for kind, artifact in (("encode", "embeddings"), ("search", "dense_runs")))]


def _cfg(*fusions: FusionConfig) -> SimpleNamespace:
    """The fields of a PipelineConfig the fusion family reads."""
    return SimpleNamespace(fusion=list(fusions), dense=None, bm25=SimpleNamespace(k=3),
                           evaluation=SimpleNamespace(match_type="string"))


def test_stages_refuse_runs_without_embeddings():
    rrf = FusionConfig(name="rrf", method="rrf", runs=["bm25", "A"])
    ens = FusionConfig(name="ens", method="embedding", runs=["A", "rrf"])
    with pytest.raises(ValueError, match=r"fusion 'ens': embedding fusion needs embeddings, and 'rrf' is not a "
                                         r"dense system \(dense systems: \['A', 'B'\]\)"):
        fusion_stages(_cfg(rrf, ens), EARLIER)


def test_the_stage_reads_encode_and_search_of_each_system_and_is_evaluated():
    (stage,) = fusion_stages(_cfg(FusionConfig(name="ens", method="embedding", runs=["B", "A"], tune_k=1)), EARLIER)
    assert stage.name == "fusion:ens" and stage.artifact == "hybrid_runs" and stage.produces_runs
    assert stage.variant == {"system": "ens"}
    assert stage.inputs == ("ingest_questions", "chunk", "link_gold", "encode:B", "search:B", "encode:A", "search:A")
    hashed = stage.params.hashed()
    assert hashed["systems"] == ["B", "A"] and hashed["k"] == 3 and len(hashed["grid"]) == 41
    assert hashed["tune_split"] == "dev" and hashed["rounds"] == 3


# ---------------------------------------------------------------- the stage, on artifacts in a folder
def _table_artifact(store: ArtifactStore, stage: str, tables: dict[str | None, pa.Table], tag: str):
    def build(out: Path):
        for name, table in tables.items():
            write_table(out, table, name=name)
    return store.materialize(stage, "1", {"tag": tag}, {}, build)


def _inputs(store: ArtifactStore, test_gold: str) -> dict:
    qids = ["q1", "q3"]
    questions = pa.table({"qid": qids, "question": ["?", "?"], "answers": [[], []], "split": ["dev", "test"],
                          "source": ["hand", "hand"], "doc_id": ["", ""], "answer_spans": [[], []]}, schema=QUESTIONS)
    passages = pa.table({"pid": PIDS, "text": ["alpha", "beta", "gamma"]})
    gold = pa.table({"qid": qids, "pid": ["c", test_gold], "relevance": [1, 1]}, schema=GOLD)
    inputs = {"ingest_questions": _table_artifact(store, "ingest_questions", {"questions": questions}, "q"),
              "chunk": _table_artifact(store, "chunk", {None: passages}, "p"),
              "link_gold": _table_artifact(store, "link_gold", {None: gold}, test_gold)}
    for system, p, q in (("A", P_A, Q_A), ("B", P_B, Q_B)):
        # Model B lists its passages and questions in another order: the stage aligns them.
        order = [2, 0, 1] if system == "B" else [0, 1, 2]
        inputs[f"encode:{system}"] = _table_artifact(
            store, f"encode-{system}", {None: embeddings_table([PIDS[i] for i in order], p[order])}, system)
        inputs[f"search:{system}"] = _table_artifact(
            store, f"search-{system}", {None: RUNS.empty_table(),
                                        QUERY_VECTORS: query_vectors_table(qids[::-1], q[::-1])}, system)
    return inputs


# Were the test question tuned on too, gold a would pull w to 0.25 and gold b keep it at 1.0
# (each ties with w = 2 at 0.5, and the smaller change from 1.0 wins).
@pytest.mark.parametrize("test_gold", ["a", "b"])
def test_the_stage_tunes_on_dev_only_and_retrieves_every_question(tmp_path, test_gold):
    store = ArtifactStore(tmp_path / "root")
    fusion = FusionConfig(name="ens", method="embedding", runs=["A", "B"], tune_k=1, grid=list(GRID))
    (stage,) = fusion_stages(_cfg(fusion), EARLIER)
    artifact = run_stage(store, stage, _inputs(store, test_gold))
    stats = artifact.manifest["stats"]
    # q1 (dev, gold c) asks for w = 2 on B whatever the test question's gold is.
    assert stats["coefficients"] == [["A", 1.0], ["B", 2.0]]
    assert stats["tune_metric"] == "ndcg@1" and stats["tune_score"] == 1.0 and stats["tune_split"] == "dev"
    assert {tuple(p["coefficients"]): p["score"] for p in stats["tune_curve"]} == {
        (1.0, 0.0): 0.0, (1.0, 0.25): 0.0, (1.0, 0.5): 0.0, (1.0, 1.0): 0.0, (1.0, 2.0): 1.0}
    assert stats["dim"] == 4 and stats["passages"] == 3 and stats["queries"] == 2
    run = artifact.read_table()
    assert run.schema.equals(RUNS) and set(run["system"].to_pylist()) == {"ens"}
    # Fused with w = 2, for the dev and the test question alike: a 3, b 2 + 2 * 2.5 = 7, c 2 * 4 = 8.
    assert ranking(run, "q1") == ranking(run, "q3") == ["c", "b", "a"]
    scores = {(r["qid"], r["pid"]): r["score"] for r in run.to_pylist()}
    assert scores == pytest.approx({(q, p): s for q in QIDS for p, s in (("a", 3), ("b", 7), ("c", 8))})


def test_the_stage_names_the_system_missing_a_passage_vector(tmp_path):
    store = ArtifactStore(tmp_path / "root")
    inputs = _inputs(store, "a")
    inputs["encode:B"] = _table_artifact(store, "encode-B", {None: embeddings_table(["a", "b"], P_B[:2])}, "short")
    (stage,) = fusion_stages(_cfg(FusionConfig(name="ens", method="embedding", runs=["A", "B"], tune_k=1)), EARLIER)
    with pytest.raises(ValueError, match=r"B: no vector for 1 pid\(s\), e.g. \['c'\]"):
        run_stage(store, stage, inputs)


def test_the_registry_plans_an_embedding_fusion_as_an_evaluated_system(shared_data):
    from flows.registry import plan_for
    from tasks.config import PROJECT_ROOT, PipelineConfig, load_config

    raw = load_config(PROJECT_ROOT / "configs" / "tiny.yaml").model_dump()
    raw["dense"] = {"systems": [{"name": "zs"}, {"name": "tr", "train": {"max_steps": 2}}], "hybrid": {"system": "tr"}}
    raw["fusion"] = [{"name": "ens", "method": "embedding", "runs": ["tr", "zs"]}]
    plan = plan_for(PipelineConfig.model_validate(raw))
    assert plan["fusion:ens"].inputs == ("ingest_questions", "chunk", "link_gold",
                                         "encode:tr", "search:tr", "encode:zs", "search:zs")
    assert "fusion:ens" in plan["evaluate"].params.runs
    assert plan.planned_version("fusion:ens")
    # The hybrid is a system with runs but no embeddings of its own.
    raw["fusion"] = [{"name": "ens", "method": "embedding", "runs": ["tr", "hybrid(tr)"]}]
    with pytest.raises(ValueError, match=r"'hybrid\(tr\)' is not a dense system \(dense systems: \['tr', 'zs'\]\)"):
        plan_for(PipelineConfig.model_validate(raw))
