"""The trainer stages (train:NAME, cross_encoder, qgen_model) are resumable: their trainer writes
checkpoints into the stage's work folder, which outlives a killed run of the same version, so the
next run resumes from the latest one; checkpointing is left out of the version. Also: training
cuts passages and queries where encoding does unless a system says otherwise."""
import pytest

from flows.pipeline import pipeline
from flows.registry import plan_for
from storage import ArtifactStore
from tasks.config import PROJECT_ROOT, DenseConfig, DenseSystemConfig, DenseTrainConfig, load_config
from tasks.training.arguments import CPU_ROWS_PER_PIECE
from tests.crash import Crash, crash_at

pytestmark = pytest.mark.usefixtures("flush_denormals")


def _config(checkpoint, **train):
    cfg = load_config(PROJECT_ROOT / "configs" / "tiny.yaml")
    model = {"base": str(checkpoint), "shared": True, "pooling": "mean", "normalize": True, "scale": 20.0}
    dense = DenseConfig(systems=[DenseSystemConfig(
        name="trained", model=model,
        train=DenseTrainConfig(loss="dpr", batch_size=8, max_steps=3, select_on_dev=False, hard_negatives=1, **train))])
    return cfg.model_copy(update={"dense": dense})


def test_a_killed_training_stage_resumes_from_its_work_folder(prefect_harness, shared_data, tmp_path, tiny_checkpoint,
                                                              monkeypatch):
    import tasks.training.trainer as trainer

    cfg = _config(tiny_checkpoint, checkpoint_every=1)
    real = trainer.train_bi_encoder
    results = []

    def crashing(*args, callbacks=(), **kwargs):  # killed at the end of step 2, before its checkpoint
        return real(*args, callbacks=(*callbacks, crash_at(2)), **kwargs)

    def recording(*args, **kwargs):
        assert kwargs["rows_per_piece"] == CPU_ROWS_PER_PIECE, "length_pieces: auto cuts a CPU run's batches"
        results.append(real(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(trainer, "train_bi_encoder", crashing)
    with pytest.raises(Exception) as killed:
        pipeline(config=cfg, root=str(tmp_path))
    assert isinstance(killed.value, Crash) or "Crash" in repr(killed.value)
    store = ArtifactStore(tmp_path)
    assert list(tmp_path.rglob("step-0000001")), "the killed run left its step-1 checkpoint in the work folder"
    assert not list(tmp_path.rglob("step-0000002")), "step 2 died before its checkpoint"

    monkeypatch.setattr(trainer, "train_bi_encoder", recording)
    versions = pipeline(config=cfg, root=str(tmp_path))
    assert results and results[0]["resumed_from"].endswith("step-0000001") and len(results[0]["history"]) == 3
    model = store.get("dense_model", versions["train:trained"])
    assert (model.path / "training" / "history.json").is_file() and not (model.path / "training" / "checkpoints").exists()
    assert not list(tmp_path.rglob("step-0000001")), "the work folder goes once the artifact is committed"


def test_checkpointing_and_length_pieces_are_not_part_of_the_version(tiny_checkpoint):
    plain = plan_for(_config(tiny_checkpoint))["train:trained"].params.hashed()
    checkpointed = plan_for(_config(tiny_checkpoint, checkpoint_every=5, keep_checkpoints=3))["train:trained"].params.hashed()
    assert plain == checkpointed
    for pieces in (4, None):   # how fast a step encodes, not what it trains (models/length_pieces.py)
        assert plan_for(_config(tiny_checkpoint, length_pieces=pieces))["train:trained"].params.hashed() == plain
    assert plain != plan_for(_config(tiny_checkpoint, seed=7))["train:trained"].params.hashed()


def test_training_cuts_where_encoding_cuts_unless_told(tiny_checkpoint):
    cfg = _config(tiny_checkpoint)
    cfg.dense.encode.passage_max_len, cfg.dense.encode.query_max_len = 200, 48
    train = plan_for(cfg)["train:trained"].params.train
    assert (train.schedule.passage_max_len, train.schedule.query_max_len) == (200, 48)
    told = plan_for(_config(tiny_checkpoint, passage_max_len=128))["train:trained"].params.train
    assert (told.schedule.passage_max_len, told.schedule.query_max_len) == (128, 64)  # tiny.yaml encodes queries at 64
    for name in ("squad-open", "demo"):  # the shipped defaults train on what the index sees
        shipped = load_config(PROJECT_ROOT / "configs" / f"{name}.yaml")
        for stage in plan_for(shipped):
            if stage.name.startswith("train:"):
                assert stage.params.train.schedule.passage_max_len == shipped.dense.encode.passage_max_len == 256, stage.name
