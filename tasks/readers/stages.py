"""Ingest family: the `data:` and `split:` config sections and the stages that read the input files
(ingest_documents, ingest_questions). Sources: SQuAD (documents and questions), BEIR (corpus,
queries, graded qrels), Wikipedia dumps (distractor documents), NQ-open JSONL and DPR .qa.csv
(questions with answers, evaluated by answer match); DPR passage TSVs enter at the chunk stage."""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterator, Literal, Optional, Union

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from storage import Artifact
from storage.parquet import ParquetTableWriter, write_table
from tasks import schemas
from tasks.engine import Stage, StageParams
from tasks.errors import InputError
from storage.file_identity import file_sha256
from tasks.progress import with_progress
from tasks.readers.download import OfficialFile, fetch, official
from tasks.readers.paths import downloads_dir, existing
from tasks.splits import assign_article_splits

logger = logging.getLogger("passage_forge")
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SquadSource(_Strict):
    path: str = Field("squad/dev-v1.1-partial.json", description="SQuAD v1.1 JSON, relative to data_root")
    download: Optional[Literal["dev-v1.1", "train-v1.1"]] = Field(
        "dev-v1.1", description="official file to download (checksum verified) when path is absent")
    max_articles: Optional[int] = Field(None, ge=1, description="keep only the first N articles (quick runs)")


class BeirSource(_Strict):
    path: str = Field(..., description="BEIR dataset folder or zip, relative to data_root")
    download: Optional[Literal["beir-nfcorpus"]] = Field(
        None, description="official zip to download (checksum verified) when path is absent")
    qrels_splits: list[str] = Field(default_factory=lambda: ["test"], description="qrels files to load")


class WikipediaDump(_Strict):
    path: str = Field(..., description="pages-articles XML dump (.bz2 or plain), relative to data_root")
    download: Optional[Literal["wikipedia-sample"]] = Field(
        None, description="official dump to download (checksum verified) when path is absent")


class QaFile(_Strict):
    path: str = Field(..., description="question file, relative to data_root")
    format: Literal["nq_open", "dpr_qa"] = Field(..., description="NQ-open JSONL or DPR's tab-separated .qa.csv")
    split: str = Field(..., description="the split its questions belong to")


class QaSource(_Strict):
    files: list[QaFile] = Field(..., min_length=1, description="questions with answer strings; no gold passages")


class DataConfig(_Strict):
    data_root: str = Field("../shared/data", description="folder holding the input data; relative paths start at the project root")
    squad: Optional[SquadSource] = None
    beir: Optional[BeirSource] = None
    qa: Optional[QaSource] = Field(None, description="NQ-open / DPR .qa.csv questions, evaluated by answer match")
    # A plain path, or {path, download} naming the official dump to fetch when the path is absent.
    wikipedia: list[Union[str, WikipediaDump]] = Field(
        default_factory=list, description="pages-articles XML dumps (.bz2 or plain): documents")
    wikipedia_max_pages: Optional[int] = Field(None, ge=1)
    dpr_passages: list[str] = Field(default_factory=list, description="DPR passage TSVs (id, text, title): passages as they are, not chunked")

    @model_validator(mode="after")
    def _one_qa_source(self):
        if sum(s is not None for s in (self.squad, self.beir, self.qa)) != 1:
            raise ValueError("configure exactly one of data.squad, data.beir or data.qa as the question source")
        return self

    def wikipedia_dumps(self) -> list[WikipediaDump]:
        return [WikipediaDump(path=d) if isinstance(d, str) else d for d in self.wikipedia]

    def resolve(self, relative: str) -> Path:
        root = Path(os.environ.get("PFORGE_DATA", self.data_root))
        if not root.is_absolute():
            root = PROJECT_ROOT / root
        return (root / relative).resolve()


class SplitConfig(_Strict):
    seed: int = 13
    ratios: dict[str, float] = Field(default_factory=lambda: {"train": 0.6, "dev": 0.1, "test": 0.3})
    articles: dict[str, list[str]] = Field(default_factory=dict, description="explicit article titles per split; they override the ratios")

    @field_validator("ratios")
    @classmethod
    def _shares(cls, ratios: dict[str, float]) -> dict[str, float]:
        # A negative share silently emptied its split (and shifted the others): refused where it is written.
        negative = sorted(name for name, share in ratios.items() if not share >= 0)
        if negative:
            raise ValueError(f"a split's share is 0 or more; {', '.join(f'{n}: {ratios[n]}' for n in negative)}")
        if ratios and sum(ratios.values()) <= 0:
            raise ValueError("the shares must sum to a positive number")
        return ratios


