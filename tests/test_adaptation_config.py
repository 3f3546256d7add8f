"""Issue 25's config shape, checked at planning: references to another config's generator and
classifier, their errors, mining the generated queries, and configs/nfcorpus-adapt.yaml itself."""
import pytest
import yaml

from flows.registry import plan_for
from tasks.config import PROJECT_ROOT, load_config
from tasks.engine import PlanError
from tasks.errors import InputError

CONFIGS = PROJECT_ROOT / "configs"


def _write(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"extends": str(CONFIGS / "tiny.yaml"), **body}))
    return path


def test_nfcorpus_adapt_takes_the_embedded_defaults_generator_and_the_study_teacher(shared_data):
    plan = plan_for(load_config(CONFIGS / "nfcorpus-adapt.yaml"))
    squad = plan_for(load_config(CONFIGS / "squad-open.yaml"))
    silver = plan_for(load_config(CONFIGS / "study-teacher.yaml"))
    assert plan["synthetic_queries"].pinned["generator"].version == squad.planned_version("qgen_model")
    assert plan["cross_encoder"].pinned["source"].version == silver.planned_version("cross_encoder")
    assert "qgen_model" not in plan.stages
    # GPL's sampling of 3 queries per passage over every passage, paper 002's top-p / top-k
    g = plan["synthetic_queries"].params.generate
    assert (g.queries_per_passage, g.top_p, g.top_k, g.max_passages) == (3, 0.95, 25, None)
    ablations = plan_for(load_config(CONFIGS / "nfcorpus-adapt-ablations.yaml"))
    # the ablations reuse the recipe's artifacts: the same versions wherever they share a stage
    assert all(ablations.planned_version(name) == plan.planned_version(name) for name in plan.names() if name != "evaluate")
    # no stage trains on the corpus's qrels: every student's pairs are generated or silver
    for name in ("train:adapt-mmse", "train:adapt-dpr", "train:adapt-silver", "train:adapt-random"):
        stage = ablations[name]
        assert {i for i in stage.inputs if i.startswith("pairs:")} <= {"pairs:synthetic", "pairs:silver"}, name
        assert stage.params.train.select_on_dev is False
    mmse = ablations["train:adapt-mmse"].params.train
    mmse_settings = mmse.model_dump()
    # one ingredient changed per ablation
    for name, change in (("adapt-dpr", {"loss": "dpr"}), ("adapt-random", {"negatives": ["random"]}),
                         ("adapt-silver", {"loss": "weighted", "pairs": ["synthetic", "silver"]})):
        train = ablations[f"train:{name}"].params.train
        assert {k: v for k, v in train.model_dump().items() if v != mmse_settings[k]} == change, name
    assert (mmse.loss, mmse.pairs, mmse.negatives) == ("margin_mse", ["synthetic"], ["bm25", "zero-shot-mined"])
    for strategy in ("bm25", "zero-shot-mined", "random"):
        stage = ablations[f"negatives:{strategy}"]
        assert stage.params.synthetic is not None and stage.params.splits == [] and "pairs:synthetic" in stage.inputs


def test_a_referenced_generator_is_not_fine_tuned_again(shared_data, tmp_path):
    _write(tmp_path, "source.yaml", {"qgen": {"generator": "smollm2"}})
    target = _write(tmp_path, "target.yaml", {"qgen": {"generator": "source.yaml:qgen_model"}})
    with pytest.raises(ValueError, match="finetune.enabled: false"):
        plan_for(load_config(target))


def test_a_reference_must_name_the_stage_that_builds_the_model(shared_data, tmp_path):
    _write(tmp_path, "source.yaml", {"qgen": {"generator": "smollm2"}})
    target = _write(tmp_path, "target.yaml", {"qgen": {"generator": "source.yaml:synthetic_queries",
                                                       "finetune": {"enabled": False}}})
    with pytest.raises(PlanError, match="other.yaml:qgen_model"):
        plan_for(load_config(target))
    no_classifier = _write(tmp_path, "target2.yaml", {"cross_encoder": {"model": "source.yaml:cross_encoder"}})
    with pytest.raises(PlanError, match="trains no cross_encoder"):
        plan_for(load_config(no_classifier))


