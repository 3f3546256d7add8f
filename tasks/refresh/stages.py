"""Corpus refresh: from a newer Wikipedia dump, new versions of the documents, the passages, the BM25
index and the promoted encoder's embeddings and FAISS index, each made from its previous version by
applying what changed, then the change report (`corpus_refresh`), whose commit puts them in force.

    locate the dump -> documents (dump re-read, other sources kept) -> passages (changed documents
    chunked again) -> bm25_index (deletes and adds) -> embeddings (changed passages encoded, the
    rest carried over) -> faiss_index (remove_ids / add_with_ids) -> corpus_refresh (report)

Each step is a stage of the engine: a version hashed from its parameters and its inputs (the
previous versions among them, which is its lineage), built into a folder that is committed whole
or not at all. Everything that can refuse the input (no dump, no promoted encoder, an unreadable
dump) is checked or read before the first commit. A refresh whose dump is the one the corpus was
last built from does nothing."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Callable, Optional

import pyarrow as pa
import pyarrow.compute as pc

from storage import Artifact, ArtifactStore
from storage.parquet import ParquetTableWriter, write_table
from tasks import schemas
from tasks.compute.encode import EncodeConfig, EncodeParams, EncodeSettings, encode_in_shards
from tasks.compute.origin import Origin
from tasks.engine import NoParams, Plan, Stage, StageParams, run_stage
from tasks.errors import InputError
from storage.file_identity import file_sha256
from tasks.progress import with_progress
from tasks.readers.paths import downloads_dir
from tasks.refresh.diff import diff_documents, diff_passages, rows_with
from tasks.refresh.faiss_update import IDS_TABLE
from tasks.refresh.locate import LocatedDump, locate_dump
from tasks.refresh.state import REFRESH_STAGE, DenseIndex, RefreshChain, corpus_of, passages_of, promoted_index
from tasks.runners import runner_stats

logger = logging.getLogger("passage_forge")
CODE_VERSION = "refresh-1"
PASSAGE_COLUMNS = ["pid", "title", "text"]


# ---------------------------------------------------------------- params
class DocumentsParams(StageParams):
    RUNTIME = frozenset({"path"})
    dump_name: str
    dump_sha256: str               # the dump by content: the same file anywhere gives the same version
    source: str = "wikipedia"      # the documents this dump replaces
    max_pages: Optional[int] = None
    path: str


class PassagesParams(StageParams):
    words: int
    stride: Optional[int]


class BM25Params(StageParams):
    pass


class ReportParams(StageParams):
    RUNTIME = frozenset({"dump"})
    examples: int
    dump: dict = {}                # where it came from (path, URL, date): recorded in the stats


# ---------------------------------------------------------------- builders
def build_documents(params: DocumentsParams, inputs: dict[str, Artifact], out: Path) -> dict:
    """The previous documents of other sources, then every article of the dump."""
    from tasks.readers.wikipedia import iter_wikipedia_documents

    previous = inputs["previous"].read_table()
    kept = previous.filter(pc.not_equal(previous.column("source"), params.source))
    writer = ParquetTableWriter(out, schemas.DOCUMENTS)
    writer.write_batch(kept)
    seen, batch, read, reader = set(kept.column("doc_id").to_pylist()), [], 0, {}
    for doc in with_progress(iter_wikipedia_documents(params.path, source=params.source, stats=reader),
                             "refresh: dump articles", every=1_000):
        if params.max_pages is not None and read >= params.max_pages:
            break
        if doc["doc_id"] in seen:
            raise InputError(params.path, f"article {doc['doc_id']!r} ({doc['title']!r})", "duplicate doc_id")
        seen.add(doc["doc_id"])
        batch.append(doc)
        read += 1
        if len(batch) == 1_000:
            writer.write_batch(batch)
            batch = []
    writer.write_batch(batch)
    writer.close()
    if read == 0:
        raise InputError(params.path, "dump", f"no article with text in it ({reader}): not a pages-articles dump?")
    columns = ["doc_id", "content_hash", "title"]
    diff = diff_documents(previous.select(columns), _written(out, columns))
    logger.info("refresh: documents %s", diff.counts())
    return {"stats": {"documents": diff.counts(), "articles": read, "other_sources": kept.num_rows, "reader": reader}}


def _written(out: Path, columns: list[str]):
    import pyarrow.dataset as ds

    return ds.dataset(str(out / "data"), format="parquet").to_table(columns=columns)


def build_passages(params: PassagesParams, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.refresh.rechunk import refresh_passages

    previous = inputs["previous"].read_table()
    passages, doc_diff = refresh_passages(previous, inputs["previous_documents"].read_table(columns=["doc_id", "content_hash", "title"]),
                                          inputs["documents"].read_table(), params.words, params.stride)
    if passages.num_rows == 0:
        raise InputError(inputs["documents"].path, "documents", "no passages: every document is empty")
    write_table(out, passages)
    diff = diff_passages(previous.select(PASSAGE_COLUMNS), passages.select(PASSAGE_COLUMNS))
    logger.info("refresh: passages %s", diff.counts())
    return {"stats": {"documents": doc_diff.counts(), "passages": diff.counts()}}


def build_bm25(params: BM25Params, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.refresh.bm25_update import update_bm25_index

    previous = inputs["previous_passages"].read_table(columns=PASSAGE_COLUMNS)
    passages = inputs["passages"].read_table(columns=PASSAGE_COLUMNS)
    diff = diff_passages(previous, passages)
    stats = update_bm25_index(inputs["previous"].subdir("index"), out / "index", diff.touched,
                              rows_with(passages, "pid", diff.fresh))
    return {"stats": {**stats, "passages": diff.counts()}}


def build_vectors(params: EncodeParams, inputs: dict[str, Artifact], out: Path, work: Path) -> dict:
    """The promoted encoder's vectors for the refreshed passages: the new and changed ones encoded
    like the encode stage does (resumable shards, on the configured runner), the rest carried over."""
    import pyarrow.parquet as pq

    from storage.shards import write_shard
    from tasks.refresh.reencode import refresh_vectors

    def encode(todo):
        source = write_shard(work / "passages.parquet", todo)  # what the shards read their rows from
        files = encode_in_shards(params.origin, params.origin.folder(inputs), params.settings, params.device,
                                 params.runner, work, [source], params.shard_size, f"refresh:embeddings:{params.system}")
        return pa.concat_tables([pq.read_table(f) for f in files])

    table, _, stats = refresh_vectors(inputs["previous"].read_table(),
                                      inputs["previous_passages"].read_table(columns=PASSAGE_COLUMNS),
                                      inputs["passages"].read_table(columns=PASSAGE_COLUMNS), encode)
    write_table(out, table)
    logger.info("refresh: %s passages re-encoded, %s vectors carried over", f"{stats['reencoded']:,}",
                f"{stats['carried_over']:,}")
    return {"stats": {**stats, **runner_stats(params.runner)}}


def build_faiss(params: NoParams, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.refresh.faiss_update import update_index_folder

    previous = inputs["previous"]
    recorded = previous.read_table(IDS_TABLE) if IDS_TABLE in previous.tables else None
    ids, stats = update_index_folder(previous.subdir("index"), recorded, inputs["previous_embeddings"].read_table(),
                                     inputs["embeddings"].read_table(), out / "index")
    write_table(out, ids, name=IDS_TABLE)
    return {"stats": stats}


def build_report(params: ReportParams, inputs: dict[str, Artifact], out: Path) -> dict:
    from tasks.refresh.report import change_tables, report_markdown

    documents, previous_documents = (inputs[k].read_table(columns=["doc_id", "content_hash", "title"])
                                     for k in ("documents", "previous_documents"))
    passages, previous_passages = (inputs[k].read_table(columns=["pid", "doc_id", "title", "text"])
                                   for k in ("passages", "previous_passages"))
    doc_diff = diff_documents(previous_documents, documents)
    passage_diff = diff_passages(previous_passages.select(PASSAGE_COLUMNS), passages.select(PASSAGE_COLUMNS))
    refreshed = {stage: {"from": inputs[f"previous_{stage}"].version, "to": inputs[stage].version}
                 for stage in ("documents", "passages", "bm25_index", "embeddings", "faiss_index")
                 if stage in inputs}
    vectors = {"reencoded": None, "carried_over": None, "encoder": None}
    if "embeddings" in inputs:
        made = inputs["embeddings"].manifest.get("stats") or {}
        vectors = ({"reencoded": made["reencoded"], "carried_over": made["carried_over"]}
                   if refreshed["embeddings"]["from"] != refreshed["embeddings"]["to"]
                   else {"reencoded": 0, "carried_over": inputs["embeddings"].rows})
        vectors["encoder"] = inputs["model"].version
    stats = {"documents": doc_diff.counts(), "passages": passage_diff.counts(), "refreshed": refreshed, **vectors,
             "dump": params.dump}
    changes, counts = change_tables(doc_diff, passage_diff, documents, previous_documents, passages,
                                    previous_passages, stats["reencoded"])
    write_table(out, changes, name="refresh_changes")
    write_table(out, counts, name="refresh_counts")
    (out / "report.md").write_text(report_markdown(stats, changes, params.examples), encoding="utf-8")
    return {"stats": stats}


# ---------------------------------------------------------------- the refresh
@dataclass
class RefreshResult:
    dump: LocatedDump
    versions: dict[str, str]                 # artifact stage -> the version in force after the refresh
    report: Artifact | None = None           # None: the corpus was up to date, nothing was written
    built: list[str] = field(default_factory=list)

    @property
    def up_to_date(self) -> bool:
        return self.report is None

    def summary(self) -> dict:
        stats = (self.report.manifest.get("stats") or {}) if self.report is not None else {}
        return {"dump": str(self.dump.path), "url": self.dump.url, "up_to_date": self.up_to_date,
                "versions": self.versions, "built": self.built,
                "report": str(self.report.path / "report.md") if self.report is not None else None,
                "refresh": self.report.version if self.report is not None else None,
                **{k: stats[k] for k in ("documents", "passages", "reencoded") if k in stats}}


def configured_dump(cfg) -> str:
    """The dump a refresh reads when none is given: refresh.dump, else the config's own dump."""
    if cfg.refresh.dump:
        return cfg.refresh.dump
    if len(cfg.data.wikipedia) == 1:
        return cfg.data.wikipedia[0]
    where = "reads no Wikipedia dump" if not cfg.data.wikipedia else f"reads {len(cfg.data.wikipedia)} Wikipedia dumps"
    raise InputError(f"config {cfg.name!r}", "refresh.dump", f"no dump to refresh from: the config {where}; "
                     "give one (`pforge refresh CONFIG --dump PATH|GLOB|URL`, or refresh.dump)")


