"""Question-generation family (doc2query, papers 002 and 003): the `qgen:` config section and its
stages. `qgen_model` fine-tunes a generator on the train split's gold (passage -> question) pairs
(dev pairs choose the checkpoint); `synthetic_queries` samples C queries for the corpus's passages
in resumable shards; `pairs:synthetic` turns them into training pairs (optionally kept only when
BM25 ranks their own passage in its top k: round-trip consistency)."""
from __future__ import annotations

import logging
import random
import shutil
import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal, Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from models.generator_runtime import GeneratorPrecision, GeneratorRuntime, load_on_runtime, resolve_generator_runtime
from storage import Artifact
from storage.parquet import write_table
from storage.shards import move_shards_into
from tasks import schemas
from tasks.compute.device import resolve_device
from tasks.engine import Pinned, Stage, StageParams
from tasks.progress import progress_logger
from tasks.qgen.finetune import GeneratorTrainArgs
from tasks.stage_refs import pinned_version
from tasks.runners import LOCAL, RunnerConfig, run_shards, runner_stats, worker_cached

logger = logging.getLogger("passage_forge")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GeneratorFinetune(GeneratorTrainArgs):
    enabled: bool = Field(True, description="fine-tune the generator on the train split's gold pairs first")
    max_pairs: Optional[int] = Field(None, ge=1, description="at most this many train pairs (seeded sample)")
    max_dev_pairs: Optional[int] = Field(200, ge=1, description="at most this many dev pairs for the dev loss")


class GenerateConfig(_Strict):
    # Paper 002 section 3.1: nucleus sampling with top-p 0.95 and top-k 25; C queries per passage
    # (paper 002 table 3: 5; paper 003 uses 3).
    queries_per_passage: int = Field(5, ge=1, description="C: distinct queries sampled per passage")
    top_p: float = Field(0.95, gt=0, le=1)
    top_k: int = Field(25, ge=1)
    max_new_tokens: int = Field(32, ge=1)
    max_source_len: int = Field(256, ge=16, description="passage tokens in the prompt")
    batch_size: int = Field(16, ge=1)
    shard_size: int = Field(256, ge=1, description="passages per resumable shard")
    seed: int = 0
    max_passages: Optional[int] = Field(None, ge=1, description="a seeded sample of the corpus (CPU runs); empty: every passage")
    prefer_splits: list[str] = Field(default_factory=list, description=(
        "with max_passages: the passages of these splits' articles first, the rest a seeded sample (corpus text "
        "only: their questions are never read)"))
    device: str = Field("auto", description="'auto' picks CUDA when present")
    # Resolved when the run is planned (models/generator_runtime.py `resolve_generator_runtime`): the version
    # hashes the runtime and precision that sample, since they change the questions.
    runtime: GeneratorRuntime = Field("auto", description=(
        "'auto': on a CPU, for a Llama-family causal generator (e.g. smollm2), llamacpp when llama_cpp imports, else "
        "ctranslate2 when it imports; else torch"))
    compute_type: GeneratorPrecision = Field("auto", description=(
        "llamacpp's and ctranslate2's precision ('auto': int8, llama.cpp's q8_0, or for llamacpp bfloat16 where the CPU "
        "and the llama.cpp build have AVX-512 bf16; bfloat16: llamacpp only); torch always generates in float32"))


class QgenConfig(_Strict):
    generator: str = Field("smollm2", description=(
        "seq2seq (T5, e.g. doc2query/all-with-prefix-t5-base-v1) or causal LM: a short name, folder or hub name; or a "
        "generator another run fine-tuned, 'other.yaml:qgen_model' or 'qgen_model:VERSION' (with finetune.enabled: false)"))
    kind: Literal["auto", "seq2seq", "causal"] = "auto"
    prefix: Optional[str] = Field(None, description="input prefix of a seq2seq generator (e.g. 'text2query: ')")
    finetune: GeneratorFinetune = Field(default_factory=GeneratorFinetune)
    generate: GenerateConfig = Field(default_factory=GenerateConfig)
    filter_bm25_top_k: Optional[int] = Field(None, ge=1, description="keep a synthetic pair only when BM25 ranks its passage in the top k")
    quality_split: str = Field("dev", description="gold questions of this split are the references of BLEU/ROUGE")


class FinetuneParams(StageParams):
    # Checkpointing only decides what a killed run can resume from, not what it trains.
    RUNTIME = frozenset({"device", "train.checkpoint_every", "train.keep_checkpoints"})
    generator: str
    kind: str
    prefix: Optional[str]
    train: GeneratorFinetune
    device: str


