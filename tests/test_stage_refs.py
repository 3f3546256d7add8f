"""References in a config (tasks/stage_refs.py): a dense system's `init_from` is parsed once, by
`parse_init_from`, for the config's checks, the planner and the stages that load the encoder."""
import pytest

from tasks.stage_refs import InitFrom, parse_init_from, split_config_reference


@pytest.mark.parametrize("value, parsed", [
    ("stage1", InitFrom("system", "stage1")),
    ("pretrain:cocondenser", InitFrom("pretrain", "cocondenser")),
    ("dense_model:0123abcd", InitFrom("artifact", "0123abcd")),
    ("squad-open.yaml:stage1", InitFrom("config", "stage1", "squad-open.yaml")),
    ("../configs/other.yml:s", InitFrom("config", "s", "../configs/other.yml")),  # a config, though it looks like a path
    ("./models/encoder", InitFrom("path", "./models/encoder")),
    ("/abs/encoder", InitFrom("path", "/abs/encoder")),
    ("dense_model:", InitFrom("system", "dense_model:")),  # no version: no artifact (the config check refuses it)
])
def test_init_from_kinds(value, parsed):
    assert parse_init_from(value) == parsed


def test_a_config_reference_splits_after_the_config_file():
    assert split_config_reference("squad-open.yaml:qgen_model") == ("squad-open.yaml", "qgen_model")
    assert split_config_reference("configs/a.yml:pairs:silver") == ("configs/a.yml", "pairs:silver")   # a step's colon


def test_no_init_from_is_none():
    assert parse_init_from(None) is None and parse_init_from("") is None


def test_the_stages_refuse_an_unresolved_config_reference():
    """The planner resolves `other.yaml:NAME` to `dense_model:VERSION` first; a stage handed the
    reference itself says so instead of asking for a train:other.yaml:NAME stage."""
    from tasks.compute.origin import origin_of
    from tasks.config import DenseSystemConfig

    system = DenseSystemConfig(name="s", init_from="other.yaml:stage1", evaluate=True)
    with pytest.raises(ValueError, match="resolved to its model's version when the plan is made"):
        origin_of(system, trained=False)
    origin, stages, pinned = origin_of(system.model_copy(update={"init_from": "dense_model:abc"}), trained=False)
    assert (origin.model_input, stages, pinned["init"].version) == ("init", (), "abc")
    origin, stages, _ = origin_of(system.model_copy(update={"init_from": "pretrain:cc"}), trained=False)
    assert (origin.model_input, stages) == ("pretrain:cc", ("pretrain:cc",))


def test_the_config_check_uses_the_same_parser():
    from tasks.config import DenseConfig, DenseSystemConfig

    with pytest.raises(ValueError, match="not a trained dense system"):
        DenseConfig(systems=[DenseSystemConfig(name="s", init_from="dense_model:")])
    for external in ("dense_model:abc", "other.yaml:x", "./folder", "pretrain:cc"):
        DenseConfig(systems=[DenseSystemConfig(name="s", init_from=external)])
