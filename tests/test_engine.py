"""The stage engine: what each stage's version hashes, the plan of every shipped config, and the
engine's own checks (unknown inputs, cycles, pinned inputs)."""
import pytest

from flows.registry import FAMILIES, plan_for
from tasks.config import PROJECT_ROOT, FusionConfig, PipelineConfig, load_config
from tasks.engine import NoParams, Pinned, Plan, PlanError, Stage, StageParams

# nq-open-dpr-tsv.yaml needs DPR's passage file, which this machine lacks (tests/test_input_sources.py
# checks that planning it names the missing file).
CONFIGS = sorted(p for p in (PROJECT_ROOT / "configs").glob("*.yaml") if p.stem != "nq-open-dpr-tsv")
# What may stay out of a version: where and how fast a stage computes, never what it computes.
RUNTIME_ALLOWED = {"device", "generate.device", "threads", "shard_size", "data_root", "dpr_passages", "tsv_paths",
                   "origin.init_path", "dense_origin.init_path", "config.device",
                   "config.shard_size", "runner", "questions_per_shard", "judge_shard_size",
                   # the classifier trains and reports with torch: how later stages score is theirs to hash
                   "config.runtime", "config.int8", "config.bf16",
                   # checkpointing decides what a killed trainer resumes from, not what it trains
                   "train.checkpoint_every", "train.keep_checkpoints", "train.schedule.checkpoint_every",
                   "train.schedule.keep_checkpoints", "config.train.checkpoint_every",
                   "config.train.keep_checkpoints",
                   # how many rows a training step encodes at a time (the same vectors; models/length_pieces.py)
                   "train.length_pieces", "config.train.length_pieces", "length_pieces",
                   # a model folder's path (its digest is hashed): the generated queries' miner, an imported classifier
                   "synthetic.miner_origin.init_path", "folder", "start_folder",
                   # always empty where the classifier trains (a named one is imported by another stage)
                   "config.model"}


def _config(**changes) -> PipelineConfig:
    """The tiny config with two dense systems (one trained), a hybrid and an RRF fusion."""
    raw = load_config(PROJECT_ROOT / "configs" / "tiny.yaml").model_dump()
    raw["dense"] = {"systems": [{"name": "zs"}, {"name": "tr", "train": {"max_steps": 2, "loss": "weighted",
                                                                        "pairs": ["gold", "silver"]}}],
                    "hybrid": {"system": "tr"}}
    raw["cross_encoder"] = {"dense_system": "zs"}
    raw["silver"] = {"queries": ["train"]}
    raw["rerank"] = [{"run": "hybrid(tr)", "depth": 10}]
    raw["fusion"] = [{"name": "rrf", "method": "rrf", "runs": ["bm25", "zs", "tr"]}]
    raw = PipelineConfig.model_validate(raw).model_dump()  # every field spelled out, to be changed
    for dotted, value in changes.items():
        node = raw
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[leaf] = value
    return PipelineConfig.model_validate(raw)


def _own(cfg: PipelineConfig, stage: str) -> dict:
    return plan_for(cfg)[stage].params.hashed()


