"""Silver family (paper 001): the stages of the `cross_encoder:` and `silver:` config sections
(declared in tasks/silver/config.py; tasks/config.py imports them from here).

- `cross_encoder` trains the cross-attention classifier on the train split's gold pairs with 1:1:1
  negatives (BM25 top-10, dense top-10, the gold document; section 4.1), holds 10% of the
  questions out as its dev split, and writes the model (a folder sentence-transformers'
  `CrossEncoder` loads) and the classification report of table 2.
- `pairs:silver` scores a retriever's top-K for the train questions and the synthetic queries
  and keeps p >= 0.5 as silver pairs of weight p^2 (sections 4.2, 4.3), sharded and resumable.
Trained systems use them with `pairs: [gold, silver]` and `loss: weighted`; rerankers
(tasks/rerank) and the negatives' false-negative filter use the classifier too. The work is in the
library modules beside this one: the classifier's pairs (sampling.py), training (classifier.py) and
report (report.py), `cross_encoder.model` references (model_reference.py), labelling (labelling.py).
"""
from __future__ import annotations

import logging
import shutil
from functools import partial
from pathlib import Path
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc

from storage import Artifact
from storage.parquet import write_table
from tasks.compute.device import resolve_device
from tasks.compute.encode import EncodeSettings
from tasks.compute.origin import Origin, origin_of
from tasks.compute.score import SCORING_SAMPLE, ScoreJob, ScoringSettings, scoring_agreement
from tasks.compute.search import search_texts
from tasks.engine import Stage, StageParams
from tasks.runners import LOCAL, RunnerConfig, run_shards, runner_stats
from tasks.silver.config import CrossEncoderConfig, SilverConfig
from tasks.silver.model_reference import classifier_reference

logger = logging.getLogger("passage_forge")



class CrossEncoderParams(StageParams):
    # The stage trains and reports with torch: how later stages score does not change its output.
    # config.model is always empty here (a named model is imported, not trained): out of the hash,
    # so versions trained before it existed still match.
    RUNTIME = frozenset({"device", "config.device", "config.runtime", "config.int8", "config.bf16", "config.train.checkpoint_every",
                         "config.train.keep_checkpoints", "config.train.length_pieces", "config.model", "start_folder"})
    config: CrossEncoderConfig
    match_type: str
    device: str
    batch_size: int
    # Fine-tuning another classifier (config.model): a hub name or a folder's digest (a pinned
    # artifact's version is hashed as an input). Absent otherwise, and then out of the hash.
    start: Optional[str] = None
    start_folder: Optional[str] = None
    bm25_k1: Optional[float] = None     # searching the generated queries (queries: synthetic)
    bm25_b: Optional[float] = None
    ADDED = {"start": None, "start_folder": None, "bm25_k1": None, "bm25_b": None, "config.queries": "gold"}


