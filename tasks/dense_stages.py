"""Dense stages, one set per configured system: train (optional) -> encode -> FAISS index ->
search; then the BM25+dense hybrid. Declared here, run by tasks/stages.py's machinery."""
from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa

from storage import Artifact
from storage.parquet import write_table
from tasks.config import DenseSystemConfig, PipelineConfig
from tasks.training.examples import training_examples

logger = logging.getLogger("passage_forge")


def _device(cfg: PipelineConfig) -> str:
    import torch

    wanted = cfg.dense.encode.device
    return ("cuda" if torch.cuda.is_available() else "cpu") if wanted == "auto" else wanted


def load_model(system: DenseSystemConfig, trained: Artifact | None):
    from models import BiEncoder
    from models.checkpoints import resolve_checkpoint

    if trained is not None:
        return BiEncoder.from_pretrained(trained.subdir("model"))
    m = system.model
    return BiEncoder.from_pretrained(resolve_checkpoint(m.base), shared=m.shared, pooling=m.pooling,
                                     projection_dim=m.projection_dim, normalize=m.normalize, scale=m.scale)


def _encoder_for(cfg: PipelineConfig, model):
    """The model on the configured device, in eval mode, int8-quantised when asked (CPU only)."""
    device = _device(cfg)
    if cfg.dense.encode.int8 and device != "cpu":
        raise ValueError(f"dense.encode.int8 quantises for the CPU; the device is {device!r}")
    model.to(device).eval()
    if cfg.dense.encode.int8:
        from models.quantization import quantize_dynamic_int8

        return quantize_dynamic_int8(model)
    return model