# (stage, a change inside its parameters, a change outside them)
CASES = [
    ("ingest_documents", {"data.wikipedia_max_pages": 5}, {"chunk.words": 50}),
    ("ingest_questions", {"split.seed": 1}, {"bm25.k1": 1.2}),
    ("chunk", {"chunk.words": 50}, {"split.seed": 1}),
    ("link_gold", None, {"chunk.words": 50}),
    ("bm25_index", None, {"bm25.k1": 1.2}),
    ("bm25_search", {"bm25.k1": 1.2}, {"chunk.words": 50}),
    ("negatives:bm25", {"negatives.bm25.depth": 20}, {"bm25.k1": 1.2}),
    ("pairs:gold", None, {"negatives.bm25.depth": 20}),
    # The dev metric encodes with dense.encode's settings: they are the train stage's too.
    ("train:tr", {"dense.encode.passage_max_len": 128}, {"dense.index.kind": "hnsw"}),
    ("train:tr", {"dense.encode.query_max_len": 16}, {"dense.encode.shard_size": 10}),
    ("train:tr", {"dense.encode.batch_size": 8}, {"dense.hybrid.tune_k": 5}),
    ("train:tr", {"dense.systems.1.train.schedule.lr": 1e-4}, {"dense.systems.0.model.pooling": "cls"}),
    ("encode:zs", {"dense.encode.passage_max_len": 128}, {"dense.index.kind": "hnsw"}),
    ("encode:tr", {"dense.encode.dtype": "float16"}, {"dense.systems.1.train.schedule.lr": 1e-4}),
    ("index:zs", {"dense.index.kind": "hnsw"}, {"dense.encode.batch_size": 8}),
    ("search:zs", {"dense.encode.query_max_len": 16}, {"dense.index.kind": "hnsw"}),
    ("hybrid", {"dense.hybrid.tune_k": 5}, {"dense.encode.batch_size": 8}),
    ("fusion:rrf", {"fusion.0.rrf_k": 10}, {"dense.hybrid.tune_k": 5}),
    ("evaluate", {"evaluation.ks": [1, 5]}, {"bm25.k1": 1.2}),
    ("cross_encoder", {"cross_encoder.train.lr": 1e-4}, {"silver.top_k": 5}),
    ("cross_encoder", {"cross_encoder.dev_share": 0.2}, {"cross_encoder.device": "cpu"}),
    ("cross_encoder", {"cross_encoder.select_by": "log_loss"}, {"cross_encoder.train.checkpoint_every": 7}),
    ("cross_encoder", {"cross_encoder.train.seed": 5}, {"cross_encoder.train.length_pieces": 4}),
    ("train:tr", {"dense.systems.1.train.schedule.seed": 5}, {"dense.systems.1.train.length_pieces": None}),
    ("train:tr", {"dense.systems.1.train.schedule.passage_max_len": 100}, {"dense.systems.1.train.schedule.checkpoint_every": 3}),
    ("evaluate", {"evaluation.compare": [["tr", "zs"]]}, {"dense.systems.1.train.schedule.keep_checkpoints": 4}),
    ("pairs:silver", {"silver.threshold": 0.6}, {"cross_encoder.train.lr": 1e-4}),
    ("pairs:silver", {"silver.retriever": "zs"}, {"silver.shard_size": 10}),
    ("rerank:hybrid-tr-rerank", {"rerank.0.depth": 5}, {"rerank.0.shard_questions": 10}),
    # Where shards compute (runner:) is never part of a version.
    ("encode:zs", {"dense.encode.dtype": "float16"}, {"runner.kind": "dask"}),
    ("search:zs", {"dense.encode.query_max_len": 16}, {"runner.kind": "threads"}),
    ("pairs:silver", {"silver.top_k": 5}, {"runner.workers": 4}),
    ("rerank:hybrid-tr-rerank", {"rerank.0.depth": 5}, {"runner.kind": "dask"}),
    ("negatives:bm25", {"negatives.bm25.depth": 20}, {"runner.kind": "dask"}),
    ("negatives:bm25", {"negatives.bm25.splits": ["train", "dev"]}, {"negatives.questions_per_shard": 2048}),
    ("negatives:bm25", {"negatives.bm25.filter_answers": False}, {"negatives.judge_shard_size": 10}),
]


