"""Open-QA inputs end to end through the flow: DPR passage TSVs (passed through the chunk stage as
they are) and questions from NQ-open JSONL / DPR .qa.csv files (answer strings, no gold passages,
evaluated by answer match). Tiny hand-written files: each run takes seconds."""
from __future__ import annotations

import json

import pytest

from flows.pipeline import pipeline
from flows.registry import plan_for
from storage import ArtifactStore
from tasks.config import PROJECT_ROOT, PipelineConfig, load_config
from tasks.errors import InputError

# (id, text, title). Distinct topics; each answer below occurs in exactly one passage. The texts
# are shorter than `chunk.words` would allow only if they were re-chunked: the configs use
# chunk.words = 5, so a chunk stage that re-chunked TSV passages would change pids and texts.
PASSAGES = [
    ("1", "Mount Everest is the highest mountain above sea level, in the Himalayas on the border of Nepal and China.", "Mount Everest"),
    ("2", "Photosynthesis lets green plants turn sunlight, water and carbon dioxide into glucose, using the pigment chlorophyll.", "Photosynthesis"),
    ("3", "Jupiter is the largest planet of the Solar System; its Great Red Spot is a giant storm.", "Jupiter"),
    ("4", 'The violin maker Antonio Stradivari, called "the master", built his instruments in Cremona.', "Antonio Stradivari"),
    ("5", "The Python programming language was created by Guido van Rossum and first released in 1991.", "Python (programming language)"),
    ("6", "The Great Barrier Reef, the world's largest coral reef system, lies off the coast of Queensland.", "Great Barrier Reef"),
    ("7", "Tea is a beverage made by pouring hot water over the cured leaves of Camellia sinensis.", "Tea"),
    ("8", "Chess is a board game for two players, played on a checkered board of 64 squares.", "Chess"),
    ("9", "The Eiffel Tower, a wrought-iron lattice tower in Paris, was designed by the engineer Gustave Eiffel.", "Eiffel Tower"),
]


def _tsv_field(text: str) -> str:
    # DPR's psgs_w100.tsv quotes a text with a quote in it, doubling the quote (csv quoting).
    return '"' + text.replace('"', '""') + '"' if '"' in text else text


def write_dpr_tsv(path, passages=PASSAGES, header="id\ttext\ttitle"):
    lines = [header] + [f"{pid}\t{_tsv_field(text)}\t{title}" for pid, text, title in passages]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# question, answers, pid of the one passage holding an answer (None: no passage does)
DEV = [
    ("in which mountain range is mount everest on the border of nepal and china", ["Himalayas"], "1"),
    ("which pigment do green plants use for photosynthesis", ["chlorophyll"], "2"),
    ("which planet is the farthest from the sun", ["Neptune"], None),  # answer in no passage
]
TEST = [
    ("who created the python programming language", ["Guido van Rossum", "van Rossum"], "5"),
    ("in which city did the violin maker antonio stradivari build his instruments", ["Cremona"], "4"),
]


def qa_config(data_root, qa_files, name="qa-tiny", dpr_passages=("psgs.tsv",)) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "name": name,
        "data": {"data_root": str(data_root), "dpr_passages": list(dpr_passages), "qa": {"files": qa_files}},
        "chunk": {"words": 5},  # far below the passages' length: re-chunking would show
        "bm25": {"k": 5, "threads": 1},
        "evaluation": {"ks": [1, 5]},
    })


def _metrics(store) -> dict[tuple[str, int], float]:
    rows = store.sql("SELECT split, k, value FROM metrics WHERE system = 'bm25' AND metric = 'top_k_accuracy'").to_pylist()
    return {(r["split"], r["k"]): r["value"] for r in rows}


def _count(store, view) -> int:
    return store.sql(f"SELECT count(*) AS n FROM {view}").column("n")[0].as_py()


def _assert_passed_through(store):
    rows = store.sql("SELECT pid, text, title, doc_id, chunk_index FROM passages").to_pylist()
    assert sorted((r["pid"], r["text"], r["title"]) for r in rows) == sorted(PASSAGES)
    assert all(r["doc_id"] == r["title"] and r["chunk_index"] == 0 for r in rows)