def build_cross_encoder(params: CrossEncoderParams, inputs: dict[str, Artifact], out: Path,
                        work: Optional[Path] = None) -> dict:
    from models.cross_encoder import CrossEncoderModel
    from tasks.silver.classifier import DevClassification, train_classifier
    from tasks.silver.report import report_rows
    from tasks.silver.sampling import as_text_pairs, classifier_pairs, held_out, sample_questions, source_counts
    from tasks.training.resumable import keep_record, training_dir, training_times

    c, device = params.config, resolve_device(params.device)
    questions = inputs["ingest_questions"].read_table("questions", columns=["qid", "question", "answers", "split"])
    passages = inputs["chunk"].read_table(columns=["pid", "doc_id", "text"])
    text_of = dict(zip(passages.column("pid").to_pylist(), passages.column("text").to_pylist()))
    gold = inputs["link_gold"].read_table()
    bm25 = inputs["bm25_search"].read_table()
    dense = inputs[f"search:{c.dense_system}"].read_table() if c.dense_system else None

    def pairs_of(split: str, limit: Optional[int]):
        qs = sample_questions(questions.filter(pc.equal(questions.column("split"), split)), limit, c.seed)
        return classifier_pairs(qs, gold, passages, bm25, dense, depth=c.depth, seed=c.seed, match_type=params.match_type)

    trained_on = _synthetic_classifier_pairs(params, inputs, passages) if c.queries == "synthetic" \
        else pairs_of(c.split, c.max_questions)
    train, dev = [], []
    for pair in trained_on:
        (dev if held_out(pair.qid, c.dev_share, c.seed) else train).append(pair)
    if not train or not dev:
        raise ValueError(f"cross_encoder: {len(train)} training and {len(dev)} dev pairs from "
                         f"{'the generated queries' if c.queries == 'synthetic' else f'split {c.split!r}'}; "
                         "check the split, dev_share and max_questions")
    logger.info("cross_encoder: %d training pairs %s, %d dev pairs", len(train), source_counts(train), len(dev))
    model = _starting_classifier(params, inputs)
    evaluator = DevClassification(as_text_pairs(dev, text_of), [p.label for p in dev], params.batch_size, c.select_by)
    train_dir = training_dir(out, work)
    result = train_classifier(model, as_text_pairs(train, text_of), [p.label for p in train], c.train, train_dir,
                              evaluator=evaluator, device=str(device))
    model = CrossEncoderModel.from_pretrained(train_dir / "best")
    model.to(device)
    model.save_pretrained(out / "model")

    report_pairs = pairs_of(c.report_split, c.report_max_questions)
    report, threshold = report_rows(model, c.base, dev, report_pairs, text_of, params.batch_size, device)
    write_table(out, pa.Table.from_pylist(report), name="classification_report")
    for copy in ("best", "final", "checkpoints"):  # model/ holds the chosen weights; history and curve stay
        shutil.rmtree(out / "training" / copy, ignore_errors=True)
    keep_record(train_dir, out)
    curve = [{"step": h["step"], **h["dev_metrics"]} for h in result["history"] if "dev_metrics" in h]
    best = next((e for e in curve if e["step"] == result["best_step"]), {})
    return {"stats": {"training_pairs": len(train), "dev_pairs": len(dev), "sources": source_counts(train),
                      "steps": len(result["history"]), "best_step": result["best_step"], "selected_by": c.select_by,
                      "dev_auc": best.get("auc"), "dev_log_loss": best.get("log_loss"), "dev_curve": curve,
                      **training_times(result),
                      "report_split": c.report_split, "report_pairs": len(report_pairs),
                      "dual_encoder_threshold": threshold, "report": report}}


class ImportParams(StageParams):
    """A classifier trained elsewhere: an artifact (pinned input 'source'), a folder or a hub name."""
    RUNTIME = frozenset({"folder"})
    reference: str                  # as configured, resolved: cross_encoder:VERSION, a path or a hub name
    folder: Optional[str] = None    # a model folder's absolute path (out of the hash; its digest is in it)
    folder_hash: Optional[str] = None


def build_imported_cross_encoder(params: ImportParams, inputs: dict[str, Artifact], out: Path) -> dict:
    """The referenced classifier copied into this run's store as its cross_encoder artifact, so
    every stage that scores with it reads it the same way as a trained one."""
    from models.cross_encoder import CrossEncoderModel

    source = inputs.get("source")
    where = str(source.subdir("model")) if source is not None else params.folder or params.reference
    try:
        model = CrossEncoderModel.from_pretrained(where)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cross_encoder.model {params.reference!r}: cannot load a one-logit classifier from "
                         f"{where}: {exc}") from exc
    model.save_pretrained(out / "model")
    trained = source.manifest.get("stats", {}) if source is not None else {}
    kept = {k: trained.get(k) for k in ("training_pairs", "best_step", "selected_by", "dev_auc", "dev_log_loss",
                                        "report_split", "report") if k in trained}
    logger.info("cross_encoder: using %s (%s)", params.reference, where)
    return {"stats": {"imported_from": params.reference, **({"trained_by_source": kept} if kept else {})}}


