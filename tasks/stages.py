"""The pipeline's stages: what each reads, its parameters, and how it builds its artifact.

Each stage is declared once here; `run_stage` turns a declaration into a versioned artifact via
the store (cache hit when the version exists). Prefect wrappers live in tasks/prefect_tasks.py.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

import pyarrow as pa

from storage import Artifact, ArtifactStore
from storage.parquet import ParquetTableWriter, write_table
from tasks import schemas
from tasks.chunking import chunk_documents
from tasks.config import PipelineConfig
from tasks.errors import InputError
from tasks.file_identity import file_sha256
from tasks.gold import link_qrels_gold, link_span_gold
from tasks.progress import with_progress
from tasks.splits import assign_article_splits

logger = logging.getLogger("passage_forge")

Build = Callable[[PipelineConfig, dict[str, Artifact], Path], dict | None]


@dataclass(frozen=True)
class Stage:
    name: str                 # what users type: pforge run ... --stage NAME
    artifact: str             # the artifact stage (folder and DuckDB view name)
    code_version: str         # bump when the stage's output for the same inputs changes
    inputs: tuple[str, ...]   # upstream stage names
    params: Callable[[PipelineConfig], dict]
    build: Build
    produces_runs: bool = False   # its table is a runs table that the evaluation scores


# ---------------------------------------------------------------- ingest
def _squad_path(cfg: PipelineConfig) -> Path:
    from tasks.readers.squad import download_squad

    squad = cfg.data.squad
    path = cfg.data.resolve(squad.path)
    if not path.exists() and squad.download:
        logger.info("%s is absent: downloading the official %s", path, squad.download)
        try:
            path = download_squad(squad.download, downloads_dir())
        except OSError as exc:  # offline, refused, disk full: say which file was wanted and why
            raise InputError(path, "file", f"absent, and downloading {squad.download} failed: {exc}") from exc
    if not path.exists():
        raise InputError(path, "file", "SQuAD file not found (and no download configured)")
    return path


def downloads_dir() -> Path:
    """Where downloaded inputs are kept: $PFORGE_DOWNLOADS, else ~/.cache/passage-forge/downloads
    (the data folder may be read-only)."""
    default = Path.home() / ".cache" / "passage-forge" / "downloads"
    return Path(os.environ.get("PFORGE_DOWNLOADS", default))


def _wikipedia_paths(cfg: PipelineConfig) -> list[Path]:
    paths = [cfg.data.resolve(p) for p in cfg.data.wikipedia]
    for path in paths:
        if not path.exists():
            raise InputError(path, "file", "Wikipedia dump not found")
    return paths


def _beir_path(cfg: PipelineConfig) -> Path:
    path = cfg.data.resolve(cfg.data.beir.path)
    if not path.exists():
        raise InputError(path, "file", "BEIR dataset not found")
    return path


def _input_files(cfg: PipelineConfig) -> dict[str, str]:
    files = {}
    if cfg.data.squad:
        files[str(_squad_path(cfg))] = ""
    if cfg.data.beir:
        path = _beir_path(cfg)
        files.update({str(p): "" for p in ([path] if path.is_file() else sorted(path.rglob("*"))) if p.is_file()})
    for path in _wikipedia_paths(cfg):
        files[str(path)] = ""
    # Keyed by file name, not absolute path: the same data gives the same version on any machine.
    return {Path(path).name: file_sha256(Path(path)) for path in files}


def _iter_documents(cfg: PipelineConfig) -> Iterator[dict]:
    if cfg.data.squad:
        from tasks.readers.squad import iter_squad_documents

        limit = cfg.data.squad.max_articles
        for i, doc in enumerate(iter_squad_documents(_squad_path(cfg))):
            if limit is not None and i >= limit:
                break
            yield doc
    if cfg.data.beir:
        from tasks.readers.beir import iter_beir_corpus

        yield from iter_beir_corpus(_beir_path(cfg))
    from tasks.readers.wikipedia import iter_wikipedia_documents

    for path in _wikipedia_paths(cfg):
        for i, doc in enumerate(iter_wikipedia_documents(path)):
            if cfg.data.wikipedia_max_pages is not None and i >= cfg.data.wikipedia_max_pages:
                break
            yield doc


def _documents_params(cfg: PipelineConfig) -> dict:
    return {"data": cfg.data.model_dump(exclude={"data_root"}), "files": _input_files(cfg)}


def _build_documents(cfg: PipelineConfig, inputs: dict[str, Artifact], out: Path) -> dict:
    writer = ParquetTableWriter(out, schemas.DOCUMENTS)
    seen: dict[str, str] = {}
    by_source: dict[str, int] = {}
    for doc in with_progress(_iter_documents(cfg), "documents", every=1_000):
        if doc["doc_id"] in seen:
            raise InputError(doc["source"], f"document {doc['doc_id']!r}", f"duplicate doc_id (first seen in {seen[doc['doc_id']]})")
        seen[doc["doc_id"]] = doc["source"]
        by_source[doc["source"]] = by_source.get(doc["source"], 0) + 1
        writer.write_batch([doc])
    writer.close()
    if not seen:
        raise InputError(cfg.name, "data", "no documents were read")
    return {"stats": {"documents_by_source": by_source}}


def _questions_params(cfg: PipelineConfig) -> dict:
    return {"data": cfg.data.model_dump(exclude={"data_root"}), "files": _input_files(cfg), "split": cfg.split.model_dump()}


def _build_questions(cfg: PipelineConfig, inputs: dict[str, Artifact], out: Path) -> dict:
    if cfg.data.squad:
        return _build_squad_questions(cfg, inputs["ingest_documents"], out)
    return _build_beir_questions(cfg, out)


def _build_squad_questions(cfg: PipelineConfig, documents: Artifact, out: Path) -> dict:
    from tasks.readers.squad import iter_squad_questions

    known = documents.read_table(columns=["doc_id", "title"])
    doc_ids = set(known.column("doc_id").to_pylist())
    questions = [q for q in iter_squad_questions(_squad_path(cfg)) if q["doc_id"] in doc_ids]
    title_to_id = dict(zip(known.column("title").to_pylist(), known.column("doc_id").to_pylist()))
    explicit = {}
    for split, titles in cfg.split.articles.items():
        missing = [t for t in titles if t not in title_to_id]
        if missing:
            raise InputError(str(_squad_path(cfg)), f"split.articles.{split}", f"unknown article titles {missing[:5]}")
        explicit[split] = [title_to_id[t] for t in titles]
    splits = assign_article_splits(sorted({q["doc_id"] for q in questions}), cfg.split.ratios, cfg.split.seed, explicit)
    for q in questions:
        q["split"] = splits[q["doc_id"]]
    write_table(out, pa.Table.from_pylist(questions, schema=schemas.QUESTIONS), name="questions")
    by_split: dict[str, int] = {}
    for q in questions:
        by_split[q["split"]] = by_split.get(q["split"], 0) + 1
    articles_by_split: dict[str, list[str]] = {}
    for doc_id, split in sorted(splits.items()):
        articles_by_split.setdefault(split, []).append(doc_id)
    return {"stats": {"questions_by_split": by_split, "articles_by_split": articles_by_split}}


def _build_beir_questions(cfg: PipelineConfig, out: Path) -> dict:
    from tasks.readers.beir import iter_beir_qrels, iter_beir_queries

    path = _beir_path(cfg)
    qrels_rows, split_of = [], {}
    for split in cfg.data.beir.qrels_splits:
        for row in iter_beir_qrels(path, split):
            if split_of.setdefault(row["qid"], split) != split:
                raise InputError(path, f"qrels/{split}.tsv query {row['qid']!r}", f"query also judged in split {split_of[row['qid']]!r}")
            qrels_rows.append(row)
    questions = []
    for q in iter_beir_queries(path):
        if q["qid"] in split_of:
            q["split"] = split_of[q["qid"]]
            questions.append(q)
    missing = set(split_of) - {q["qid"] for q in questions}
    if missing:
        raise InputError(path, "queries.jsonl", f"{len(missing)} judged queries are missing, e.g. {sorted(missing)[:3]}")
    write_table(out, pa.Table.from_pylist(questions, schema=schemas.QUESTIONS), name="questions")
    write_table(out, pa.Table.from_pylist(qrels_rows, schema=schemas.QRELS), name="qrels")
    return {"stats": {"questions": len(questions), "qrels": len(qrels_rows)}}


# ---------------------------------------------------------------- chunk
def _build_passages(cfg: PipelineConfig, inputs: dict[str, Artifact], out: Path) -> dict:
    documents = inputs["ingest_documents"]
    writer = ParquetTableWriter(out, schemas.PASSAGES)
    table = documents.read_table()
    total = table.num_rows
    for batch in table.to_batches(max_chunksize=1_000):
        writer.write_batch(list(chunk_documents(batch.to_pylist(), cfg.chunk.words, cfg.chunk.stride)))
    rows = writer.close()
    logger.info("chunk: %s documents -> %s passages", f"{total:,}", f"{rows:,}")
    return {"stats": {"documents": total, "passages": rows}}


# ---------------------------------------------------------------- gold
def _build_gold(cfg: PipelineConfig, inputs: dict[str, Artifact], out: Path) -> dict:
    questions_artifact, passages = inputs["ingest_questions"], inputs["chunk"].read_table(columns=["pid", "doc_id", "char_start", "char_end"])
    if "qrels" in questions_artifact.tables:
        gold, stats = link_qrels_gold(questions_artifact.read_table("qrels"), passages)
    else:
        gold, stats = link_span_gold(questions_artifact.read_table("questions"), passages)
    if stats["unlinked_questions"]:
        logger.warning("gold: %d of %d questions have no linkable gold passage: %s",
                       stats["unlinked_questions"], stats["questions"], json.dumps(stats["unlinked_by_reason"]))
    write_table(out, gold)
    return {"stats": stats}


# ---------------------------------------------------------------- bm25
def _build_bm25_index(cfg: PipelineConfig, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.bm25.index import build_bm25_index

    passages = inputs["chunk"].read_table(columns=["pid", "title", "text"])
    return {"stats": build_bm25_index(passages, out / "index", threads=cfg.bm25.threads)}


def _build_bm25_runs(cfg: PipelineConfig, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.bm25.search import bm25_search

    questions = inputs["ingest_questions"].read_table("questions", columns=["qid", "question"])
    queries = list(zip(questions.column("qid").to_pylist(), questions.column("question").to_pylist()))
    runs = bm25_search(inputs["bm25_index"].subdir("index"), queries, k=cfg.bm25.k, k1=cfg.bm25.k1,
                       b=cfg.bm25.b, threads=cfg.bm25.threads, system="bm25")
    write_table(out, runs)
    return {"stats": {"queries": len(queries), "hits": runs.num_rows}}


# ---------------------------------------------------------------- evaluate
def _build_evaluation(cfg: PipelineConfig, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.evaluation.evaluate import evaluate_runs

    questions = inputs["ingest_questions"].read_table("questions")
    passages = inputs["chunk"].read_table(columns=["pid", "text"])
    gold = inputs["link_gold"].read_table()
    all_stages = stages_for(cfg)
    runs = [artifact.read_table() for name, artifact in inputs.items() if all_stages[name].produces_runs]
    results, metrics, report = evaluate_runs(cfg, questions, passages, gold, runs,
                                             gold_stats=inputs["link_gold"].manifest.get("stats", {}))
    write_table(out, results, name="question_results")
    write_table(out, metrics, name="metrics")
    (out / "report.md").write_text(report, encoding="utf-8")
    return {"stats": {"systems": sorted(set(metrics.column("system").to_pylist()))}}


def _no_params(cfg: PipelineConfig) -> dict:
    return {}


BASE_STAGES = [
    Stage("ingest_documents", "documents", "1", (), _documents_params, _build_documents),
    Stage("ingest_questions", "questions", "1", ("ingest_documents",), _questions_params, _build_questions),
    Stage("chunk", "passages", "1", ("ingest_documents",), lambda c: c.chunk.model_dump(), _build_passages),
    Stage("link_gold", "gold", "1", ("ingest_questions", "chunk"), _no_params, _build_gold),
    Stage("bm25_index", "bm25_index", "1", ("chunk",), lambda c: {"threads": c.bm25.threads}, _build_bm25_index),
    Stage("bm25_search", "bm25_runs", "1", ("bm25_index", "ingest_questions"),
          lambda c: c.bm25.model_dump(exclude={"threads"}), _build_bm25_runs, produces_runs=True),
]


def _dense_stages(cfg: PipelineConfig) -> list[Stage]:
    from tasks import dense_stages as d

    if cfg.dense is None:
        return []
    stages = []
    for system in cfg.dense.systems:
        n = system.name
        model = {"system": n, "model": system.model.model_dump(), "train": system.train.model_dump() if system.train else None}
        trained = (f"train:{n}",) if system.train else ()
        if system.train:
            stages.append(Stage(f"train:{n}", "dense_model", "2", ("ingest_questions", "chunk", "link_gold", "bm25_search"),
                                lambda c, m=model: {**m, "device": c.dense.encode.device}, partial(_with_system, d.build_train, system)))
        encode = lambda c, m=model: {**m, "encode": c.dense.encode.model_dump(exclude={"device", "shard_size"})}  # noqa: E731
        stages.append(Stage(f"encode:{n}", "embeddings", "1", ("chunk", *trained), encode, partial(_with_system, d.build_encode, system)))
        stages.append(Stage(f"index:{n}", "faiss_index", "1", (f"encode:{n}",), lambda c: c.dense.index.model_dump(),
                            partial(_with_system, d.build_index, system)))
        stages.append(Stage(f"search:{n}", "dense_runs", "1", ("ingest_questions", f"encode:{n}", f"index:{n}", *trained),
                            lambda c, e=encode: {**e(c), "k": c.bm25.k}, partial(_with_system, d.build_search, system),
                            produces_runs=True))
    if cfg.dense.hybrid:
        stages.append(Stage("hybrid", "hybrid_runs", "2", ("ingest_questions", "chunk", "link_gold", "bm25_search",
                                                           f"search:{cfg.dense.hybrid.system}"),
                            lambda c: {**c.dense.hybrid.model_dump(), "k": c.bm25.k, "match_type": c.evaluation.match_type},
                            d.build_hybrid, produces_runs=True))
    return stages


def _with_system(build, system, cfg: PipelineConfig, inputs: dict[str, Artifact], out: Path):
    return build(cfg, system, inputs, out)


def stages_for(cfg: PipelineConfig) -> dict[str, Stage]:
    """Every stage of this config's pipeline, in an order where inputs come first."""
    stages = BASE_STAGES + _dense_stages(cfg)
    runs = tuple(s.name for s in stages if s.produces_runs)
    evaluate = Stage("evaluate", "evaluation", "1", ("ingest_questions", "chunk", "link_gold", *runs),
                     lambda c: c.evaluation.model_dump(), _build_evaluation)
    return {s.name: s for s in stages + [evaluate]}