def _assert_answer_match_only(store):
    assert _count(store, "gold") == 0
    assert _count(store, "documents") == 0
    systems = store.sql("SELECT DISTINCT system, metric FROM metrics").to_pylist()
    assert {r["system"] for r in systems} == {"bm25"}
    assert not {r["metric"] for r in systems} & {"ndcg_cut", "recall", "map"}  # no qrels metrics


def test_nq_open_questions_over_dpr_tsv_passages(prefect_harness, tmp_path):
    data = tmp_path / "data"
    (data / "nq").mkdir(parents=True)
    write_dpr_tsv(data / "psgs.tsv")
    write_jsonl(data / "nq" / "dev.jsonl", [{"question": q, "answer": a} for q, a, _ in DEV])
    # EfficientQA-style records carry an id and extra fields; the id becomes the qid.
    write_jsonl(data / "nq" / "test.jsonl", [{"id": f"t{i}", "question": q, "answer": a, "extra": [1]}
                                             for i, (q, a, _) in enumerate(TEST)])
    cfg = qa_config(data, [{"path": "nq/dev.jsonl", "format": "nq_open", "split": "dev"},
                           {"path": "nq/test.jsonl", "format": "nq_open", "split": "test"}])
    versions = pipeline(config=cfg, root=str(tmp_path / "store"))
    assert list(versions) == ["ingest_documents", "ingest_questions", "chunk", "link_gold", "bm25_index", "bm25_search", "evaluate"]
    store = ArtifactStore(tmp_path / "store")

    _assert_passed_through(store)
    questions = store.sql("SELECT qid, question, answers, split FROM questions").to_pylist()
    assert {q["qid"]: (q["question"], list(q["answers"]), q["split"]) for q in questions} == {
        **{f"nq_open:dev:{i + 1}": (q, a, "dev") for i, (q, a, _) in enumerate(DEV)},
        **{f"t{i}": (q, a, "test") for i, (q, a, _) in enumerate(TEST)}}

    # Every answerable question's one answer passage is BM25's first hit; Neptune is nowhere.
    top1 = {r["qid"]: r["pid"] for r in store.sql("SELECT qid, pid FROM bm25_runs WHERE rank = 1").to_pylist()}
    assert top1["nq_open:dev:1"] == "1" and top1["nq_open:dev:2"] == "2" and top1["t0"] == "5" and top1["t1"] == "4"
    assert _metrics(store) == {("dev", 1): 2 / 3, ("dev", 5): 2 / 3, ("test", 1): 1.0, ("test", 5): 1.0,
                               ("all", 1): 4 / 5, ("all", 5): 4 / 5}
    ranks = {r["qid"]: r["first_hit_rank"] for r in store.sql(
        "SELECT qid, first_hit_rank FROM question_results WHERE system = 'bm25'").to_pylist()}
    assert ranks == {"nq_open:dev:1": 1, "nq_open:dev:2": 1, "nq_open:dev:3": None, "t0": 1, "t1": 1}
    _assert_answer_match_only(store)
    gold_stats = store.get("gold", versions["link_gold"]).manifest["stats"]
    assert gold_stats["unlinked_questions"] == gold_stats["questions"] == 5


