"""The corpus-scale study's configs (issue 24) keep the papers' settings and its own rules: paper
003's N = 2 of M = 100 hard negatives, paper 002's depth 200 and 144-token passages (2 negatives
at the study's batch of 16), whole-corpus generation and classifier training, two seeds for every
training row, and phases that plan the very versions the whole study plans (so a phase's
artifacts are the study's)."""
import re

import pytest

from flows.registry import plan_for
from tasks.config import PROJECT_ROOT, load_config

CONFIGS = PROJECT_ROOT / "configs"


@pytest.fixture(scope="module")
def study():
    return load_config(CONFIGS / "study.yaml")


def _trained(cfg):
    return {s.name: s for s in cfg.dense.systems if s.train is not None}


def test_paper_003_rows_draw_2_of_100_hard_negatives(study):
    for name, system in _trained(study).items():
        t, schedule = system.train, system.train.schedule
        if schedule.hard_negatives and t.loss != "margin_mse" and not name.startswith(("dpr", "xmoco")):
            assert (schedule.hard_negatives, t.negative_pool) == (2, 100), name
        assert schedule.max_steps is None and schedule.epochs >= 1 and t.max_questions is None, name  # epochs of every pair


def test_paper_002_rows_draw_2_of_depth_200_at_144_tokens():
    """Paper 002 section 4.2's fine-tuning (depth 200, 144 tokens, lr 2e-5, [CLS]) at the study's
    CPU size: batch 16 with 2 negatives, as its other rows, instead of 64 with 15."""
    cfg = load_config(CONFIGS / "study-query-as-context.yaml")
    for name, system in _trained(cfg).items():
        t, schedule = system.train, system.train.schedule
        assert (schedule.hard_negatives, t.negative_pool, schedule.passage_max_len, schedule.batch_size,
                schedule.lr, schedule.epochs) == (2, 200, 144, 16, 2e-5, 1), name
        assert system.model.pooling == "cls", name
    assert cfg.negatives.bm25.depth == 200 and cfg.bm25.k >= 200
    assert all(d.depth == 200 for n, d in cfg.negatives.dense.items() if n.startswith("mined"))


@pytest.mark.parametrize("config", ["study.yaml", "study-query-as-context.yaml"])
def test_every_training_row_runs_at_two_seeds_that_differ_only_by_seed(config):
    """Seed 2 of a row is its seed-1 twin but for the seed, the run it starts from and the miner
    of its negatives, each the twin's seed-2 counterpart."""
    trained = _trained(load_config(CONFIGS / config))
    assert sum(name.endswith("-s1") for name in trained) >= 3
    for name, system in trained.items():
        if not name.endswith("-s1"):
            continue
        twin = trained[re.sub(r"-s1$", "-s2", name)]
        assert system.train.schedule.seed != twin.train.schedule.seed
        first, second = (t.model_dump(exclude={"schedule": {"seed"}}) for t in (system.train, twin.train))
        assert first == {**second, "negatives": [n.replace("-s2", "-s1") for n in second["negatives"]]}, name
        assert system.model == twin.model
        assert (system.init_from or "").replace("-s1", "") == (twin.init_from or "").replace("-s2", "")


@pytest.mark.parametrize("recipe, second_seed", [("nfcorpus-adapt-tuned-teacher", "study-nfcorpus-tuned-teacher-s2"),
                                                  ("nfcorpus-adapt-ablations", "study-nfcorpus-ablations-s2")])
def test_each_nfcorpus_student_has_a_second_seed_that_differs_only_by_seed(recipe, second_seed):
    """The recipes' students train at their default seed; the study's second-seed configs train
    each again at seed 2 on the very inputs the recipe built (the same planned versions)."""
    first_plan, second_plan = (plan_for(load_config(CONFIGS / f"{c}.yaml")) for c in (recipe, second_seed))
    first, second = (_trained(load_config(CONFIGS / f"{c}.yaml")) for c in (recipe, second_seed))
    assert second and all(name.endswith("-s2") for name in second)
    for name, twin in second.items():
        system = first[name.removesuffix("-s2")]
        assert system.train.schedule.seed != twin.train.schedule.seed == 2
        assert (system.train.model_dump(exclude={"schedule": {"seed"}}) ==
                twin.train.model_dump(exclude={"schedule": {"seed"}})), name
        assert system.model == twin.model
    shared = [n for n in second_plan.names() if n in first_plan.names() and n != "evaluate"]
    assert "synthetic_queries" in shared and "cross_encoder" in shared
    assert all(second_plan.planned_version(n) == first_plan.planned_version(n) for n in shared)


