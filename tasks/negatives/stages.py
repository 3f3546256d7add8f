"""Negatives family: the `negatives:` config section and one `negatives:STRATEGY` stage per
strategy a trained system names (paper 003 section 4): bm25, context, random, the dense-mined
ones (coarse, fine, self-mined: any name under `negatives.dense`), and `mixed` (a pool of several).
Every strategy writes the same table (qid, pid, strategy, rank, score, text), which any trainer
reads as data."""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, model_validator

from storage import Artifact
from storage.parquet import write_table
from tasks.compute.encode import EncodeSettings
from tasks.compute.origin import Origin, origin_of
from tasks.compute.score import ScoreJob, ScoringSettings, cross_encoder_on
from tasks.compute.search import QUERY_VECTORS
from tasks.engine import Stage, StageParams
from tasks.negatives.mining import context_negatives
from tasks.qgen.as_questions import synthetic_queries_as_questions
from tasks.runners import LOCAL, RunnerConfig, run_shards, runner_stats

logger = logging.getLogger("passage_forge")


class RunNegativesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # Paper 003 section 5.3: a pool of M = 100 negatives per question.
    depth: int = Field(100, ge=1, description="M: candidates mined per question (before filtering)")
    filter_answers: bool = Field(True, description="drop passages that contain an answer (paper 003 section 4.1)")
    splits: list[str] = Field(default_factory=lambda: ["train"], description="splits whose questions are mined")
    # Issue 25 (GPL's recipe, papers 002/003's queries): a corpus without questions trains on the
    # generated queries, so they need negatives of their own; the query's own passage is its gold.
    synthetic: bool = Field(False, description="also mine for the generated queries (pairs:synthetic; needs qgen:)")


class RandomNegativesConfig(RunNegativesConfig):
    seed: int = Field(13, description="draws are seeded per (seed, question)")


class DenseNegativesConfig(RunNegativesConfig):
    system: str = Field(..., description="the dense system whose encoder mines: its passage vectors (encode:SYSTEM) "
                                         "and question vectors (search:SYSTEM)")


#: Strategy names with their own meaning; the `dense:` entries take any other name.
BUILT_IN = ("bm25", "context", "random", "mixed")


class NegativesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    bm25: RunNegativesConfig = Field(default_factory=RunNegativesConfig, description="BM25 negatives")
    random: RandomNegativesConfig = Field(default_factory=RandomNegativesConfig, description="uniformly drawn passages")
    # Paper 003 section 4.2: coarse (a 25-d encoder) and fine (512-d) negatives; paper 002
    # figure 3: self-mined (retriever 1 mines for retriever 2). Each is a named dense miner.
    dense: dict[str, DenseNegativesConfig] = Field(default_factory=dict, description=(
        "dense-mined strategies by name, e.g. {coarse: {system: coarse25}, fine: {system: fine512}}"))
    # Paper 003 section 5 ("mixing all 4 hard negatives"): one pool from all four kinds.
    mixed: list[str] = Field(default_factory=lambda: ["coarse", "fine", "bm25", "context"],
                             description="the strategies a system naming `mixed` draws from")
    shard_size: int = Field(65536, ge=1, description="passage vectors per block of dense mining (memory bound)")
    questions_per_shard: int = Field(16384, ge=1, description=(
        "questions per dense-mining shard, the runner's unit of work (rounded down to a multiple of 1024, at "
        "least 1024): each shard streams every passage vector once, so fewer, larger shards read less"))
    judge_shard_size: int = Field(20000, ge=1, description="(question, passage) pairs per shard of cross-encoder "
                                                           "judging (drop_relevant_above), the runner's unit of work")
    # The cross-attention classifier of paper 001 (cross_encoder:) judges mined negatives; one it
    # deems an answer (p above the threshold) is a false negative and is dropped.
    drop_relevant_above: Optional[float] = Field(
        None, ge=0, le=1, description="drop a mined negative whose cross-encoder p exceeds this (needs cross_encoder:)")

    @model_validator(mode="after")
    def _names(self):
        taken = [n for n in self.dense if n in BUILT_IN]
        if taken:
            raise ValueError(f"dense strategy names {taken} are built-in strategies; pick other names")
        return self

    def expand(self, names: list[str]) -> list[str]:
        """A system's negatives list with `mixed` replaced by its members, each once, in order."""
        out: list[str] = []
        for name in names:
            for n in (self.mixed if name == "mixed" else [name]):
                if n not in out:
                    out.append(n)
        return out