def trained_cross_encoder_stage(cfg) -> Stage:
    """The cross_encoder stage that trains: on gold questions (paper 001) or on the generated
    queries, from the base encoder or from another classifier (config.model)."""
    from tasks.engine import Pinned

    c = cfg.cross_encoder
    inputs = ["ingest_questions", "chunk", "link_gold", "bm25_search", *([f"search:{c.dense_system}"] if c.dense_system else [])]
    extra, pinned = {}, {}
    if c.queries == "synthetic":
        if cfg.qgen is None:
            raise ValueError("cross_encoder.queries: synthetic trains on the generated queries, which needs a qgen: section")
        if c.dense_system:
            raise ValueError("cross_encoder.dense_system: the generated queries have no dense run; with queries: "
                             "synthetic the negatives come from BM25 and the document (leave dense_system empty)")
        inputs += ["pairs:synthetic", "bm25_index"]
        extra.update(bm25_k1=cfg.bm25.k1, bm25_b=cfg.bm25.b)
    if c.model:
        version, folder, digest = classifier_reference(c.model, cfg.config_dir)
        if version is not None:
            pinned = {"start": Pinned("cross_encoder", version)}
        else:  # a folder (hashed by its digest) or a hub name
            extra.update(start_folder=folder, start=digest or c.model)
    c = c.model_copy(update={"train": c.train.resolved_for(c.device)})  # bf16 'auto' as planned for the device
    params = CrossEncoderParams(config=c, match_type=cfg.evaluation.match_type, device=c.device,
                                batch_size=c.batch_size, **extra)
    return Stage("cross_encoder", "cross_encoder", "1", tuple(inputs), params, build_cross_encoder,
                 pinned=pinned, resumable=True)


def imported_cross_encoder_stage(c: CrossEncoderConfig, cfg_dir: Optional[Path]) -> Stage:
    """The cross_encoder stage of a config that names `cross_encoder.model`."""
    from tasks.engine import Pinned

    version, folder, digest = classifier_reference(c.model, cfg_dir)
    if version is not None:
        return Stage("cross_encoder", "cross_encoder", "1", (), ImportParams(reference=c.model),
                     build_imported_cross_encoder, pinned={"source": Pinned("cross_encoder", version)})
    params = ImportParams(reference=c.model, folder=folder, folder_hash=digest)  # a folder, or a hub name
    return Stage("cross_encoder", "cross_encoder", "1", (), params, build_imported_cross_encoder)


def _starting_classifier(params: CrossEncoderParams, inputs: dict[str, Artifact]):
    """A fresh one-logit head on the base encoder, or the classifier fine-tuning starts from."""
    from models.cross_encoder import CrossEncoderModel

    c = params.config
    if "start" in inputs:
        return CrossEncoderModel.from_pretrained(inputs["start"].subdir("model"))
    if params.start_folder or params.start:
        return CrossEncoderModel.from_pretrained(params.start_folder or params.start)
    return CrossEncoderModel.from_base(c.base, c.train.max_length)


def _synthetic_classifier_pairs(params: CrossEncoderParams, inputs: dict[str, Artifact], passages: pa.Table):
    """The generated queries as the classifier's training pairs: each query's own passage is its
    positive; BM25's top `depth` (searched here) and the passage's document give the negatives."""
    from tasks.bm25.search import bm25_search
    from tasks.qgen.as_questions import synthetic_queries_as_questions
    from tasks.silver.sampling import classifier_pairs, sample_questions

    c = params.config
    queries = synthetic_queries_as_questions(inputs["pairs:synthetic"].read_table(columns=["qid", "query", "pid"]))
    queries = sample_questions(queries, c.max_questions, c.seed)
    items = list(zip(queries.column("qid").to_pylist(), queries.column("question").to_pylist()))
    runs = bm25_search(inputs["bm25_index"].subdir("index"), items, k=c.depth, k1=params.bm25_k1, b=params.bm25_b,
                       system="bm25")
    own = queries.select(["qid", "pid"])
    return classifier_pairs(queries, own, passages, runs, None, depth=c.depth, seed=c.seed, match_type=params.match_type)