class GenerateParams(StageParams):
    RUNTIME = frozenset({"generate.device", "runner"})
    generator: str
    kind: str
    prefix: Optional[str]
    model_input: Optional[str]   # qgen_model when fine-tuned
    generate: GenerateConfig
    quality_split: str           # the gold questions the generated ones are compared with
    runner: RunnerConfig = LOCAL


class SyntheticPairsParams(StageParams):
    filter_bm25_top_k: Optional[int]


def resolved_generate(q: QgenConfig) -> GenerateConfig:
    """`q.generate` with its runtime and precision resolved for this machine and generator."""
    g = q.generate
    device = resolve_device(g.device) if g.runtime == "auto" else g.device
    runtime, compute_type = resolve_generator_runtime(g.runtime, g.compute_type, q.generator, q.kind, device)
    return g.model_copy(update={"runtime": runtime, "compute_type": compute_type})


def _pair_rows(pairs: pa.Table, passages: pa.Table, split: str, limit: Optional[int], seed: int):
    by_pid = {p["pid"]: (p["title"], p["text"]) for p in passages.select(["pid", "title", "text"]).to_pylist()}
    rows = [(by_pid[r["pid"]], r["query"]) for r in pairs.filter(pc.equal(pairs.column("split"), split)).to_pylist()]
    if limit is not None and len(rows) > limit:
        rows = random.Random(seed).sample(rows, limit)
    return rows


def build_finetune(params: FinetuneParams, inputs: dict[str, Artifact], out: Path, work: Optional[Path] = None) -> dict:
    from models.generator import load_generator
    from tasks.qgen.finetune import finetune_generator
    from tasks.training.resumable import keep_record, training_dir, training_times

    t = params.train
    pairs, passages = inputs["pairs:gold"].read_table(), inputs["chunk"].read_table(columns=["pid", "title", "text"])
    # Train split only: no dev or test question ever reaches the generator's training.
    train = _pair_rows(pairs, passages, "train", t.max_pairs, t.seed)
    dev = _pair_rows(pairs, passages, "dev", t.max_dev_pairs, t.seed)
    generator = load_generator(params.generator, params.kind, params.prefix)
    logger.info("qgen: fine-tuning %s on %d train pairs (%d dev pairs)", params.generator, len(train), len(dev))
    train_dir = training_dir(out, work)
    result = finetune_generator(generator, train, dev, t, train_dir, device=resolve_device(params.device))
    shutil.copytree(train_dir / "best", out / "model")  # a generator folder: load_generator reads it
    for copy in ("best", "final", "checkpoints"):  # model/ holds the chosen weights; history and curve stay
        shutil.rmtree(out / "training" / copy, ignore_errors=True)
    keep_record(train_dir, out)
    return {"stats": {"train_pairs": len(train), "dev_pairs": len(dev), "best_step": result["best_step"],
                      "best_dev_loss": result["best_metric"], "dev_curve": result["dev_curve"],
                      **training_times(result)}}


def sample_passages(passages: pa.Table, limit: Optional[int], seed: int,
                    preferred_docs: frozenset[str] = frozenset()) -> pa.Table:
    """At most `limit` passages in corpus order: those of `preferred_docs` first (a seeded sample
    of them if they alone exceed the limit), then a seeded sample of the others."""
    if limit is None or passages.num_rows <= limit:
        return passages
    rng = random.Random(seed)
    docs = passages.column("doc_id").to_pylist() if preferred_docs else [None] * passages.num_rows
    preferred = [i for i, d in enumerate(docs) if d in preferred_docs]
    others = [i for i, d in enumerate(docs) if d not in preferred_docs]
    keep = rng.sample(preferred, min(limit, len(preferred)))
    keep += rng.sample(others, limit - len(keep))
    return passages.take(pa.array(sorted(keep)))


def docs_of_splits(questions: pa.Table, splits: list[str]) -> frozenset[str]:
    """The documents (articles) that questions of `splits` are about."""
    return frozenset(d for d, s in zip(questions.column("doc_id").to_pylist(), questions.column("split").to_pylist())
                     if s in splits and d is not None)


@dataclass(frozen=True)
class _GenerateJob:
    """What every generation shard shares (small and picklable: it travels to the runner's workers)."""
    source: str              # the generator: a fine-tuned model folder, or a name
    kind: str
    prefix: Optional[str]
    generate: GenerateConfig
    n_shards: int


# Sampling draws from torch's global RNG (seeded per shard): two shards generating at once in one
# process (the threads runner) would interleave their draws, so one generates at a time.
_generating = threading.Lock()


