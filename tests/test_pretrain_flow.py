"""Query-as-context pre-training through the flow on the tiny SQuAD slice: a tiny random GPT-2
writes the synthetic queries, a tiny random BERT is pre-trained (CoT-MAE form on the queries, the
passage-passage baseline on the documents), and dense systems start from the saved base
checkpoints: retriever 1 with BM25 negatives, retriever 2 with negatives mined by retriever 1
(paper 002 figure 3). The plumbing, not the quality (benchmarks/quality/query_as_context_quality.py)."""
import json

import pytest
from safetensors import safe_open

from flows.pipeline import pipeline
from models.bi_encoder import CONFIG_NAME
from storage import ArtifactStore
from tasks.config import PROJECT_ROOT, PipelineConfig, load_config
from tasks.training.arguments import CPU_ROWS_PER_PIECE

pytestmark = pytest.mark.usefixtures("flush_denormals")
TINY = PROJECT_ROOT / "configs" / "tiny.yaml"


def _config(generator, checkpoint) -> PipelineConfig:
    cfg = load_config(TINY).model_dump()
    model = {"base": str(checkpoint), "shared": True, "pooling": "cls", "normalize": True, "scale": 20.0}
    train = {"loss": "dpr", "batch_size": 4, "max_steps": 2, "select_on_dev": False, "hard_negatives": 1,
             "query_max_len": 16, "passage_max_len": 60}
    schedule = {"base": str(checkpoint), "batch_size": 4, "max_steps": 2, "passage_max_len": 60, "query_max_len": 16}
    cfg["qgen"] = {"generator": str(generator), "finetune": {"enabled": False},
                   "generate": {"queries_per_passage": 2, "max_new_tokens": 6, "max_passages": 24, "shard_size": 24,
                                "batch_size": 8, "max_source_len": 64}}
    cfg["pretrain"] = [{"name": "qac", "form": "cotmae", **schedule},
                       {"name": "pp", "form": "passage-passage", **schedule}]
    cfg["negatives"] = {"dense": {"mined": {"system": "r1", "depth": 10}}}
    cfg["dense"] = {"encode": {"batch_size": 16, "passage_max_len": 60, "query_max_len": 16},
                    "systems": [{"name": "r1", "model": model, "init_from": "pretrain:qac",
                                 "train": {**train, "negatives": ["bm25"]}},
                                {"name": "r2", "model": model, "init_from": "pretrain:qac",
                                 "train": {**train, "negatives": ["mined", "bm25"]}},
                                {"name": "pp-zero", "model": model, "init_from": "pretrain:pp"}]}
    return PipelineConfig.model_validate(cfg)


def _keys(folder):
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return set(f.keys())


def test_pretraining_then_retriever_1_and_2(prefect_harness, tmp_path, tiny_generator, checkpoint):
    cfg = _config(tiny_generator, checkpoint)
    versions = pipeline(config=cfg, root=str(tmp_path))
    store = ArtifactStore(tmp_path)

    # Each pre-training run saved a plain encoder (no heads, no bi-encoder config) and its tokenizer.
    for name in ("qac", "pp"):
        art = store.get("pretrained_encoder", versions[f"pretrain:{name}"])
        folder = art.subdir("model")
        assert _keys(folder) == _keys(checkpoint)
        assert (folder / "tokenizer.json").is_file() and not (folder / CONFIG_NAME).exists()
        stats = art.manifest["stats"]
        assert stats["steps"] == 2 and stats["mlm_head"] == "fresh"
        assert stats["rows_per_piece"] == CPU_ROWS_PER_PIECE, "length_pieces: auto cuts a CPU run's spans"
        assert json.loads((art.subdir("training") / "history.json").read_text())["total_steps"] == 2
    qac = store.get("pretrained_encoder", versions["pretrain:qac"])
    assert set(qac.manifest["inputs"]) == {"chunk", "synthetic_queries"}
    assert qac.manifest["stats"]["objective"] == "cotmae" and 1 <= qac.manifest["stats"]["contexts_per_passage"] <= 2
    assert qac.manifest["stats"]["passages"] <= 24
    pp = store.get("pretrained_encoder", versions["pretrain:pp"])
    assert set(pp.manifest["inputs"]) == {"chunk"} and pp.manifest["stats"]["objective"] == "cocondenser"

    # Retriever 1 and 2 both start from the qac encoder (figure 3); retriever 2's negatives are
    # mined by retriever 1's vectors.
    for system in ("r1", "r2"):
        trained = store.get("dense_model", versions[f"train:{system}"])
        assert trained.manifest["inputs"]["pretrain:qac"]["version"] == versions["pretrain:qac"]
        saved = json.loads((trained.subdir("model") / CONFIG_NAME).read_text())
        assert saved["base_model"] == str(qac.subdir("model")) and saved["pooling"] == "cls"
    r2 = store.get("dense_model", versions["train:r2"]).manifest
    assert {"negatives:mined", "negatives:bm25"} <= set(r2["inputs"])
    mined = store.get("negatives", versions["negatives:mined"]).manifest
    assert mined["inputs"]["search:r1"]["version"] == versions["search:r1"]
    assert store.sql("SELECT count(*) FROM negatives WHERE strategy = 'mined'").column(0)[0].as_py() > 0

    # A system without training encodes with the pre-trained encoder under its own model section.
    assert store.get("embeddings", versions["encode:pp-zero"]).manifest["inputs"]["pretrain:pp"]["version"] == \
        versions["pretrain:pp"]
    assert {"r1", "r2", "pp-zero"} <= set(store.sql("SELECT DISTINCT system FROM metrics").column(0).to_pylist())
    assert pipeline(config=cfg, root=str(tmp_path)) == versions  # all cache hits