@pytest.mark.parametrize("stage,inside,outside", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_stage_hashes_exactly_its_own_parameters(shared_data, stage, inside, outside):
    base = _own(_config(), stage)
    assert _own(_config(**outside), stage) == base
    if inside is not None:
        assert _own(_config(**inside), stage) != base


def test_every_family_is_covered_by_the_version_cases(shared_data):
    declared = {s.name for s in plan_for(_config())}
    assert declared == {c[0] for c in CASES} | {"encode:tr", "index:tr", "search:tr"}
    assert len(FAMILIES) == len({f.__name__ for f in FAMILIES})


def test_the_train_stage_version_follows_the_dev_metric_encoding(shared_data):
    # Regression: the train stage's checkpoint choice encodes the dev pool with dense.encode's
    # batch size and lengths; a change there must not return a model chosen under other settings.
    plan, changed = plan_for(_config()), plan_for(_config(**{"dense.encode.passage_max_len": 64}))
    assert plan.planned_version("train:tr") != changed.planned_version("train:tr")
    assert plan.planned_version("bm25_search") == changed.planned_version("bm25_search")


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_shipped_config_plans_a_valid_dag(shared_data, path):
    plan = plan_for(load_config(path))
    names = plan.names()
    for stage in plan:
        assert set(stage.inputs) <= set(names[:names.index(stage.name)])  # inputs come first, no cycle
        assert stage.params.RUNTIME <= RUNTIME_ALLOWED
        plan.planned_version(stage.name)
    assert names[-1] == "evaluate"
    runs = [s.name for s in plan if s.produces_runs]
    assert set(plan["evaluate"].inputs) >= set(runs) and "bm25_search" in runs


def _stage(name, inputs=(), **kw):
    return Stage(name, name.replace(":", "_"), "1", tuple(inputs), NoParams(), lambda p, i, o: None, **kw)


def test_the_plan_refuses_unknown_inputs_cycles_and_duplicates():
    with pytest.raises(PlanError, match="needs \\['b'\\]"):
        Plan([_stage("a", ["b"])])
    with pytest.raises(PlanError, match="cycle: a -> b -> a"):
        Plan([_stage("a", ["b"]), _stage("b", ["a"])])
    with pytest.raises(PlanError, match="declared twice"):
        Plan([_stage("a"), _stage("a")])
    plan = Plan([_stage("c", ["a", "b"]), _stage("b", ["a"]), _stage("a")])
    assert plan.names() == ["a", "b", "c"]


def test_pinned_inputs_enter_the_version_and_must_exist(tmp_path):
    from storage import ArtifactStore

    store = ArtifactStore(tmp_path)
    one = Plan([_stage("x", pinned={"init": Pinned("dense_model", "v1")})])
    two = Plan([_stage("x", pinned={"init": Pinned("dense_model", "v2")})])
    assert one.planned_version("x") != two.planned_version("x")
    with pytest.raises(RuntimeError, match="dense_model v1"):
        one.pinned_inputs(store, "x")


def test_runtime_fields_stay_out_of_the_hash_and_dotted_names_reach_nested_models():
    class Inner(StageParams):
        path: str
        digest: str

    class Outer(StageParams):
        RUNTIME = frozenset({"device", "inner.path"})
        device: str
        inner: Inner
        k: int

    a = Outer(device="cpu", inner=Inner(path="/a", digest="d"), k=1)
    b = Outer(device="cuda", inner=Inner(path="/b", digest="d"), k=1)
    assert a.hashed() == b.hashed() == {"inner": {"digest": "d"}, "k": 1}
    with pytest.raises(Exception):
        a.k = 2  # frozen: the object hashed is the object the builder reads


def test_fusion_of_an_unknown_system_is_refused(shared_data):
    cfg = _config().model_copy(update={"fusion": [FusionConfig(name="f", runs=["bm25", "nope"])]})
    with pytest.raises(ValueError, match="unknown systems \\['nope'\\]"):
        plan_for(cfg)


def test_init_from_another_config_pins_its_planned_model(shared_data, tmp_path):
    (tmp_path / "a.yaml").write_text(f"extends: {PROJECT_ROOT / 'configs' / 'squad-open.yaml'}\n")
    (tmp_path / "b.yaml").write_text(
        f"extends: {PROJECT_ROOT / 'configs' / 'nfcorpus-dense.yaml'}\n"
        "dense:\n  systems:\n    - name: transfer\n      init_from: a.yaml:minilm-dpr\n  hybrid: null\n")
    source = plan_for(load_config(tmp_path / "a.yaml")).planned_version("train:minilm-dpr")
    plan = plan_for(load_config(tmp_path / "b.yaml"))
    assert plan["encode:transfer"].pinned == {"init": Pinned("dense_model", source)}
    assert "train:minilm-dpr" not in plan


def test_a_failing_publication_registers_nothing(tmp_path):
    from storage import ArtifactStore
    from storage.parquet import write_table
    from tasks.engine import run_stage
    import pyarrow as pa

    def build(params, inputs, out):
        write_table(out, pa.table({"x": [1]}))

    def publish(out):
        assert (out / "data").is_dir()  # it sees the finished folder
        raise ValueError("publication refused")

    store = ArtifactStore(tmp_path)
    stage = Stage("evaluate", "evaluation", "1", (), NoParams(), build)
    with pytest.raises(ValueError, match="publication refused"):
        run_stage(store, stage, {}, before_commit=publish)
    assert store.list_artifacts() == [] and store.latest("evaluation") is None
    assert run_stage(store, stage, {}).rows == 1


def test_a_single_stage_rerun_takes_the_latest_artifact_of_its_own_system(tmp_path):
    import pyarrow as pa

    from storage import ArtifactStore
    from storage.parquet import write_table
    from tasks.engine import run_stage

    class Params(StageParams):
        system: str

    def runs_of(system):
        return lambda params, inputs, out: write_table(out, pa.table({"system": [params.system]})) and None

    store = ArtifactStore(tmp_path)
    searches = [Stage(f"search:{s}", "dense_runs", "1", (), Params(system=s), runs_of(s), variant={"system": s})
                for s in ("a", "b")]
    for stage in searches:
        run_stage(store, stage, {})
    # The plan's own version of search:a is absent (its code changed): fall back to the latest
    # search:a, not to search:b, which was built later.
    changed = Stage("search:a", "dense_runs", "2", (), Params(system="a"), runs_of("a"), variant={"system": "a"})
    plan = Plan([changed, searches[1], _stage("fuse", ["search:a", "search:b"])])
    inputs = plan.upstream_for_single_stage(store, "fuse")
    assert inputs["search:a"].read_table().column("system").to_pylist() == ["a"]
    assert inputs["search:b"].read_table().column("system").to_pylist() == ["b"]


def test_a_field_added_later_stays_out_of_the_hash_only_at_the_value_older_versions_had():
    from typing import ClassVar, Optional

    from pydantic import BaseModel

    from tasks.engine import StageParams

    class Inner(BaseModel):
        kept: int = 1
        newer: bool = False
        ADDED: ClassVar[dict] = {"newer": False}   # a model that is not StageParams declares it a ClassVar

    class Plain(BaseModel):
        queries: str = "gold"

    class Params(StageParams):
        inner: Inner = Inner()
        inners: list[Inner] = [Inner(), Inner(newer=True)]
        plain: Plain = Plain()
        extra: Optional[int] = None
        ADDED = {"extra": None, "plain.queries": "gold"}

    assert Params().hashed() == {"inner": {"kept": 1}, "inners": [{"kept": 1}, {"kept": 1, "newer": True}], "plain": {}}
    changed = Params(inner=Inner(newer=True), plain=Plain(queries="synthetic"), extra=3).hashed()
    assert changed == {"inner": {"kept": 1, "newer": True}, "inners": [{"kept": 1}, {"kept": 1, "newer": True}],
                       "plain": {"queries": "synthetic"}, "extra": 3}
    assert Params().model_dump()["extra"] is None   # only the hash leaves it out, not the dump


def test_a_regrouped_model_hashes_as_the_fields_it_holds():
    from typing import ClassVar

    from pydantic import BaseModel

    from tasks.engine import StageParams

    class Schedule(BaseModel):
        lr: float = 1e-4
        seed: int = 1
        every: int = 5

    class Section(BaseModel):
        loss: str = "dpr"
        schedule: Schedule = Schedule()
        INLINE: ClassVar[frozenset] = frozenset({"schedule"})

    class Params(StageParams):
        train: Section = Section()
        RUNTIME = frozenset({"train.schedule.every"})

    class Flat(StageParams):   # the section as it was before the regrouping
        train: dict = {"loss": "dpr", "lr": 1e-4, "seed": 1}

    assert Params().hashed() == {"train": {"loss": "dpr", "lr": 1e-4, "seed": 1}} == Flat().hashed()
    assert Params(train=Section(schedule=Schedule(seed=2))).hashed()["train"]["seed"] == 2

    class Clashing(BaseModel):
        seed: int = 3
        schedule: Schedule = Schedule()
        INLINE: ClassVar[frozenset] = frozenset({"schedule"})

    class Bad(StageParams):
        train: Clashing = Clashing()

    with pytest.raises(ValueError, match=r"Clashing.schedule: \['seed'\] also sit beside it"):
        Bad().hashed()