class SilverParams(StageParams):
    RUNTIME = frozenset({"device", "shard_size", "config.shard_size", "dense_origin.init_path", "runner"})
    config: SilverConfig
    retriever_runs: str           # bm25_search or search:SYSTEM (the train questions' candidates)
    dense_origin: Optional[Origin] = None     # a dense retriever's encoder (it searches the synthetic queries)
    dense_encode: Optional[EncodeSettings] = None
    device: str
    batch_size: int
    scoring: ScoringSettings = ScoringSettings()
    shard_size: int
    bm25_k1: float
    bm25_b: float
    runner: RunnerConfig = LOCAL


def _synthetic_runs(params: SilverParams, inputs: dict[str, Artifact], queries: dict[str, str]) -> pa.Table:
    """The retriever's top-K for the synthetic queries (they have no run of their own)."""
    items = sorted(queries.items())
    if params.dense_origin is None:
        from tasks.bm25.search import bm25_search

        return bm25_search(inputs["bm25_index"].subdir("index"), items, k=params.config.top_k + 1,
                           k1=params.bm25_k1, b=params.bm25_b, system="bm25")
    system = params.config.retriever
    runs, _ = search_texts(params.dense_origin, params.dense_encode, inputs, inputs[f"encode:{system}"],
                           inputs[f"index:{system}"], pa.array([q for q, _ in items]), [t for _, t in items],
                           params.config.top_k + 1, params.dense_encode.device(params.device), system)
    return runs