def _generate_shard(job: _GenerateJob, spec: tuple[int, list, list, list]) -> pa.Table:
    """Shard i's passages (pids, titles, texts): C sampled queries each, seeded by the shard."""
    import torch

    from models.generator import load_generator

    i, pids, titles, texts = spec
    g, device = job.generate, resolve_device(job.generate.device)

    def load():
        return load_on_runtime(load_generator(job.source, job.kind, job.prefix), job.source, g.runtime,
                               g.compute_type, device, threads)

    # runners pin torch's threads per shard (models/threads.py); CTranslate2 takes that count when
    # built, so it is part of the key
    threads = torch.get_num_threads()
    key = ("generator", job.source, job.kind, job.prefix, device, g.runtime, g.compute_type, threads)
    generator = worker_cached(key, load)
    with _generating:
        # Seeded per shard, so a resumed build samples what an uninterrupted one would.
        sampled = generator.generate(list(zip(titles, texts)), n=g.queries_per_passage, top_p=g.top_p, top_k=g.top_k,
                                     max_new_tokens=g.max_new_tokens, batch_size=g.batch_size, seed=g.seed + i,
                                     max_source_len=g.max_source_len, device=device,
                                     progress=progress_logger(f"synthetic queries: shard {i + 1}/{job.n_shards}: passages"))
    rows = [{"pid": pid, "n": n, "query": q, "logprob": lp}
            for pid, queries in zip(pids, sampled) for n, (q, lp) in enumerate(queries)]
    return pa.Table.from_pylist(rows, schema=schemas.SYNTHETIC_QUERIES)