# The stages every config has (for --help texts and tests).
STAGES: dict[str, Stage] = stages_for(PipelineConfig())
# Short aliases users type.
ALIASES = {"ingest": "ingest_documents", "questions": "ingest_questions", "gold": "link_gold",
           "index": "bm25_index", "retrieve": "bm25_search", "bm25": "bm25_search", "eval": "evaluate"}
def resolve_stage_name(name: str, cfg: PipelineConfig) -> str:
    name = ALIASES.get(name, name)
    known = stages_for(cfg)
    if name not in known:
        raise ValueError(f"unknown stage {name!r}; stages: {', '.join(known)}")
    return name


def run_stage(store: ArtifactStore, name: str, cfg: PipelineConfig, inputs: dict[str, Artifact]) -> Artifact:
    stage = stages_for(cfg)[name]
    params = stage.params(cfg)
    artifact = store.materialize(stage.artifact, stage.code_version, params, inputs,
                                 lambda out: stage.build(cfg, inputs, out))
    logger.info("%s: %s %s (%s)", name, stage.artifact, artifact.version, "cache hit" if artifact.cache_hit else "built")
    return artifact


def planned_version(store: ArtifactStore, name: str, cfg: PipelineConfig) -> str:
    """The version `name` would get under `cfg`, computed without building anything."""
    stage = stages_for(cfg)[name]
    upstream = {dep: planned_version(store, dep, cfg) for dep in stage.inputs}
    return store.version_for(stage.artifact, stage.code_version, stage.params(cfg), upstream)


def upstream_for_single_stage(store: ArtifactStore, name: str, cfg: PipelineConfig) -> dict[str, Artifact]:
    """Inputs for rerunning one stage: the upstream artifacts this config produces, else the latest."""
    inputs = {}
    stages = stages_for(cfg)
    for dep in stages[name].inputs:
        artifact = store.get(stages[dep].artifact, planned_version(store, dep, cfg)) or store.latest(stages[dep].artifact)
        if artifact is None:
            raise RuntimeError(f"stage {name!r} needs {dep!r}, which has never run: run the pipeline first")
        inputs[dep] = artifact
    return inputs