def check_dump_readable(path: Path) -> None:
    """Reads `path` up to its first article (InputError naming the file and the place when it is
    not a readable dump): a broken dump is refused before any stage runs."""
    from tasks.readers.wikipedia import iter_wikipedia_documents

    next(iter(iter_wikipedia_documents(path)), None)


def locate_configured_dump(cfg, dump: str | None = None, *, today: date | None = None) -> LocatedDump:
    """The dump a refresh of `cfg` reads (`dump`, else the configured one), found and checked
    readable: a URL is fetched first."""
    settings = cfg.refresh
    located = locate_dump(dump or configured_dump(cfg), cfg.data.resolve("."), downloads_dir(), today=today,
                          lookback_days=settings.lookback_days, timeout_s=settings.timeout_s)
    check_dump_readable(located.path)
    return located


def dump_hashes(documents: Artifact) -> set[str]:
    """The content hashes of the dumps a documents artifact was read from."""
    params = documents.manifest.get("parameters", {})
    return {params["dump_sha256"]} if "dump_sha256" in params else set((params.get("files") or {}).values())


def refresh_corpus(cfg, plan: Plan, store: ArtifactStore, dump: str | None = None, *, today: date | None = None,
                   before_commit: Callable[[Path], None] | None = None,
                   on_built: Callable[[Stage, Artifact], None] | None = None) -> RefreshResult:
    """Refresh the corpus `cfg` built (its `plan`) from a newer dump (`dump`, else the configured
    one). `before_commit` runs on the finished report folder before it is committed; `on_built`
    sees each artifact the refresh writes (the Prefect layer publishes its summary)."""
    settings = cfg.refresh
    located = locate_configured_dump(cfg, dump, today=today)  # the dump first: it is what the user gave
    chain = RefreshChain(store)
    corpus = corpus_of(store, plan, chain)
    dense = promoted_index(store, chain, corpus.passages) if settings.dense else None
    sha = file_sha256(located.path)
    logger.info("refresh: dump %s (sha256 %s) against documents %s, passages %s", located.path, sha[:16],
                corpus.documents.version, corpus.passages.version)
    built: list[str] = []

    def run(stage: Stage, inputs: dict[str, Artifact], hook=None) -> Artifact:
        artifact = run_stage(store, stage, inputs, before_commit=hook)
        built.append(f"{stage.artifact}:{artifact.version}")
        if on_built is not None:
            on_built(stage, artifact)
        return artifact

    documents, passages = corpus.documents, corpus.passages
    if sha in dump_hashes(corpus.documents):
        logger.info("refresh: the documents were read from this very dump: nothing to re-ingest")
    else:
        documents = run(Stage("refresh:documents", "documents", CODE_VERSION, ("previous",),
                              DocumentsParams(dump_name=located.path.name, dump_sha256=sha, path=str(located.path),
                                              max_pages=cfg.data.wikipedia_max_pages), build_documents),
                        {"previous": corpus.documents})
        chunk = corpus.passages.manifest.get("parameters", {})
        passages = run(Stage("refresh:passages", "passages", CODE_VERSION, ("previous", "previous_documents", "documents"),
                             PassagesParams(words=chunk.get("words", cfg.chunk.words), stride=chunk.get("stride", cfg.chunk.stride)),
                             build_passages),
                       {"previous": corpus.passages, "previous_documents": corpus.documents, "documents": documents})
    bm25 = corpus.bm25_index
    if passages_of(store, bm25).version != passages.version:
        bm25 = run(Stage("refresh:bm25_index", "bm25_index", CODE_VERSION, ("previous", "previous_passages", "passages"),
                         BM25Params(), build_bm25),
                   {"previous": bm25, "previous_passages": passages_of(store, bm25), "passages": passages})
    report_inputs = {"documents": documents, "previous_documents": corpus.documents, "passages": passages,
                     "previous_passages": corpus.passages, "bm25_index": bm25, "previous_bm25_index": corpus.bm25_index}
    if dense is not None:
        embeddings, faiss_index = _refresh_dense(cfg, store, dense, passages, run)
        report_inputs.update(embeddings=embeddings, previous_embeddings=dense.embeddings, faiss_index=faiss_index,
                             previous_faiss_index=dense.faiss_index, model=dense.model)
    versions = {stage: report_inputs[stage].version for stage in
                ("documents", "passages", "bm25_index", "embeddings", "faiss_index") if stage in report_inputs}
    if not built:
        logger.info("refresh: up to date, nothing written")
        return RefreshResult(located, versions)
    where = {"path": str(located.path), "source": located.source, "url": located.url, "date": located.date, "sha256": sha}
    report = run(Stage("refresh:report", REFRESH_STAGE, CODE_VERSION, tuple(report_inputs),
                       ReportParams(examples=settings.examples, dump=where), build_report), report_inputs, before_commit)
    logger.info("refresh: committed %s %s (%s)", REFRESH_STAGE, report.version, report.path / "report.md")
    return RefreshResult(located, versions, report, built)