def build_synthetic_queries(params: GenerateParams, inputs: dict[str, Artifact], out: Path, work: Path) -> dict:
    g = params.generate
    preferred = frozenset()
    if g.prefer_splits:
        preferred = docs_of_splits(inputs["ingest_questions"].read_table("questions", columns=["doc_id", "split"]),
                                   g.prefer_splits)
    passages = sample_passages(inputs["chunk"].read_table(columns=["pid", "doc_id", "title", "text"]),
                               g.max_passages, g.seed, preferred)
    source = str(inputs[params.model_input].subdir("model")) if params.model_input else params.generator
    n_shards = max(1, -(-passages.num_rows // g.shard_size))
    # Each shard carries its own passages (a shard's worth of text, not the corpus's, per worker);
    # a fully resumed build loads no model.
    specs = []
    for i in range(n_shards):
        shard = passages.slice(i * g.shard_size, g.shard_size)
        specs.append((i, *(shard.column(c).to_pylist() for c in ("pid", "title", "text"))))
    job = _GenerateJob(source, params.kind, params.prefix, g, n_shards)

    def report(i: int, reused: bool) -> None:
        logger.info("synthetic queries: shard %d/%d %s", i + 1, n_shards, "reused (resumed build)" if reused else "generated")

    files = run_shards(params.runner, work, specs, partial(_generate_shard, job), report, label="synthetic queries")
    move_shards_into(files, out)
    table = pa.concat_tables([pq.read_table(f) for f in files])
    per_passage = table.num_rows / max(passages.num_rows, 1)
    return {"stats": {"passages": passages.num_rows, "queries": table.num_rows, "queries_per_passage": round(per_passage, 3),
                      "shards": n_shards, "runtime": g.runtime, "compute_type": g.compute_type,
                      "quality": {**_quality(table, passages, inputs, params.quality_split),
                                  "runtime": g.runtime, "compute_type": g.compute_type},
                      **runner_stats(params.runner)}}


def _quality(table: pa.Table, passages: pa.Table, inputs: dict[str, Artifact], split: str) -> dict:
    """BLEU-4/ROUGE-L against the gold questions of `split` on the same passages, BM25 rank-1
    share of the own passage, duplicate share, examples."""
    from tasks.bm25.search import bm25_search
    from tasks.qgen.quality import bleu_rouge, duplicate_share

    generated: dict[str, list[str]] = {}
    for pid, query in zip(table.column("pid").to_pylist(), table.column("query").to_pylist()):
        generated.setdefault(pid, []).append(query)
    questions = inputs["ingest_questions"].read_table("questions", columns=["qid", "question", "split"])
    text_of = {q: t for q, t, s in zip(*(questions.column(c).to_pylist() for c in ("qid", "question", "split"))) if s == split}
    gold = inputs["link_gold"].read_table()
    references: dict[str, list[str]] = {}
    for qid, pid in zip(gold.column("qid").to_pylist(), gold.column("pid").to_pylist()):
        if qid in text_of:
            references.setdefault(pid, []).append(text_of[qid])
    ids = [f"{pid}\t{n}" for pid, n in zip(table.column("pid").to_pylist(), table.column("n").to_pylist())]
    runs = bm25_search(inputs["bm25_index"].subdir("index"), list(zip(ids, table.column("query").to_pylist())), k=1, system="bm25")
    first = sum(q.split("\t")[0] == p for q, p in zip(runs.column("qid").to_pylist(), runs.column("pid").to_pylist()))
    title_of = dict(zip(passages.column("pid").to_pylist(), passages.column("title").to_pylist()))
    examples = [{"pid": r["pid"], "title": title_of.get(r["pid"]), "query": r["query"]} for r in table.slice(0, 10).to_pylist()]
    return {**bleu_rouge(generated, references), "reference_split": split,
            "bm25_own_passage_first": first / max(table.num_rows, 1), "duplicate_share": duplicate_share(generated),
            "examples": examples}


def build_synthetic_pairs(params: SyntheticPairsParams, inputs: dict[str, Artifact], out: Path) -> dict:
    queries = inputs["synthetic_queries"].read_table()
    qids = [f"syn:{pid}:{n}" for pid, n in zip(queries.column("pid").to_pylist(), queries.column("n").to_pylist())]
    pairs = pa.table({"qid": qids, "query": queries.column("query"), "pid": queries.column("pid"),
                      "source": ["synthetic"] * queries.num_rows, "weight": pa.array([1.0] * queries.num_rows, pa.float32()),
                      "split": ["train"] * queries.num_rows}, schema=schemas.PAIRS)
    kept = pairs
    if params.filter_bm25_top_k is not None:
        from tasks.bm25.search import bm25_search

        runs = bm25_search(inputs["bm25_index"].subdir("index"), list(zip(qids, queries.column("query").to_pylist())),
                           k=params.filter_bm25_top_k, system="bm25")
        own = {(q, p) for q, p in zip(runs.column("qid").to_pylist(), runs.column("pid").to_pylist())}
        kept = pairs.filter(pa.array([(q, p) in own for q, p in zip(qids, queries.column("pid").to_pylist())]))
    write_table(out, kept)
    # the generation's runtime beside the round-trip rate, so runtimes compare in one table
    made_by = {k: inputs["synthetic_queries"].manifest.get("stats", {}).get(k) for k in ("runtime", "compute_type")}
    return {"stats": {"queries": pairs.num_rows, "pairs": kept.num_rows,
                      "round_trip_kept": kept.num_rows / max(pairs.num_rows, 1), **made_by}}


def stages(cfg, earlier: list[Stage]) -> list[Stage]:
    q = cfg.qgen
    if q is None:
        return []
    out = []
    model_input, pinned = None, {}
    trained_elsewhere = pinned_version(q.generator, "qgen_model")
    if trained_elsewhere is not None:
        # Issue 25: a generator another config fine-tuned (e.g. on SQuAD) writes this corpus's queries.
        if q.finetune.enabled:
            raise ValueError(f"qgen.generator {q.generator!r} is a generator fine-tuned by another run: set "
                             "qgen.finetune.enabled: false (this corpus's questions do not train it further)")
        model_input, pinned = "generator", {"generator": Pinned("qgen_model", trained_elsewhere)}
    if q.finetune.enabled:
        out.append(Stage("qgen_model", "qgen_model", "1", ("chunk", "pairs:gold"),
                         FinetuneParams(generator=q.generator, kind=q.kind, prefix=q.prefix,
                                        train=q.finetune.resolved_for(q.generate.device),
                                        device=q.generate.device), build_finetune, resumable=True))
        model_input = "qgen_model"
    out.append(Stage("synthetic_queries", "synthetic_queries", "1",
                     ("chunk", "ingest_questions", "link_gold", "bm25_index", *(["qgen_model"] if q.finetune.enabled else [])),
                     GenerateParams(generator=q.generator, kind=q.kind, prefix=q.prefix, model_input=model_input,
                                    generate=resolved_generate(q), quality_split=q.quality_split, runner=cfg.runner),
                     build_synthetic_queries, pinned=pinned, resumable=True))
    filter_inputs = ("bm25_index",) if q.filter_bm25_top_k else ()
    out.append(Stage("pairs:synthetic", "pairs", "1", ("synthetic_queries", *filter_inputs),
                     SyntheticPairsParams(filter_bm25_top_k=q.filter_bm25_top_k), build_synthetic_pairs,
                     variant={"source": "synthetic"}))
    return out