def test_the_generator_and_the_classifier_see_the_whole_corpus(study):
    assert study.qgen.finetune.max_pairs is None and study.qgen.generate.max_passages is None
    assert study.qgen.generate.queries_per_passage >= 2 and study.qgen.filter_bm25_top_k
    assert (study.qgen.generate.top_p, study.qgen.generate.top_k) == (0.95, 25)
    c = study.cross_encoder
    assert c.max_questions is None and c.train.max_steps is None and c.train.epochs >= 1 and c.select_by == "auc"
    assert study.silver.threshold == 0.5


def test_the_phases_build_the_studys_own_versions(study):
    whole = plan_for(study)
    for phase in ("study-teacher", "study-qgen", "study-query-as-context"):
        plan = plan_for(load_config(CONFIGS / f"{phase}.yaml"))
        shared = [n for n in plan.names() if n in whole.names() and n != "evaluate"]
        if phase == "study-query-as-context":  # its BM25 goes to depth 200: BM25's runs and what reads them differ
            shared = [n for n in shared if n in ("qgen_model", "synthetic_queries", "encode:zero-shot")]
        assert shared
        for name in shared:
            assert plan.planned_version(name) == whole.planned_version(name), (phase, name)


def test_the_two_epoch_classifier_lever_changes_the_classifier_alone(study):
    lever = load_config(CONFIGS / "study-teacher-2-epochs.yaml")
    assert lever.cross_encoder.train.epochs == 2 and study.cross_encoder.train.epochs == 1
    assert (lever.cross_encoder.model_dump(exclude={"train": {"epochs"}}) ==
            study.cross_encoder.model_dump(exclude={"train": {"epochs"}}))
    plan, whole = plan_for(lever), plan_for(study)
    shared = [n for n in plan.names() if n in whole.names() and n not in ("evaluate", "cross_encoder")]
    assert "hybrid" in shared and "train:gold-s1" in shared
    assert all(plan.planned_version(n) == whole.planned_version(n) for n in shared)
    assert plan.planned_version("cross_encoder") != whole.planned_version("cross_encoder")
    assert {"rerank:hybrid-gold-s1-rerank-2e", "rerank:hybrid-gold-s1-mix-2e"} <= set(plan.names())


def test_the_study_compares_what_its_bars_name(study):
    pairs = {tuple(p) for p in study.evaluation.compare}
    assert {("two-stage-s1", "gold-s1"), ("two-stage-s2", "gold-s2"), ("hybrid-gold-s1-rerank", "hybrid(gold-s1)")} <= pairs
    assert study.evaluation.compare_split == "test" and study.evaluation.compare_ks == [1, 20]


def test_paper_003s_table_2_systems_are_its_no_stage_1_rows_started_from_stage_1(study):
    """Paper 003's table 2 fine-tunes its stage-1 model (section 4.1); its table 4 drops stage 1.
    Each two-stage row trains exactly as its no-stage-1 twin (gold-sN is the BM25 one) from
    stage1-sN of its own seed, and the ensembles fuse the two-stage systems."""
    trained = _trained(study)
    twins = {"two-stage": "gold", "two-stage-rnd": "rnd", "two-stage-mixed": "mixed"}
    for seed in (1, 2):
        for two_stage, no_stage_1 in twins.items():
            system, twin = trained[f"{two_stage}-s{seed}"], trained[f"{no_stage_1}-s{seed}"]
            assert system.init_from == f"stage1-s{seed}" and twin.init_from is None
            assert system.train == twin.train and system.model == twin.model, two_stage
    for fusion in study.fusion:
        assert fusion.runs == ["two-stage-s1", "two-stage-rnd-s1", "two-stage-mixed-s1"], fusion.name