# ---------------------------------------------------------------- params
class DataParams(StageParams):
    """The data section without its root, plus the content hash of every input file: the same
    data gives the same version wherever it lives."""
    RUNTIME = frozenset({"data_root", "dpr_passages"})
    sources: dict
    files: dict[str, str]
    data_root: str
    dpr_passages: list[str] = []  # hashed by the chunk stage, which reads them

    @property
    def data(self) -> DataConfig:
        return DataConfig(**self.sources, data_root=self.data_root, dpr_passages=self.dpr_passages)

    def hashed(self) -> dict:
        # Where an absent BEIR/Wikipedia file would be downloaded from changes nothing (`files`
        # pins the bytes): hashed as the plain paths they were before `download` existed, so
        # existing artifacts keep their versions. (SQuAD's older `download` stays hashed.)
        out = super().hashed()
        sources = out["sources"] = dict(out["sources"])
        if sources.get("beir"):
            sources["beir"] = {k: v for k, v in sources["beir"].items() if k != "download"}
        sources["wikipedia"] = [d if isinstance(d, str) else d["path"] for d in sources.get("wikipedia", [])]
        return out


class QuestionParams(DataParams):
    split: SplitConfig


def squad_path(data: DataConfig) -> Path:
    from tasks.readers.squad import squad_official

    squad = data.squad
    return input_path(data, squad.path, squad_official(squad.download) if squad.download else None,
                      "SQuAD file")


def beir_path(data: DataConfig) -> Path:
    beir = data.beir
    return input_path(data, beir.path, official(beir.download) if beir.download else None, "BEIR dataset")


def wikipedia_paths(data: DataConfig) -> list[Path]:
    return [input_path(data, d.path, official(d.download) if d.download else None, "Wikipedia dump")
            for d in data.wikipedia_dumps()]


def input_path(data: DataConfig, relative: str, download: Optional[OfficialFile], what: str) -> Path:
    """data_root/relative; when it is absent and `download` is given, the official copy in
    downloads_dir(), fetched once and checksum verified."""
    path = data.resolve(relative)
    if path.exists():
        return path
    if download is None:
        raise InputError(path, "file", f"{what} not found (and no download configured)")
    cache = downloads_dir()
    logger.info("%s is absent: using the official %s (from %s, cached in %s)", path, download.name, download.url, cache)
    try:
        return fetch(download, cache)
    except OSError as exc:  # offline, refused, HTTP error, disk full: name the URL and where to put the file by hand
        raise InputError(path, "file", f"{what} not found, and downloading {download.url} failed: {exc}. "
                                       f"Offline, put that file (sha256 {download.sha256}) at {path} or at "
                                       f"{cache / download.name}") from exc