class SyntheticMining(BaseModel):
    """How the generated queries (pairs:synthetic) are searched: BM25's parameters (bm25 source),
    or the dense miner's encoder (it encodes them; its question vectors exist, theirs do not)."""
    model_config = ConfigDict(frozen=True, extra="forbid")
    bm25_k1: Optional[float] = None
    bm25_b: Optional[float] = None
    miner_origin: Optional[Origin] = None
    miner_encode: Optional[EncodeSettings] = None


class MineParams(StageParams):
    RUNTIME = frozenset({"shard_size", "questions_per_shard", "judge_shard_size", "runner",
                         "synthetic.miner_origin.init_path"})
    strategy: str
    source: str             # bm25_search, random, or search:SYSTEM
    depth: int
    filter_answers: bool
    splits: list[str]
    match_type: str
    seed: Optional[int] = None
    shard_size: int = 65536
    drop_relevant_above: Optional[float] = None
    questions_per_shard: int = 16384
    judge_shard_size: int = 20000
    judge_scoring: Optional[ScoringSettings] = None  # how the cross_encoder judges (with drop_relevant_above)
    runner: RunnerConfig = LOCAL
    synthetic: Optional[SyntheticMining] = None     # the generated queries are mined too
    ADDED = {"synthetic": None}


def build_mined_negatives(params: MineParams, inputs: dict[str, Artifact], out: Path, work: Optional[Path] = None) -> dict:
    """Candidates of the strategy's source for the questions of `splits`, filtered of gold and
    answer-bearing passages; stats record the filtered share (and why). Dense mining (the costly
    part) runs in resumable question shards on the configured runner, in `work`."""
    from tasks.negatives.mining import filter_candidates, random_candidates, run_candidates

    questions = inputs["ingest_questions"].read_table("questions", columns=["qid", "question", "answers", "split"])
    questions = questions.filter(pc.is_in(questions.column("split"), value_set=pa.array(params.splits, pa.string())))
    gold = inputs["link_gold"].read_table().select(["qid", "pid"])
    synthetic = None
    if params.synthetic is not None:
        synthetic = synthetic_queries_as_questions(inputs["pairs:synthetic"].read_table(columns=["qid", "query", "pid"]))
        gold = pa.concat_tables([gold, synthetic.select(["qid", "pid"]).cast(gold.schema)])
    passages = inputs["chunk"].read_table(columns=["pid", "text"])
    text_of = dict(zip(passages.column("pid").to_pylist(), passages.column("text").to_pylist()))
    if params.source == "random":
        mined = questions if synthetic is None else pa.concat_tables([questions, synthetic.drop_columns(["pid"])])
        candidates = random_candidates(mined.column("qid").to_pylist(), passages.column("pid").to_pylist(),
                                       params.depth, params.seed or 0)
    elif params.source.startswith("search:"):
        candidates = _dense_candidates(params, inputs, questions, work, synthetic)
    else:
        candidates = run_candidates(inputs[params.source].read_table(), questions.column("qid"), params.depth)
        if synthetic is not None:  # the generated queries have no run: BM25 searches them here
            candidates = itertools.chain(candidates, _bm25_candidates(params, inputs, synthetic))
    if synthetic is not None:
        questions = pa.concat_tables([questions, synthetic.drop_columns(["pid"])])
    judge = _relevance_judge(params, inputs, work) if params.drop_relevant_above is not None else None
    negatives, counts = filter_candidates(candidates, questions, text_of, gold,
                                          params.strategy, params.filter_answers, params.match_type, is_relevant=judge)
    write_table(out, negatives)
    logger.info("negatives:%s: %d kept of %d candidates (%.1f%% filtered)", params.strategy, counts["kept"],
                counts["candidates"], 100 * counts["filtered_share"])
    mined_synthetic = {"synthetic_queries": synthetic.num_rows} if synthetic is not None else {}
    return {"stats": {"questions": len(set(negatives.column("qid").to_pylist())), "negatives": negatives.num_rows,
                      **mined_synthetic, "filtering": counts, **runner_stats(params.runner)}}