def test_a_classifier_folder_is_hashed_and_a_missing_one_is_named(shared_data, tmp_path, tiny_checkpoint):
    missing = _write(tmp_path, "missing.yaml", {"cross_encoder": {"model": "./no-such-classifier"}})
    with pytest.raises(InputError, match="no-such-classifier.*cross_encoder.model.*no such model folder"):
        plan_for(load_config(missing))
    folder = _write(tmp_path, "folder.yaml", {"cross_encoder": {"model": str(tiny_checkpoint)}})
    stage = plan_for(load_config(folder))["cross_encoder"]
    assert stage.inputs == () and stage.params.folder_hash and "folder" not in stage.params.hashed()


def test_mining_generated_queries_needs_qgen_and_leaves_other_versions_alone(shared_data, tmp_path):
    trained = {"dense": {"systems": [{"name": "d", "model": {"base": "minilm"}, "train": {"negatives": ["bm25"]}}]}}
    plain = plan_for(load_config(_write(tmp_path, "plain.yaml", trained)))["negatives:bm25"]
    # absent, `synthetic` is not hashed: versions built before it existed still match
    assert "synthetic" not in plain.params.hashed()
    needs_qgen = _write(tmp_path, "syn.yaml", {**trained, "negatives": {"bm25": {"synthetic": True}}})
    with pytest.raises(ValueError, match="negatives.bm25.synthetic.*qgen"):
        plan_for(load_config(needs_qgen))


def test_the_tuned_teacher_config_changes_only_the_teacher(shared_data):
    recipe = plan_for(load_config(CONFIGS / "nfcorpus-adapt.yaml"))
    tuned = plan_for(load_config(CONFIGS / "nfcorpus-adapt-tuned-teacher.yaml"))
    teacher = plan_for(load_config(CONFIGS / "study-teacher.yaml")).planned_version("cross_encoder")
    stage = tuned["cross_encoder"]
    assert stage.pinned["start"].version == teacher and stage.params.config.queries == "synthetic"
    assert tuned.planned_version("cross_encoder") != recipe.planned_version("cross_encoder")
    for shared in ("synthetic_queries", "pairs:synthetic", "negatives:bm25", "negatives:zero-shot-mined"):
        assert tuned.planned_version(shared) == recipe.planned_version(shared), shared
    a, b = recipe["train:adapt-mmse"].params.train, tuned["train:adapt-mmse-tuned-teacher"].params.train
    assert a == b  # the student trains the same way; only its teacher differs


def test_the_teacher_free_config_is_the_ablations_adapt_dpr_without_a_classifier(shared_data):
    qgen = plan_for(load_config(CONFIGS / "nfcorpus-adapt-qgen.yaml"))
    ablations = plan_for(load_config(CONFIGS / "nfcorpus-adapt-ablations.yaml"))
    # it runs while the teacher is still training: no stage reads a classifier
    assert not any(name == "cross_encoder" or name == "pairs:silver" for name in qgen.names())
    # and what it builds is the ablation's: the same versions, so neither run builds it twice
    for name in qgen.names():
        if name not in ("evaluate", "fusion:hybrid-adapt-dpr"):
            assert qgen.planned_version(name) == ablations.planned_version(name), name
    assert qgen["train:adapt-dpr"].params.train.loss == "dpr"


def test_a_reference_is_found_beside_the_config_it_extends_when_not_beside_the_file(shared_data, tmp_path):
    """A user's config outside configs/ that extends the recipe keeps its `squad-open.yaml:...`
    references; a file of that name beside the user's config comes first."""
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({"extends": str(CONFIGS / "nfcorpus-adapt.yaml"), "name": "mine"}))
    recipe = plan_for(load_config(CONFIGS / "nfcorpus-adapt.yaml"))
    assert plan_for(load_config(mine))["synthetic_queries"].pinned == recipe["synthetic_queries"].pinned
    _write(tmp_path, "squad-open.yaml", {"name": "local", "qgen": {"generator": "smollm2"}})
    local = plan_for(load_config(tmp_path / "squad-open.yaml")).planned_version("qgen_model")
    assert plan_for(load_config(mine))["synthetic_queries"].pinned["generator"].version == local
