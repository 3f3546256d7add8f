"""benchmarks/runtime_encoding.py: its external peer (sentence-transformers run by
benchmarks/st_backend_peer.py under another Python answers what it computes in process) and its
passages drawn from a chunked corpus's Parquet files."""
import sys
from argparse import Namespace

import numpy as np
import pytest

from tests.benchmark_scripts import benchmark_script

ITEMS = [("Denver Broncos", "The Broncos defeated the Panthers to win the title."),
         ("Normans", "The Normans were a people of Normandy in France."),
         ("Warsaw", "Warsaw is the capital of Poland.")]


@pytest.fixture(scope="module")
def runtime_encoding():
    with benchmark_script("runtime_encoding") as module:
        yield module


def _args(**kw):
    return Namespace(batch_size=2, max_length=64, st_python=sys.executable, **kw)


def test_encode_peer_matches_sentence_transformers_in_process(runtime_encoding, tiny_checkpoint):
    from sentence_transformers import SentenceTransformer

    peers = runtime_encoding.external_peers(_args(st_backends="torch"), "encode", tiny_checkpoint)
    try:
        got = peers["st-torch"](ITEMS)
        again = peers["st-torch"](ITEMS[:1])  # the child keeps serving
    finally:
        peers["st-torch"].close()
    model = SentenceTransformer(str(tiny_checkpoint), device="cpu")
    model.max_seq_length = 64
    expected = model.encode(ITEMS, batch_size=2, convert_to_numpy=True)
    assert got.shape == expected.shape == (3, 32)
    # float32 through the same kernels in two processes: agreement to rounding, not bitwise
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(again, expected[:1], rtol=1e-4, atol=1e-5)


def test_a_peer_that_cannot_load_is_reported_and_skipped(runtime_encoding, tmp_path, capsys):
    peers = runtime_encoding.external_peers(_args(st_backends="torch"), "encode", tmp_path / "missing")
    assert peers == {}
    assert "st-torch skipped" in capsys.readouterr().err


def test_corpus_passages_are_a_seeded_sample_of_the_artifacts_rows(runtime_encoding, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "passages" / "v1" / "data"
    data.mkdir(parents=True)
    for part in range(2):
        rows = range(part * 10, part * 10 + 10)
        pq.write_table(pa.table({"pid": [f"p{i}" for i in rows], "title": [f"t{i}" for i in rows],
                                 "text": [f"text {i}" for i in rows]}), data / f"part-{part}.parquet")
    drawn = runtime_encoding.corpus_passages(str(data), 5)
    assert drawn == runtime_encoding.corpus_passages(str(data), 5)  # seeded
    assert len(set(drawn)) == 5 and all(text == "text " + title[1:] for title, text in drawn)
    assert {int(t[1:]) for t, _ in drawn} & set(range(10, 20))  # both files are read
    with pytest.raises(SystemExit, match="fewer than --limit 21"):
        runtime_encoding.corpus_passages(str(data), 21)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no Parquet files"):
        runtime_encoding.corpus_passages(str(tmp_path / "empty"), 1)
    with pytest.raises(SystemExit, match="no such file or folder"):
        runtime_encoding.corpus_passages(str(tmp_path / "missing"), 1)


def test_openvino_rows_are_the_project_runtime_at_each_precision(runtime_encoding, tiny_checkpoint):
    from models import BiEncoder
    from models.encoder_runtimes import openvino_available
    from tasks.compute.bi_encoder import for_inference

    if not openvino_available():
        pytest.skip("openvino not installed")
    model = BiEncoder.from_pretrained(str(tiny_checkpoint), shared=True, pooling="mean", normalize=True).eval()
    rows = runtime_encoding.openvino_encoders(model, for_inference(model, "cpu", runtime="onnx"), ITEMS, 64, bf16=True)
    assert {name: (row.runtime, row.bf16) for name, row in rows.items() if name != "openvino-int8"} == \
        {"openvino": ("openvino", False), "openvino-bf16": ("openvino", True)}
    assert "openvino-bf16" not in runtime_encoding.openvino_encoders(model, rows["openvino"], ITEMS, 64, bf16=False)


def _squad_article(title, n):
    """A SQuAD article of n paragraphs "TITLE i", each with one question "q TITLE i" answered by TITLE."""
    return {"title": title, "paragraphs": [
        {"context": f"{title} {i}",
         "qas": [{"id": f"{title}-{i}", "question": f"q {title} {i}", "answers": [{"text": title, "answer_start": 0}]}]}
        for i in range(n)]}


def test_auc_pairs_are_each_questions_own_paragraph_and_others_of_its_article(runtime_encoding, tmp_path):
    import json

    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"data": [_squad_article("a", 3), _squad_article("b", 10)]}))
    pairs, labels = runtime_encoding.auc_pairs(path, questions=4)
    assert sum(labels) == 4 and len(pairs) == len(labels) == 3 * 3 + 8
    assert pairs[:3] == [("q a 0", "a 0"), ("q a 0", "a 1"), ("q a 0", "a 2")] and labels[:3] == [1, 0, 0]
    last = [p for p, y in zip(pairs, labels) if p[0] == "q b 0"]
    assert len(last) == 8 and last[0] == ("q b 0", "b 0") and {c for _, c in last[1:]} <= {f"b {i}" for i in range(1, 10)}


def test_auc_leaves_out_the_articles_the_classifier_trained_on(runtime_encoding, tmp_path):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "questions"
    folder.mkdir()
    pq.write_table(pa.table({"doc_id": ["squad:a", "squad:a", "squad:b", "wiki:a"], "split": ["train", "train", "test", "train"]}),
                   folder / "part-00000.parquet")
    assert runtime_encoding.trained_articles(str(folder)) == {"a"} and runtime_encoding.trained_articles(None) == set()
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"data": [_squad_article(t, 3) for t in ("a", "b")]}))
    pairs, labels = runtime_encoding.auc_pairs(path, questions=2, skip_articles=frozenset({"a"}))
    assert sum(labels) == 2 and {q for q, _ in pairs} == {"q b 0", "q b 1"}