def _bm25_candidates(params: MineParams, inputs: dict[str, Artifact], synthetic: pa.Table):
    """BM25's top `depth` for each generated query, as for questions (its own passage is then
    dropped as gold)."""
    from tasks.bm25.search import bm25_search
    from tasks.negatives.mining import run_candidates

    items = list(zip(synthetic.column("qid").to_pylist(), synthetic.column("question").to_pylist()))
    runs = bm25_search(inputs["bm25_index"].subdir("index"), items, k=params.depth, k1=params.synthetic.bm25_k1,
                       b=params.synthetic.bm25_b, system="bm25")
    return run_candidates(runs, synthetic.column("qid"), params.depth)


def _judge_shard(job, spec: tuple[int, list[tuple[str, str]]]) -> pa.Table:
    """Shard i's (question, passage) pairs scored by the classifier (a `ScoreJob`): p per pair, in order."""
    from tasks.progress import progress_logger

    i, pairs = spec
    device = job.scoring.device(job.device)
    p = cross_encoder_on(job.model, device, job.scoring).score(pairs, job.batch_size, device=device,
                                                               bf16=job.scoring.autocast_bf16(device),
                                                               progress=progress_logger(
                                                                   f"{job.label}: shard {i + 1}/{job.n_shards}: judged"))
    return pa.table({"p": pa.array(p, pa.float32())})


def _relevance_judge(params: MineParams, inputs: dict[str, Artifact], work: Path):
    """The filter hook backed by the cross_encoder stage's classifier, scoring in resumable shards
    of `judge_shard_size` pairs on the configured runner: True where p > the threshold."""
    import pyarrow.parquet as pq

    def is_relevant(pairs):
        pairs = [tuple(pair) for pair in pairs]
        step = params.judge_shard_size
        specs = [(i, pairs[start:start + step]) for i, start in enumerate(range(0, len(pairs), step))]
        job = ScoreJob(str(inputs["cross_encoder"].subdir("model")), "auto", 64, len(specs),
                       label=f"negatives:{params.strategy}: judge", scoring=params.judge_scoring or ScoringSettings())
        (work / "judge").mkdir(exist_ok=True)  # its own shard plan, beside the mining's
        files = run_shards(params.runner, work / "judge", specs, partial(_judge_shard, job), label=job.label)
        p = pa.concat_tables([pq.read_table(f) for f in files]).column("p").to_numpy()
        return list(p > params.drop_relevant_above)
    return is_relevant


@dataclass(frozen=True)
class _MineJob:
    """What every dense-mining shard shares (small and picklable: it travels to the runner's workers)."""
    queries: str                # the mined questions' vectors, in the work folder
    passages: tuple[str, ...]   # the encoder's passage-vector files, streamed in this order
    passage_rows: int
    shard_size: int             # passage vectors held at a time
    depth: int
    query_block: int
    label: str
    n_shards: int


def _mine_shard(job: _MineJob, spec: tuple[int, int, int]) -> pa.Table:
    """Shard i: the top-`depth` passages of questions [start, stop), over all passage vectors
    (exact, and independent per question, so any question partition gives the same rows)."""
    import numpy as np

    from storage.shards import read_rows
    from tasks.compute.embeddings import vectors_from_table
    from tasks.negatives.blocked_topk import iter_vector_shards
    from tasks.negatives.mining import dense_candidates
    from tasks.progress import progress_logger

    i, start, stop = spec
    qids, matrix = vectors_from_table(read_rows(Path(job.queries), start, stop))
    progress = progress_logger(f"{job.label}: shard {i + 1}/{job.n_shards}: passages")

    def passages():
        done = 0
        for pids, vectors in iter_vector_shards([Path(f) for f in job.passages], job.shard_size):
            yield pids, vectors
            done += len(pids)
            progress(done, job.passage_rows)
    found = list(dense_candidates(qids, matrix.astype(np.float32), passages(), job.depth, job.query_block))
    columns = list(zip(*found)) or [[], [], [], []]
    return pa.table(dict(zip(CANDIDATE_COLUMNS, columns)), schema=CANDIDATES)