def test_dpr_qa_csv_questions_over_dpr_tsv_passages(prefect_harness, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_dpr_tsv(data / "psgs.tsv")
    # DPR's .qa.csv: question<TAB>Python-literal answer list. The U+0085 inside a question is not
    # a line break (DPR's files have some): a reader splitting on it would see 4 broken lines.
    (data / "nq-test.qa.csv").write_text(
        "what is the name of the giant storm on jupiter\t['Great Red Spot']\n"
        "off the coast of which state is the great barrier reef coral reef\t[\"Queensland\", 'QLD']\n"
        "who designed the wrought-iron eiffel tower\u0085in paris\t['Gustave Eiffel']\n",
        encoding="utf-8")
    cfg = qa_config(data, [{"path": "nq-test.qa.csv", "format": "dpr_qa", "split": "test"}], name="dpr-qa-tiny")
    pipeline(config=cfg, root=str(tmp_path / "store"))
    store = ArtifactStore(tmp_path / "store")

    _assert_passed_through(store)
    questions = store.sql("SELECT qid, answers, split FROM questions").to_pylist()
    assert {q["qid"]: (list(q["answers"]), q["split"]) for q in questions} == {
        "dpr:test:1": (["Great Red Spot"], "test"), "dpr:test:2": (["Queensland", "QLD"], "test"),
        "dpr:test:3": (["Gustave Eiffel"], "test")}
    top1 = {r["qid"]: r["pid"] for r in store.sql("SELECT qid, pid FROM bm25_runs WHERE rank = 1").to_pylist()}
    assert top1 == {"dpr:test:1": "3", "dpr:test:2": "6", "dpr:test:3": "9"}
    assert _metrics(store) == {("test", 1): 1.0, ("test", 5): 1.0, ("all", 1): 1.0, ("all", 5): 1.0}
    _assert_answer_match_only(store)


def _stages(store) -> set[str]:
    return {r["stage"] for r in store.list_artifacts()}


def test_bad_tsv_header_fails_the_chunk_stage_naming_file_and_line(prefect_harness, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_dpr_tsv(data / "psgs.tsv", header="id\ttitle\ttext")  # columns swapped
    write_jsonl(data / "dev.jsonl", [{"question": q, "answer": a} for q, a, _ in DEV])
    cfg = qa_config(data, [{"path": "dev.jsonl", "format": "nq_open", "split": "dev"}], name="bad-tsv")
    with pytest.raises(InputError) as info:
        pipeline(config=cfg, root=str(tmp_path / "store"))
    assert info.value.path == str(data / "psgs.tsv") and info.value.location == "line 1"
    assert "psgs.tsv: line 1: expected header" in str(info.value)
    store = ArtifactStore(tmp_path / "store")
    assert store.list_artifacts("passages") == []
    assert _stages(store) == {"documents", "questions"}  # the stages before chunk did run


def test_nq_open_line_without_answer_fails_ingest_questions_naming_file_and_line(prefect_harness, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_dpr_tsv(data / "psgs.tsv")
    records = [{"question": q, "answer": a} for q, a, _ in DEV]
    records[1] = {"question": DEV[1][0], "answers": DEV[1][1]}  # misspelt key: no "answer"
    write_jsonl(data / "dev.jsonl", records)
    cfg = qa_config(data, [{"path": "dev.jsonl", "format": "nq_open", "split": "dev"}], name="bad-nq")
    with pytest.raises(InputError) as info:
        pipeline(config=cfg, root=str(tmp_path / "store"))
    assert info.value.path == str(data / "dev.jsonl") and info.value.location == "line 2"
    assert "dev.jsonl: line 2: missing required field 'answer'" in str(info.value)
    store = ArtifactStore(tmp_path / "store")
    assert store.list_artifacts("questions") == []
    assert _stages(store) == {"documents"}


def test_example_config_for_nq_open_over_dpr_psgs_w100_loads():
    path = PROJECT_ROOT / "configs" / "nq-open-dpr-tsv.yaml"
    cfg = load_config(path)
    data = cfg.data
    assert data.squad is None and data.beir is None
    assert data.dpr_passages == ["dpr/psgs_w100.tsv"]
    assert [(f.path, f.format, f.split) for f in data.qa.files] == [
        ("nq_open/NQ-open.efficientqa.dev.1.1.jsonl", "nq_open", "dev"), ("nq_open/NQ-open.dev.jsonl", "nq_open", "test")]
    assert cfg.evaluation.ks == [1, 5, 20, 100] and cfg.bm25.k >= max(cfg.evaluation.ks)
    assert cfg.dense is None
    shared = PROJECT_ROOT.parent / "shared" / "data"
    if shared.exists():
        assert all(data.resolve(f.path).is_file() for f in data.qa.files)
        # psgs_w100.tsv is not shipped: planning names the missing file rather than running without it.
        with pytest.raises(InputError, match=r"psgs_w100\.tsv.*DPR passage file not found"):
            plan_for(cfg)