def _refresh_dense(cfg, store: ArtifactStore, dense: DenseIndex, passages: Artifact, run) -> tuple[Artifact, Artifact]:
    """The promoted encoder's embeddings and FAISS index brought to `passages` (as they are when
    they already match), encoded the way its runs record."""
    from tasks.refresh.state import input_of

    made_from = passages_of(store, dense.embeddings)
    if made_from.version == passages.version:
        return dense.embeddings, dense.faiss_index
    if input_of(store, dense.faiss_index, "embeddings", key="embeddings").version != dense.embeddings.version:
        raise RuntimeError(f"{dense.faiss_index.path}: this FAISS index was not built from embeddings "
                           f"{dense.embeddings.version}, so it cannot be updated from them")
    params = dense.runs.manifest["parameters"]
    origin, settings = Origin(**params["origin"]), EncodeSettings(**params["settings"])
    if origin.model_input is None:
        raise RuntimeError(f"{dense.runs.path}: its encoder is not a {dense.model.stage} input")
    encode = cfg.dense.encode if cfg.dense is not None else EncodeConfig()
    variant = {"system": dense.system}
    embeddings = run(Stage("refresh:embeddings", "embeddings", CODE_VERSION,
                           ("previous", "previous_passages", "passages", origin.model_input),
                           EncodeParams(system=dense.system, origin=origin, settings=settings, device=encode.device,
                                        shard_size=encode.shard_size, runner=cfg.runner), build_vectors, variant=variant,
                           resumable=True),
                     {"previous": dense.embeddings, "previous_passages": made_from, "passages": passages,
                      origin.model_input: dense.model})
    faiss_index = run(Stage("refresh:faiss_index", "faiss_index", CODE_VERSION, ("previous", "previous_embeddings", "embeddings"),
                            NoParams(), build_faiss, variant=variant),
                      {"previous": dense.faiss_index, "previous_embeddings": dense.embeddings, "embeddings": embeddings})
    return embeddings, faiss_index