#: Questions scored against a passage block at once. Mining shards start at multiples of it, so
#: every partition computes the very same score tiles: the same bits as one pass.
QUERY_BLOCK = 1024

#: A mining shard's rows: (qid, pid, rank, score), the float32 scores kept exactly.
CANDIDATES = pa.schema([("qid", pa.string()), ("pid", pa.string()), ("rank", pa.int32()), ("score", pa.float64())])
CANDIDATE_COLUMNS = CANDIDATES.names


def _synthetic_vectors(params: MineParams, inputs: dict[str, Artifact], synthetic: pa.Table, work: Path) -> pa.Table:
    """The generated queries encoded by the miner's encoder (kept in `work`: a resumed build
    does not encode them again)."""
    import pyarrow.parquet as pq

    from storage.shards import write_shard
    from tasks.compute.embeddings import query_vectors_table

    done = work / "synthetic_vectors.parquet"
    if not done.exists():
        how = params.synthetic
        settings, device = how.miner_encode, how.miner_encode.device("auto")
        model = settings.for_inference(how.miner_origin.load(inputs), device)
        logger.info("negatives:%s: encoding %d generated queries", params.strategy, synthetic.num_rows)
        vectors = settings.encode(model, synthetic.column("question").to_pylist(), "query", device,
                                  log=lambda m: logger.info("negatives:%s: %s", params.strategy, m))
        write_shard(done, query_vectors_table(synthetic.column("qid").to_pylist(), vectors))
    return pq.read_table(done)