def _encode(cfg: PipelineConfig, model, texts, side: str, done: int = 0, total: int | None = None):
    """Vectors for `texts` with an `_encoder_for` model; logs progress about every 10% of `total`
    (all texts of the stage; `done` of them were encoded by earlier calls)."""
    import torch

    from tasks.dense.encode import encode_texts

    enc = cfg.dense.encode
    encode_fn = model.encode_passage if side == "passage" else model.encode_query
    total = total or len(texts)
    step = max(total // 10, 1)

    def progress(finished, _n):
        overall = done + finished
        if overall % step < enc.batch_size or overall == total:
            logger.info("encode %ss: %s/%s", side, f"{overall:,}", f"{total:,}")

    with torch.inference_mode():
        return encode_texts(texts, model.tokenizer, encode_fn, batch_size=enc.batch_size,
                            max_length=enc.passage_max_len if side == "passage" else enc.query_max_len,
                            device=_device(cfg), dtype=enc.dtype, autocast_bf16=enc.bf16, progress=progress)


# ---------------------------------------------------------------- train
def _dev_metric(cfg: PipelineConfig, system: DenseSystemConfig, inputs: dict[str, Artifact]):
    from tasks.dense.encode import encode_texts
    from tasks.training.dev_metric import dev_pool, make_dev_metric

    t, enc = system.train, cfg.dense.encode
    qids, queries, pool, gold_idx = dev_pool(
        inputs["ingest_questions"].read_table("questions"),
        inputs["chunk"].read_table(columns=["pid", "doc_id", "title", "text"]),
        inputs["link_gold"].read_table(), t.dev_split, t.dev_distractors, t.dev_max_questions, t.seed)
    device = _device(cfg)

    def encode(model, texts, side):
        fn = model.encode_passage if side == "passage" else model.encode_query
        return encode_texts(texts, model.tokenizer, fn, batch_size=enc.batch_size, device=device,
                            max_length=enc.passage_max_len if side == "passage" else enc.query_max_len)

    logger.info("train %s: dev metric top-%d over %d %s questions and %d passages",
                system.name, t.dev_k, len(qids), t.dev_split, len(pool))
    return make_dev_metric(qids, queries, pool, gold_idx, t.dev_k, encode)


def build_train(cfg: PipelineConfig, system: DenseSystemConfig, inputs: dict[str, Artifact], out: Path) -> dict:
    import shutil

    from models import BiEncoder
    from models.export import export_bi_encoder
    from models.losses import BidirectionalSoftmaxLoss, InBatchSoftmaxLoss
    from tasks.training.trainer import TrainerArgs, train_bi_encoder

    examples = training_examples(system.train, inputs["ingest_questions"].read_table("questions"),
                                 inputs["chunk"].read_table(columns=["pid", "title", "text"]),
                                 inputs["link_gold"].read_table(), inputs["bm25_search"].read_table())
    t = system.train
    model = load_model(system, None)
    loss = (InBatchSoftmaxLoss if t.loss == "dpr" else BidirectionalSoftmaxLoss)(model)
    args = TrainerArgs(lr=t.lr, batch_size=t.batch_size, epochs=t.epochs, max_steps=t.max_steps,
                       warmup_ratio=t.warmup_ratio, hard_negatives=t.hard_negatives,
                       query_max_len=t.query_max_len, passage_max_len=t.passage_max_len, seed=t.seed,
                       bf16={"auto": "auto", "on": True, "off": False}[t.bf16], device=_device(cfg),
                       eval_every=t.eval_every, eval_at_start=t.select_on_dev)
    dev_metric = _dev_metric(cfg, system, inputs) if t.select_on_dev else None
    logger.info("train %s: %d questions, loss %s, batch %d", system.name, len(examples), t.loss, t.batch_size)
    result = train_bi_encoder(model, loss, examples, args, out / "training", dev_metric=dev_metric, progress=False)
    if result["best_step"] != len(result["history"]):
        logger.info("train %s: keeping step %s (dev metric %.4f), not the last step", system.name,
                    result["best_step"], result["best_metric"])
        model = BiEncoder.from_pretrained(out / "training" / "best")
    model.save_pretrained(out / "model")
    export_bi_encoder(model, out / "export")
    for copy in ("best", "final"):  # model/ holds the chosen weights; history and curve stay
        shutil.rmtree(out / "training" / copy, ignore_errors=True)
    history = result["history"]
    return {"stats": {"examples": len(examples), "steps": len(history), "best_step": result["best_step"],
                      "best_dev_metric": result["best_metric"], "start_dev_metric": result.get("start_metric"),
                      "dev_curve": result["dev_curve"], "final_loss": history[-1]["loss"] if history else None,
                      "seconds": result["seconds"]}}


# ---------------------------------------------------------------- encode, index, search
def build_encode(cfg: PipelineConfig, system: DenseSystemConfig, inputs: dict[str, Artifact], out: Path) -> dict:
    """Encode the passages shard by shard (`dense.encode.shard_size` rows read, tokenised and
    written at a time), so memory is bounded by a shard, not by the corpus."""
    import pyarrow.parquet as pq

    from storage.parquet import ParquetTableWriter
    from tasks.dense.encode import embeddings_table

    files = inputs["chunk"].table_files()
    total = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    model = _encoder_for(cfg, load_model(system, inputs.get(f"train:{system.name}")))
    writer, done, dim = None, 0, 0
    for f in files:
        for shard in pq.ParquetFile(f).iter_batches(batch_size=cfg.dense.encode.shard_size, columns=["pid", "title", "text"]):
            pairs = list(zip(shard.column("title").to_pylist(), shard.column("text").to_pylist()))
            vectors = _encode(cfg, model, pairs, "passage", done, total)
            table = embeddings_table(shard.column("pid").to_pylist(), vectors)
            writer = writer or ParquetTableWriter(out, table.schema)
            writer.write_batch(table)
            done, dim = done + len(pairs), int(vectors.shape[1])
    if writer is None:
        raise ValueError("encode: the passages table is empty")
    writer.close()
    return {"stats": {"passages": done, "dim": dim, "shard_size": cfg.dense.encode.shard_size}}


def build_index(cfg: PipelineConfig, system: DenseSystemConfig, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.dense import faiss_index
    from tasks.dense.encode import vectors_from_table

    _, vectors = vectors_from_table(inputs[f"encode:{system.name}"].read_table())
    f = cfg.dense.index
    index = faiss_index.build_index(vectors.astype("float32"), kind=f.kind, hnsw_m=f.hnsw_m, ef_search=f.ef_search,
                                    nlist=f.nlist, pq_m=f.pq_m, nprobe=f.nprobe)
    faiss_index.save_index(index, out / "index")
    return {"stats": faiss_index.index_params(index)}


def build_search(cfg: PipelineConfig, system: DenseSystemConfig, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.dense import faiss_index

    questions = inputs["ingest_questions"].read_table("questions", columns=["qid", "question"])
    pids = inputs[f"encode:{system.name}"].read_table(columns=["pid"]).column("pid")
    model = _encoder_for(cfg, load_model(system, inputs.get(f"train:{system.name}")))
    vectors = _encode(cfg, model, questions.column("question").to_pylist(), "query")
    index = faiss_index.load_index(inputs[f"index:{system.name}"].subdir("index"))
    runs = faiss_index.search(index, vectors.astype("float32"), cfg.bm25.k, pids, questions.column("qid"), system=system.name)
    write_table(out, runs)
    return {"stats": {"queries": questions.num_rows, "hits": runs.num_rows}}


# ---------------------------------------------------------------- hybrid
def build_hybrid(cfg: PipelineConfig, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.dense.hybrid import choose_weight, linear_fusion, tune_scorer

    h = cfg.dense.hybrid
    questions = inputs["ingest_questions"].read_table("questions")
    passages = inputs["chunk"].read_table(columns=["pid", "text"])
    passage_text = dict(zip(passages.column("pid").to_pylist(), passages.column("text").to_pylist()))
    bm25, dense = inputs["bm25_search"].read_table(), inputs[f"search:{h.system}"].read_table()
    tune = questions.filter(pa.compute.equal(questions.column("split"), h.tune_split))
    if tune.num_rows == 0:
        raise ValueError(f"hybrid: no questions in split {h.tune_split!r} to choose the BM25 weight on")
    tune_ids = tune.column("qid")
    metric, score_fn = tune_scorer(h.tune_metric, tune, passage_text, inputs["link_gold"].read_table(),
                                   h.tune_k, cfg.evaluation.match_type)

    def on_tune(run: pa.Table) -> pa.Table:
        return run.filter(pa.compute.is_in(run.column("qid"), value_set=tune_ids))

    weight, scores = choose_weight(on_tune(bm25), on_tune(dense), score_fn, k=cfg.bm25.k)
    logger.info("hybrid: BM25 weight %.2f chosen on %s (%s %.4f)", weight, h.tune_split, metric, scores[weight])
    write_table(out, linear_fusion(bm25, dense, weight, k=cfg.bm25.k, system=f"hybrid({h.system})"))
    return {"stats": {"weight": weight, "tune_split": h.tune_split, "tune_metric": metric,
                      "tune_scores": {str(k): v for k, v in scores.items()}}}