def build_silver_pairs(params: SilverParams, inputs: dict[str, Artifact], out: Path, work: Path) -> dict:
    """Score the candidates shard by shard (a killed build resumes at its first missing shard),
    then keep p >= threshold as silver pairs of weight p^2."""
    import pyarrow.parquet as pq

    from tasks.silver.labelling import (SCORED, candidates_from_runs, first_per_query, keep_silver, sample_queries,
                                        score_shard, silver_training_pairs, source_summary)

    c = params.config
    gold = inputs["pairs:gold"].read_table(columns=["qid", "pid", "split"])
    known = set(zip(gold.column("qid").to_pylist(), gold.column("pid").to_pylist()))
    train_gold = pc.sum(pc.equal(gold.column("split"), "train")).as_py() or 0
    candidates, queries_of = [], {}
    if "train" in c.queries:
        q = inputs["ingest_questions"].read_table("questions", columns=["qid", "question", "split"])
        q = q.filter(pc.equal(q.column("split"), "train"))
        questions = sample_queries(dict(zip(q.column("qid").to_pylist(), q.column("question").to_pylist())), c.max_queries, c.seed)
        candidates += candidates_from_runs(inputs[params.retriever_runs].read_table(), questions, "train", c.top_k, known)
        queries_of.update(questions)
    synthetic_gold = 0
    if "synthetic" in c.queries:
        own = inputs["pairs:synthetic"].read_table(columns=["qid", "query", "pid"])
        synthetic = sample_queries(dict(zip(own.column("qid").to_pylist(), own.column("query").to_pylist())), c.max_queries, c.seed)
        own_pairs = set(zip(own.column("qid").to_pylist(), own.column("pid").to_pylist()))
        synthetic_gold = len(own_pairs)
        runs = _synthetic_runs(params, inputs, synthetic)
        found = candidates_from_runs(runs, synthetic, "synthetic", c.top_k + 1, own_pairs)
        candidates += first_per_query(found, c.top_k)  # top-K after dropping the query's own passage
        queries_of.update(synthetic)

    passages = inputs["chunk"].read_table(columns=["pid", "text"])
    text_of = dict(zip(passages.column("pid").to_pylist(), passages.column("text").to_pylist()))
    n_shards = max(1, -(-len(candidates) // params.shard_size))
    specs = []  # each shard carries its candidates and their passages' texts; a resumed build loads no model
    for i in range(n_shards):
        shard = candidates[i * params.shard_size:(i + 1) * params.shard_size]
        specs.append((i, shard, {c.pid: text_of[c.pid] for c in shard}))
    job = ScoreJob(str(inputs["cross_encoder"].subdir("model")), params.device, params.batch_size, n_shards,
                   scoring=params.scoring)

    def report(i: int, reused: bool) -> None:
        logger.info("silver: shard %d/%d %s", i + 1, n_shards, "reused (resumed build)" if reused else "scored")

    files = run_shards(params.runner, work, specs, partial(score_shard, job), report, label="silver")
    scored = pa.concat_tables([pq.read_table(f, schema=SCORED) for f in files])
    silver = keep_silver(scored, c.threshold)
    head = scored.slice(0, SCORING_SAMPLE)
    accuracy = scoring_agreement(job.model, params.scoring, zip(head.column("query").to_pylist(),
                                                                [text_of[x] for x in head.column("pid").to_pylist()]),
                                 head.column("p").to_numpy())
    write_table(out, silver_training_pairs(silver, queries_of))
    write_table(out, silver, name="silver_pairs")
    write_table(out, scored, name="scored_candidates")
    by_source = {source: source_summary(scored, silver, source, gold_count)
                 for source, gold_count in (("train", train_gold), ("synthetic", synthetic_gold)) if source in c.queries}
    logger.info("silver: %d of %d candidates kept (p >= %.2f)", silver.num_rows, scored.num_rows, c.threshold)
    return {"stats": {"candidates": scored.num_rows, "silver": silver.num_rows, "threshold": c.threshold,
                      "retriever": c.retriever, "top_k": c.top_k, "shards": n_shards, "by_source": by_source,
                      "runtime": params.scoring.runtime, "precision": params.scoring.precision, **accuracy,
                      **runner_stats(params.runner)}}


def wants_silver(cfg) -> bool:
    systems = cfg.dense.systems if cfg.dense else []
    return any(s.train and "silver" in s.train.pairs for s in systems)


def stages(cfg, earlier: list[Stage]) -> list[Stage]:
    if cfg.cross_encoder is None:
        return []
    c = cfg.cross_encoder
    if c.model and c.queries == "gold":
        out = [imported_cross_encoder_stage(c, cfg.config_dir)]
    else:
        out = [trained_cross_encoder_stage(cfg)]
    if not wants_silver(cfg):
        return out
    s = cfg.silver
    dense, pinned = {}, {}
    if s.retriever == "bm25":
        runs, extra = "bm25_search", ("bm25_index",)
    else:
        system = next((x for x in cfg.dense.systems if x.name == s.retriever and x.evaluate), None) if cfg.dense else None
        if system is None:
            raise ValueError(f"silver.retriever {s.retriever!r} is neither bm25 nor an evaluated dense system")
        origin, model_stages, pinned = origin_of(system, cfg.config_dir)
        runs = f"search:{s.retriever}"
        extra = (f"encode:{s.retriever}", f"index:{s.retriever}", *model_stages)
        dense = dict(dense_origin=origin, dense_encode=EncodeSettings.of(cfg.dense.encode))
    synthetic = ("pairs:synthetic",) if "synthetic" in s.queries else ()
    if synthetic and cfg.qgen is None:
        raise ValueError("silver.queries names synthetic, which needs a qgen: section (the generated queries)")
    params = SilverParams(config=s, retriever_runs=runs, device=c.device, batch_size=c.batch_size,
                          scoring=ScoringSettings.of(c),
                          shard_size=s.shard_size, bm25_k1=cfg.bm25.k1, bm25_b=cfg.bm25.b, runner=cfg.runner, **dense)
    inputs = ("cross_encoder", "ingest_questions", "chunk", "pairs:gold", runs, *synthetic, *extra)
    out.append(Stage("pairs:silver", "pairs", "1", tuple(dict.fromkeys(inputs)), params, build_silver_pairs,
                     pinned=pinned, resumable=True, variant={"source": "silver"}))
    return out