def _dense_candidates(params: MineParams, inputs: dict[str, Artifact], questions: pa.Table, work: Path,
                      synthetic: Optional[pa.Table] = None):
    import pyarrow.parquet as pq

    from storage.parquet import parquet_rows
    from storage.shards import write_shard

    wanted = questions.column("qid")
    vectors = inputs[params.source].read_table(QUERY_VECTORS)
    vectors = vectors.filter(pc.is_in(vectors.column("qid"), value_set=wanted)).select(["qid", "vector"])
    if synthetic is not None:
        vectors = pa.concat_tables([vectors, _synthetic_vectors(params, inputs, synthetic, work).cast(vectors.schema)])
    queries = write_shard(work / "queries.parquet", vectors)  # what every shard reads its questions from
    passages = inputs[params.source.replace("search:", "encode:", 1)].table_files()
    n = vectors.num_rows
    step = max(1, params.questions_per_shard // QUERY_BLOCK) * QUERY_BLOCK
    specs = [(i, start, min(start + step, n)) for i, start in enumerate(range(0, n, step))]
    job = _MineJob(str(queries), tuple(str(f) for f in passages), sum(parquet_rows(f) for f in passages),
                   params.shard_size, params.depth, QUERY_BLOCK, f"negatives:{params.strategy}", len(specs))
    files = run_shards(params.runner, work, specs, partial(_mine_shard, job), label=job.label) if specs else []
    for f in files:  # the filter walks them in order; one shard's rows in memory at a time
        table = pq.read_table(f, schema=CANDIDATES)
        yield from zip(*(table.column(c).to_pylist() for c in CANDIDATE_COLUMNS))


class ContextParams(StageParams):
    pairs: list[str]  # the pairs stages whose positives get context negatives


def build_context_negatives(params: ContextParams, inputs: dict[str, Artifact], out: Path) -> dict:
    pairs = pa.concat_tables([inputs[name].read_table() for name in params.pairs])
    questions = inputs["ingest_questions"].read_table("questions", columns=["qid", "answers"])
    answers = dict(zip(questions.column("qid").to_pylist(), questions.column("answers").to_pylist()))
    negatives = context_negatives(pairs, inputs["chunk"].read_table(columns=["pid", "doc_id", "chunk_index", "text"]), answers)
    write_table(out, negatives)
    halves = pc.sum(pc.invert(pc.is_null(negatives.column("text")))).as_py() or 0
    return {"stats": {"queries": len(set(negatives.column("qid").to_pylist())), "negatives": negatives.num_rows,
                      "half_passages": halves}}


def _trained(cfg) -> list:
    return [s for s in (cfg.dense.systems if cfg.dense else []) if s.train]


def wanted_strategies(cfg) -> set[str]:
    """Every strategy some trained system draws from, `mixed` expanded."""
    return {n for s in _trained(cfg) for n in cfg.negatives.expand(s.train.negatives)}


def stages(cfg, earlier: list[Stage]) -> list[Stage]:
    out = []
    c = cfg.negatives
    wanted = wanted_strategies(cfg)
    if "context" in wanted:
        # Paper 003 section 4.1: the other passages of the positive's document.
        sources = sorted({p for s in _trained(cfg) if "context" in c.expand(s.train.negatives) for p in s.train.pairs})
        stages_ = [f"pairs:{p}" for p in sources]
        out.append(Stage("negatives:context", "negatives", "1", ("ingest_questions", "chunk", *stages_),
                         ContextParams(pairs=stages_), build_context_negatives, variant={"strategy": "context"}))
    common = dict(match_type=cfg.evaluation.match_type, shard_size=c.shard_size, drop_relevant_above=c.drop_relevant_above,
                  questions_per_shard=c.questions_per_shard, judge_shard_size=c.judge_shard_size, runner=cfg.runner)
    judge = ("cross_encoder",) if c.drop_relevant_above is not None else ()
    if judge and cfg.cross_encoder is not None:
        common["judge_scoring"] = ScoringSettings.of(cfg.cross_encoder)
    mined = {}
    if "bm25" in wanted:
        mined["bm25"] = ("bm25_search", c.bm25, ())
    if "random" in wanted:
        mined["random"] = ("random", c.random, ())
    for name, miner in c.dense.items():
        if name in wanted:
            mined[name] = (f"search:{miner.system}", miner, (f"encode:{miner.system}",))
    for name, (source, conf, extra) in mined.items():
        synthetic, synthetic_inputs, pinned = _synthetic_mining(cfg, name, source) if conf.synthetic else (None, (), {})
        params = MineParams(strategy=name, source=source, depth=conf.depth, filter_answers=conf.filter_answers,
                            splits=conf.splits, seed=getattr(conf, "seed", None), synthetic=synthetic, **common)
        sources = (source, *extra) if source != "random" else ()
        inputs = ("ingest_questions", "chunk", "link_gold", *sources, *synthetic_inputs, *judge)
        out.append(Stage(f"negatives:{name}", "negatives", "3", tuple(dict.fromkeys(inputs)),
                         params, build_mined_negatives, variant={"strategy": name}, pinned=pinned,
                         resumable=source.startswith("search:") or bool(judge)))
    return out


def _synthetic_mining(cfg, name: str, source: str) -> tuple[SyntheticMining, tuple[str, ...], dict]:
    """What mining the generated queries adds to strategy `name`: its SyntheticMining, its inputs
    (pairs:synthetic and what searches them) and pinned inputs (a dense miner's model)."""
    if cfg.qgen is None:
        raise ValueError(f"negatives.{name}.synthetic mines the generated queries, which needs a qgen: section")
    if source == "bm25_search":
        return SyntheticMining(bm25_k1=cfg.bm25.k1, bm25_b=cfg.bm25.b), ("pairs:synthetic", "bm25_index"), {}
    if source.startswith("search:"):
        system = next(s for s in cfg.dense.systems if s.name == source.split(":", 1)[1])
        origin, model_stages, pinned = origin_of(system, cfg.config_dir)
        how = SyntheticMining(miner_origin=origin, miner_encode=EncodeSettings.of(cfg.dense.encode))
        return how, ("pairs:synthetic", *model_stages), pinned
    return SyntheticMining(), ("pairs:synthetic",), {}