def _source_files(data: DataConfig) -> list[Path]:
    files = []
    if data.squad:
        files.append(squad_path(data))
    if data.beir:
        path = beir_path(data)
        files += [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    if data.qa:
        files += [existing(data, f.path, f"{f.format} question file") for f in data.qa.files]
    files += wikipedia_paths(data)
    return files


def data_params(data: DataConfig, cls: type[DataParams] = DataParams, **extra) -> DataParams:
    # Keyed by file name, not absolute path: the same data gives the same version on any machine.
    files = {p.name: file_sha256(p) for p in _source_files(data)}
    return cls(sources=data.model_dump(exclude={"data_root", "dpr_passages"}), files=files,
               data_root=data.data_root, dpr_passages=list(data.dpr_passages), **extra)


# ---------------------------------------------------------------- documents
def iter_documents(data: DataConfig) -> Iterator[dict]:
    if data.squad:
        from tasks.readers.squad import iter_squad_documents

        limit = data.squad.max_articles
        for i, doc in enumerate(iter_squad_documents(squad_path(data))):
            if limit is not None and i >= limit:
                break
            yield doc
    if data.beir:
        from tasks.readers.beir import iter_beir_corpus

        yield from iter_beir_corpus(beir_path(data))
    from tasks.readers.wikipedia import iter_wikipedia_documents

    for path in wikipedia_paths(data):
        for i, doc in enumerate(iter_wikipedia_documents(path)):
            if data.wikipedia_max_pages is not None and i >= data.wikipedia_max_pages:
                break
            yield doc


def build_documents(params: DataParams, inputs: dict[str, Artifact], out: Path) -> dict:
    data = params.data
    writer = ParquetTableWriter(out, schemas.DOCUMENTS)
    seen: dict[str, str] = {}
    by_source: dict[str, int] = {}
    for doc in with_progress(iter_documents(data), "documents", every=1_000):
        if doc["doc_id"] in seen:
            raise InputError(doc["source"], f"document {doc['doc_id']!r}", f"duplicate doc_id (first seen in {seen[doc['doc_id']]})")
        seen[doc["doc_id"]] = doc["source"]
        by_source[doc["source"]] = by_source.get(doc["source"], 0) + 1
        writer.write_batch([doc])
    writer.close()
    if not seen and not data.dpr_passages:
        raise InputError(data.data_root, "data", "no documents were read")
    return {"stats": {"documents_by_source": by_source}}


# ---------------------------------------------------------------- questions
def build_questions(params: QuestionParams, inputs: dict[str, Artifact], out: Path) -> dict:
    data = params.data
    if data.squad:
        questions = _squad_questions(data, params.split, inputs["ingest_documents"])
    elif data.qa:
        questions = _qa_questions(data)
    else:
        return _build_beir_questions(data, out)
    write_table(out, pa.Table.from_pylist(questions, schema=schemas.QUESTIONS), name="questions")
    by_split: dict[str, int] = {}
    for q in questions:
        by_split[q["split"]] = by_split.get(q["split"], 0) + 1
    stats = {"questions_by_split": by_split}
    if data.squad:
        articles: dict[str, set] = {}
        for q in questions:
            articles.setdefault(q["split"], set()).add(q["doc_id"])
        stats["articles_by_split"] = {s: sorted(ids) for s, ids in sorted(articles.items())}
    return {"stats": stats}


def _squad_questions(data: DataConfig, split: SplitConfig, documents: Artifact) -> list[dict]:
    from tasks.readers.squad import iter_squad_questions

    path = squad_path(data)
    known = documents.read_table(columns=["doc_id", "title"])
    doc_ids = set(known.column("doc_id").to_pylist())
    questions = [q for q in iter_squad_questions(path) if q["doc_id"] in doc_ids]
    title_to_id = dict(zip(known.column("title").to_pylist(), known.column("doc_id").to_pylist()))
    explicit = {}
    for name, titles in split.articles.items():
        missing = [t for t in titles if t not in title_to_id]
        if missing:
            raise InputError(str(path), f"split.articles.{name}", f"unknown article titles {missing[:5]}")
        explicit[name] = [title_to_id[t] for t in titles]
    splits = assign_article_splits(sorted({q["doc_id"] for q in questions}), split.ratios, split.seed, explicit)
    for q in questions:
        q["split"] = splits[q["doc_id"]]
    return questions


def _qa_questions(data: DataConfig) -> list[dict]:
    from tasks.readers.dpr import iter_dpr_qa
    from tasks.readers.nq_open import iter_nq_open

    questions, seen = [], {}
    for f in data.qa.files:
        path = existing(data, f.path, f"{f.format} question file")
        reader = iter_nq_open(path, split=f.split) if f.format == "nq_open" else iter_dpr_qa(path, split=f.split)
        for q in reader:
            if q["qid"] in seen:
                raise InputError(path, f"question {q['qid']!r}", f"duplicate qid (also in {seen[q['qid']]})")
            seen[q["qid"]] = path.name
            questions.append(q)
    if not questions:
        raise InputError(data.data_root, "data.qa", "no questions were read")
    return questions


def _build_beir_questions(data: DataConfig, out: Path) -> dict:
    from tasks.readers.beir import iter_beir_qrels, iter_beir_queries

    path = beir_path(data)
    qrels_rows, split_of = [], {}
    for split in data.beir.qrels_splits:
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


def stages(cfg, earlier: list[Stage]) -> list[Stage]:
    return [
        Stage("ingest_documents", "documents", "1", (), data_params(cfg.data), build_documents),
        Stage("ingest_questions", "questions", "1", ("ingest_documents",),
              data_params(cfg.data, QuestionParams, split=cfg.split), build_questions),
    ]
