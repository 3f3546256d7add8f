"""Training data pipeline and trainer on tiny random BERTs (seconds on CPU)."""
import contextlib
import json
import os
import random

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from models import BiEncoder, InBatchSoftmaxLoss, WeightedInBatchSoftmaxLoss  # noqa: E402
from tests.tiny_models import WORDS  # noqa: E402
from tasks.training import (  # noqa: E402
    Collator,
    TrainerArgs,
    TrainExample,
    UniqueBatchSampler,
    latest_checkpoint,
)
from tasks.training import train_bi_encoder as _train_bi_encoder  # noqa: E402
from tasks.training.callbacks import TrainerCallback  # noqa: E402
from tasks.training.checkpoints import STATE_NAME  # noqa: E402
from tests.crash import Crash, crash_at  # noqa: E402

pytestmark = pytest.mark.usefixtures("flush_denormals")


def train_bi_encoder(*args, device="cpu", **kwargs):
    """The tests train on the CPU, whatever the machine has."""
    return _train_bi_encoder(*args, device=device, **kwargs)


class FnEvaluator:
    """An evaluator around `fn(model) -> float`: {"dev": fn(model)}."""

    primary_metric = "dev"

    def __init__(self, fn, greater_is_better=True):
        self.fn, self.greater_is_better = fn, greater_is_better

    def __call__(self, model):
        return {"dev": self.fn(model), "other": -1.0}


def new_model(checkpoint, seed=0):
    """A fresh model object; `seed` perturbs the projection so 'loaded from nothing' is real."""
    torch.manual_seed(seed)
    return BiEncoder.from_pretrained(checkpoint, projection_dim=16)


def make_examples(n=24, pool=3, seed=0, dup_every=0):
    rng = random.Random(seed)
    words = WORDS + list("abcdefghij")
    out = []
    for i in range(n):
        pid = f"p{i // dup_every}" if dup_every else f"p{i}"
        out.append(TrainExample(
            qid=f"q{i}",
            query=" ".join(rng.choices(words, k=rng.randint(2, 6))),
            positive=(f"title {i % 5}", " ".join(rng.choices(words, k=rng.randint(4, 12)))),
            positive_id=pid,
            negatives=[(f"neg {j}", " ".join(rng.choices(words, k=rng.randint(3, 10)))) for j in range(pool)],
        ))
    return out


# -- sampler ----------------------------------------------------------------------------------

@pytest.mark.parametrize("trial", range(20))
def test_sampler_never_mixes_duplicates(trial):
    rng = random.Random(trial)
    n = rng.randint(1, 80)
    examples = [TrainExample(qid=f"q{rng.randint(0, n // 2)}", query="x", positive=("", "y"),
                             positive_id=f"p{rng.randint(0, n // 3)}") for _ in range(n)]
    for drop_last in (True, False):
        sampler = UniqueBatchSampler(examples, batch_size=rng.randint(1, 8), seed=trial, drop_last=drop_last)
        seen = []
        for batch in sampler:
            assert len({examples[i].qid for i in batch}) == len(batch)
            assert len({examples[i].positive_id for i in batch}) == len(batch)
            if drop_last:
                assert len(batch) == sampler.batch_size
            seen.extend(batch)
        assert len(seen) == len(set(seen))
        if not drop_last:
            assert sorted(seen) == list(range(n))  # every example once per epoch


def test_sampler_covers_all_and_reshuffles():
    examples = make_examples(n=40, dup_every=2)  # pairs share a positive
    sampler = UniqueBatchSampler(examples, batch_size=8, seed=1)
    assert len(sampler) == 5
    epoch0 = list(sampler)
    assert sorted(i for b in epoch0 for i in b) == list(range(40))
    assert sampler.state_dict()["epoch"] == 1
    epoch1 = list(sampler)
    assert sorted(i for b in epoch1 for i in b) == list(range(40))
    assert epoch0 != epoch1


def test_sampler_state_round_trip():
    examples = make_examples(n=30)
    a = UniqueBatchSampler(examples, batch_size=4, seed=3)
    it = iter(a)
    first = [next(it) for _ in range(3)]
    state = a.state_dict()
    rest_a = list(it) + list(a)  # rest of epoch 0, then epoch 1
    b = UniqueBatchSampler(examples, batch_size=4, seed=3)
    b.load_state_dict(state)
    rest_b = list(b) + list(b)
    assert rest_a == rest_b and len(first) == 3
    with pytest.raises(ValueError):
        UniqueBatchSampler(examples[:10], batch_size=4, seed=3).load_state_dict(state)


# -- collator ---------------------------------------------------------------------------------

def test_collator_shapes_and_single_padding(tokenizer):
    examples = make_examples(n=5, pool=4)
    coll = Collator(tokenizer, query_max_len=8, passage_max_len=16, hard_negatives=3, seed=0)
    q, p, n, w = coll(examples)
    assert q["input_ids"].shape[0] == 5 and p["input_ids"].shape[0] == 5
    assert n["input_ids"].shape[0] == 15
    assert q["input_ids"].shape[1] <= 8 and p["input_ids"].shape[1] <= 16
    # padded once, to the longest in the batch (not to max_length)
    lengths = [len(tokenizer(e.query, truncation=True, max_length=8)["input_ids"]) for e in examples]
    assert q["input_ids"].shape[1] == max(lengths)
    assert q["attention_mask"].sum(1).tolist() == lengths
    assert torch.equal(w, torch.ones(5))
    # passages are pairs: token_type_ids mark the text segment
    assert p["token_type_ids"].max().item() == 1
    q0, p0, n0, _ = Collator(tokenizer, hard_negatives=0)(examples)
    assert n0 is None


def test_collator_negative_draws_deterministic_per_seed_and_epoch(tokenizer):
    """Paper 003 section 4.3: N of each question's M, a fresh draw each epoch; a draw is a function
    of (seed, epoch, question), so neither the batch it lands in nor a resume changes it."""
    examples = make_examples(n=6, pool=5)
    a = Collator(tokenizer, hard_negatives=2, seed=7)
    b = Collator(tokenizer, hard_negatives=2, seed=7)
    epochs_a = [a.draw_negatives(examples, epoch) for epoch in range(3)]
    assert epochs_a == [b.draw_negatives(examples, epoch) for epoch in range(3)]
    assert epochs_a[0] != epochs_a[1]  # a fresh draw each epoch
    assert Collator(tokenizer, hard_negatives=2, seed=8).draw_negatives(examples, 0) != epochs_a[0]
    # the same question draws the same in another batch (here: alone, and in reverse order)
    alone = a.draw_negatives(examples[3:4], 1)
    assert alone == epochs_a[1][6:8]
    assert a.draw_negatives(examples[::-1], 1)[-2:] == epochs_a[1][:2]
    # question-major, from each question's own pool, no repeats within a question
    for i, e in enumerate(examples):
        mine = epochs_a[0][2 * i: 2 * i + 2]
        assert all(tuple(x) in {tuple(y) for y in e.negatives} for x in mine)
        assert mine[0] != mine[1]
    with pytest.raises(ValueError):
        Collator(tokenizer, hard_negatives=1)(make_examples(n=2, pool=0))


def test_collator_skips_negatives_equal_to_a_batch_positive(tokenizer):
    examples = make_examples(n=2, pool=1)
    examples[0].negatives = [examples[1].positive, ("other", "passage text")]
    coll = Collator(tokenizer, hard_negatives=1, seed=0)
    for _ in range(10):
        assert coll.draw_negatives(examples)[0] == ("other", "passage text")


# -- trainer ----------------------------------------------------------------------------------

def tiny_args(**kw):
    base = dict(lr=1e-3, batch_size=4, max_steps=6, warmup_ratio=0.5, hard_negatives=1,
                query_max_len=16, passage_max_len=24, seed=0)
    base.update(kw)
    return TrainerArgs(**base)


def test_resume_continues_exactly(checkpoint, tmp_path):
    examples = make_examples(n=12, pool=3)  # 3 batches an epoch: resume crosses an epoch boundary
    args = tiny_args(max_steps=8, checkpoint_every=4, keep_checkpoints=3)

    one = new_model(checkpoint, seed=1)
    train_bi_encoder(one, InBatchSoftmaxLoss(one), examples, args, tmp_path / "one", progress=False)

    def crash_after_checkpoint(model):
        if crash_after_checkpoint.calls == 4:  # evaluated at step 5: after the step-4 checkpoint
            raise Crash
        crash_after_checkpoint.calls += 1
        return 0.0
    crash_after_checkpoint.calls = 0

    first = new_model(checkpoint, seed=1)  # same start as `one`
    with pytest.raises(Crash):
        train_bi_encoder(first, InBatchSoftmaxLoss(first), examples,
                         tiny_args(**{**args.model_dump(), "eval_every": 1, "eval_at_start": False}),
                         tmp_path / "two", evaluator=FnEvaluator(crash_after_checkpoint), progress=False)
    assert latest_checkpoint(tmp_path / "two").name == "step-0000004"

    # "new process": a different fresh model object, new loss, new trainer call
    second = new_model(checkpoint, seed=3)
    result = train_bi_encoder(second, InBatchSoftmaxLoss(second), examples, args, tmp_path / "two", progress=False)
    assert result["resumed_from"].endswith("step-0000004")
    # the first attempt's 4 steps count in the whole training time, not in this call's
    first_part = torch.load(tmp_path / "two" / "checkpoints" / "step-0000004" / STATE_NAME,
                            weights_only=False)["seconds_so_far"]
    assert first_part > 0 and result["seconds_all_attempts"] == pytest.approx(first_part + result["seconds"])
    for (name, a), (_, b) in zip(one.state_dict().items(), second.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name
    hist_one = json.loads((tmp_path / "one" / "history.json").read_text())["history"]
    assert [h["loss"] for h in hist_one] == pytest.approx([h["loss"] for h in result["history"]], abs=1e-6)
    assert [p.name for p in (tmp_path / "one" / "checkpoints").iterdir()] != []


def test_a_resumed_run_keeps_the_dev_curve_and_the_start_metric_of_its_first_part(checkpoint, tmp_path):
    examples = make_examples(n=8)
    args = tiny_args(max_steps=6, eval_every=2, checkpoint_every=2, hard_negatives=0, eval_at_start=True)
    scores = iter([0.5, 0.7, 0.6, 0.4])  # steps 0 and 2, then after the resume 4 and 6
    evaluator = FnEvaluator(lambda m: next(scores))

    first = new_model(checkpoint)
    with pytest.raises(Crash):  # killed in step 3, after the step-2 checkpoint
        train_bi_encoder(first, InBatchSoftmaxLoss(first), examples, args, tmp_path, evaluator=evaluator,
                         callbacks=[crash_at(3)], progress=False)
    second = new_model(checkpoint)
    result = train_bi_encoder(second, InBatchSoftmaxLoss(second), examples, args, tmp_path, evaluator=evaluator,
                              progress=False)
    assert result["resumed_from"].endswith("step-0000002")
    assert result["dev_curve"] == [(0, 0.5), (2, 0.7), (4, 0.6), (6, 0.4)]
    assert result["start_metric"] == pytest.approx(0.5)
    assert (result["best_step"], result["best_metric"]) == (2, pytest.approx(0.7))


def test_a_checkpoint_of_a_run_of_another_length_is_refused(checkpoint, tmp_path):
    examples = make_examples(n=8)
    model = new_model(checkpoint)
    train_bi_encoder(model, InBatchSoftmaxLoss(model), examples, tiny_args(max_steps=2, checkpoint_every=2,
                     hard_negatives=0), tmp_path, progress=False)
    with pytest.raises(ValueError, match="run of 2 steps, not 4: use another out_dir"):
        train_bi_encoder(model, InBatchSoftmaxLoss(model), examples, tiny_args(max_steps=4, hard_negatives=0),
                         tmp_path, progress=False)


def test_shuffled_batches_cut_each_epochs_shuffle_and_resume_mid_epoch():
    from tasks.training.data import ShuffledBatches, epoch_order

    full, all_ = ShuffledBatches(10, 4, seed=3), ShuffledBatches(10, 4, seed=3, drop_last=False)
    assert (len(full), len(all_)) == (2, 3)
    first = list(all_)
    assert [len(b) for b in first] == [4, 4, 2] and sum(first, []) == epoch_order(10, 3, 0)
    assert list(full) == first[:2] and all_.epoch == full.epoch == 1
    resumed = ShuffledBatches(10, 4, seed=3, drop_last=False)
    it = iter(all_)
    next(it)
    resumed.load_state_dict(all_.state_dict())  # one batch of epoch 1 handed out
    assert list(resumed) == list(it)
    with pytest.raises(ValueError, match="sampler state"):
        ShuffledBatches(9, 4, seed=3).load_state_dict(all_.state_dict())


def test_each_setting_of_the_dense_trainer_is_declared_once():
    """The trainer's schedule and the bi-encoder trainer's settings declare a field each once (one
    default, one description); the pipeline's train: section holds them as its `schedule` and
    declares none of them again."""
    from tasks.training.stages import DenseTrainConfig
    from tasks.training.arguments import ScheduleArgs

    chain = (ScheduleArgs, TrainerArgs)
    declared = [name for cls in chain for name in cls.__annotations__ if name in cls.model_fields]
    assert len(declared) == len(set(declared))
    assert not issubclass(DenseTrainConfig, TrainerArgs)
    assert DenseTrainConfig.model_fields["schedule"].annotation is TrainerArgs
    assert not set(DenseTrainConfig.model_fields) & set(TrainerArgs.model_fields)
    assert (TrainerArgs().batch_size, TrainerArgs().eval_at_start) == (16, True)


def test_the_train_section_reads_the_schedule_flat_or_as_an_object():
    from pydantic import ValidationError

    from tasks.training.stages import DenseTrainConfig

    flat = DenseTrainConfig(loss="weighted", lr=1e-4, batch_size=8, seed=3)
    nested = DenseTrainConfig(loss="weighted", schedule={"lr": 1e-4, "batch_size": 8, "seed": 3})
    both = DenseTrainConfig(loss="weighted", lr=1e-4, schedule={"batch_size": 8, "seed": 3})
    assert flat == nested == both and flat.schedule.batch_size == 8 and flat.loss == "weighted"
    assert DenseTrainConfig.model_validate(flat.model_dump()) == flat   # a dump reads back
    assert DenseTrainConfig(schedule=TrainerArgs(seed=3), lr=1e-4).schedule == TrainerArgs(seed=3, lr=1e-4)
    with pytest.raises(ValidationError, match="seed: given both in the section and in its schedule"):
        DenseTrainConfig(seed=1, schedule={"seed": 2})
    with pytest.raises(ValidationError, match="batch_size"):
        DenseTrainConfig(batch_size=1)          # the trainer's own bound still holds
    with pytest.raises(ValidationError, match="Extra inputs"):
        DenseTrainConfig(learning_rate=1e-4)    # a misspelt setting is refused, as before


def test_the_trainer_needs_its_lengths(checkpoint, tmp_path):
    model = BiEncoder.from_pretrained(checkpoint, pooling="mean", normalize=True, scale=20.0)
    with pytest.raises(ValueError, match="query_max_len and passage_max_len are needed"):
        train_bi_encoder(model, InBatchSoftmaxLoss(model), make_examples(n=8, pool=2),
                         TrainerArgs(batch_size=4, max_steps=1), tmp_path / "out")


def test_training_reduces_loss_and_writes_outputs(checkpoint, tmp_path, caplog):
    examples = make_examples(n=16, pool=2)
    for e in examples:  # a learnable task: the positive contains the query's words
        e.positive = (e.positive[0], e.query + " " + e.positive[1])
    torch.manual_seed(0)
    model = BiEncoder.from_pretrained(checkpoint, pooling="mean", normalize=True, scale=20.0)
    loss_fn = InBatchSoftmaxLoss(model)
    coll = Collator(model.tokenizer, 16, 24, hard_negatives=0)
    q, p, _, _ = coll(examples)

    def full_loss():
        model.eval()
        with torch.no_grad():
            return float(loss_fn(q, p))

    before = full_loss()
    args = tiny_args(max_steps=30, warmup_ratio=0.1, lr=2e-3, hard_negatives=1, checkpoint_every=10,
                     keep_checkpoints=2)
    with caplog.at_level("INFO", logger="tasks.training.trainer"):
        result = train_bi_encoder(model, loss_fn, examples, args, tmp_path, progress=False)
    after = full_loss()
    assert after < before * 0.5, (before, after)
    # Without a progress bar, a log line every 10% of the steps (30 steps: every 3rd).
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("train step")]
    assert [m.split()[2] for m in logged] == [f"{s}/30" for s in range(3, 31, 3)]
    assert len(result["history"]) == 30 and result["best_step"] == 30
    assert (tmp_path / "loss_curve.png").stat().st_size > 0
    assert json.loads((tmp_path / "history.json").read_text())["history"][-1]["step"] == 30
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-0000020", "step-0000030"]
    assert (tmp_path / "best" / "bi_encoder_config.json").is_file()
    assert result["pairs_per_second"] > 0
    reloaded = BiEncoder.from_pretrained(tmp_path / "best")
    for a, b in zip(model.state_dict().values(), reloaded.state_dict().values()):
        assert torch.equal(a, b)


def test_warmup_schedule(checkpoint, tmp_path):
    examples = make_examples(n=8)
    model = new_model(checkpoint)
    args = tiny_args(max_steps=10, warmup_ratio=0.3, lr=1e-3, hard_negatives=0)
    history = train_bi_encoder(model, InBatchSoftmaxLoss(model), examples, args, tmp_path, progress=False)["history"]
    lrs = [h["lr"] for h in history]
    assert lrs[0] == 0.0  # step 0 of the warm-up
    assert lrs[3] == pytest.approx(1e-3)  # peak after 3 warm-up steps
    assert max(lrs) == pytest.approx(1e-3)
    assert lrs[1] == pytest.approx(1e-3 / 3) and lrs[-1] == pytest.approx(1e-3 / 7)  # linear decay to 0


def test_best_checkpoint_by_dev_metric(checkpoint, tmp_path):
    examples = make_examples(n=8)
    model = new_model(checkpoint)
    scores = iter([0.1, 0.9, 0.3, 0.2])  # eval at steps 2, 4, 6 and 8 (the end)
    snapshots = {}

    def fake_metric(m):
        assert not m.training
        value = next(scores)
        snapshots[value] = {k: v.clone() for k, v in m.state_dict().items()}
        return value

    args = tiny_args(max_steps=8, eval_every=2, hard_negatives=0, eval_at_start=False)
    result = train_bi_encoder(model, InBatchSoftmaxLoss(model), examples, args, tmp_path,
                              evaluator=FnEvaluator(fake_metric), progress=False)
    assert result["best_step"] == 4 and result["best_metric"] == pytest.approx(0.9)
    best = BiEncoder.from_pretrained(tmp_path / "best")
    for k, v in best.state_dict().items():
        assert torch.equal(v, snapshots[0.9][k]), k
    assert (tmp_path / "final").is_dir()


def test_dev_metric_at_start_keeps_the_base_model_when_training_hurts(checkpoint, tmp_path):
    examples = make_examples(n=8)
    model = new_model(checkpoint)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    scores = iter([0.5, 0.4, 0.3])  # step 0 (the base), 2, 4 (the end)
    args = tiny_args(max_steps=4, eval_every=2, hard_negatives=0, eval_at_start=True)
    result = train_bi_encoder(model, InBatchSoftmaxLoss(model), examples, args, tmp_path,
                              evaluator=FnEvaluator(lambda m: next(scores)), progress=False)
    assert result["best_step"] == 0 and result["start_metric"] == pytest.approx(0.5)
    assert result["dev_curve"] == [(0, 0.5), (2, 0.4), (4, 0.3)]
    best = BiEncoder.from_pretrained(tmp_path / "best")
    for k, v in best.state_dict().items():
        assert torch.equal(v, start[k]), k
    assert not all(torch.equal(v, start[k]) for k, v in model.state_dict().items())


def test_weighted_examples(checkpoint, tmp_path):
    from models.losses.base import forward_logits, per_query_cross_entropy

    examples = make_examples(n=8)
    for i, e in enumerate(examples):
        e.weight = 1.0 / (i + 1)  # distinct: a batch's weighted mean never equals its plain mean
    model = new_model(checkpoint)
    with pytest.raises(ValueError, match="weights"):
        train_bi_encoder(model, InBatchSoftmaxLoss(model), examples, tiny_args(max_steps=1), tmp_path / "a",
                         progress=False)

    class SpyLoss(WeightedInBatchSoftmaxLoss):
        """Records the weights the trainer hands over and each row's cross-entropy."""
        calls = []

        def compute_loss_from_embeddings(self, q, p, negatives=None, weights=None):
            ce = per_query_cross_entropy(forward_logits(q, p, negatives, self.scale))
            self.calls.append((None if weights is None else weights.detach().cpu().clone(), ce.detach().cpu()))
            return super().compute_loss_from_embeddings(q, p, negatives=negatives, weights=weights)

    args = tiny_args(max_steps=2)
    result = train_bi_encoder(model, SpyLoss(model), examples, args, tmp_path / "b", progress=False)
    assert len(result["history"]) == 2 and len(SpyLoss.calls) == 2
    # the trainer's batches: the same seeded sampler; each step must get its examples' weights
    batches = UniqueBatchSampler(examples, args.batch_size, seed=args.seed).epoch_batches(0)
    for (weights, ce), batch, logged in zip(SpyLoss.calls, batches, result["history"]):
        expected = torch.tensor([examples[i].weight for i in batch])
        assert weights is not None, "the trainer dropped the weights"
        assert torch.allclose(weights, expected), (weights, expected)
        weighted = float((expected * ce).sum() / expected.sum())  # paper 001 eq. 2, sum-of-weights
        assert logged["loss"] == pytest.approx(weighted, rel=1e-5)
        assert logged["loss"] != pytest.approx(float(ce.mean()), rel=1e-3)  # the weights matter here


def test_gradient_checkpointing_and_separate_towers(checkpoint, tmp_path):
    model = BiEncoder.from_pretrained(checkpoint, shared=False)
    args = tiny_args(max_steps=2, gradient_checkpointing=True, hard_negatives=1)
    result = train_bi_encoder(model, InBatchSoftmaxLoss(model), make_examples(n=8), args, tmp_path, progress=False)
    assert model.query_encoder.is_activation_checkpointing
    assert model.passage_encoder.is_activation_checkpointing
    assert len(result["history"]) == 2


def test_too_few_examples_for_a_batch(checkpoint, tmp_path):
    model = new_model(checkpoint)
    examples = make_examples(n=6, dup_every=6)  # all share one positive: no batch of 4 possible
    with pytest.raises(ValueError, match="no full batch"):
        train_bi_encoder(model, InBatchSoftmaxLoss(model), examples, tiny_args(), tmp_path, progress=False)


def test_bf16_on_the_cpu_trains_under_autocast(checkpoint, tmp_path):
    """bf16 'on' autocasts the CPU's training steps (the encoder's linear layers give bf16), the
    losses near fp32's (8-bit mantissas); the suite's CPU has no bf16 units, so it warns."""
    seen: list[torch.dtype] = []
    examples = make_examples(n=8)
    losses = {}
    for flag in ("off", "on"):
        model = new_model(checkpoint, seed=1)
        linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        linear.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
        seen.clear()
        with pytest.warns(UserWarning, match="emulated") if flag == "on" else contextlib.nullcontext():
            result = train_bi_encoder(model, InBatchSoftmaxLoss(model), examples, tiny_args(max_steps=2, bf16=flag),
                                      tmp_path / flag, progress=False)
        assert (torch.bfloat16 in seen) if flag == "on" else set(seen) == {torch.float32}
        losses[flag] = result["history"][0]["loss"]
    assert losses["on"] != losses["off"] and abs(losses["on"] - losses["off"]) < 0.02 * abs(losses["off"])


@pytest.mark.parametrize("flags, device, expected", [
    ("avx2 fma", "cpu", "auto"), ("avx2 avx512f avx512_bf16", "cpu", "on"), ("amx_bf16 avx512_bf16", "auto", "on"),
    ("amx_bf16 avx512_bf16", "cuda", "auto"),
])
def test_bf16_auto_is_planned_on_for_cpus_with_bf16_units(cpuinfo, monkeypatch, flags, device, expected):
    from tasks.training.precision import use_bf16

    cpuinfo(f"processor\t: 0\nflags\t\t: fpu {flags}\n")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    planned = TrainerArgs(lr=1e-4).resolved_for(device)
    assert planned.bf16 == expected and planned.lr == 1e-4 and type(planned) is TrainerArgs
    assert use_bf16("auto", torch.device("cpu")) == ("bf16" in flags)  # what a run called directly does
    assert TrainerArgs(bf16="off").resolved_for(device).bf16 == "off"  # a named choice stays


# -- arguments, callbacks, evaluators ---------------------------------------------------------

def test_trainer_args_validate_and_convert_bf16():
    from pydantic import ValidationError

    assert TrainerArgs().bf16 == "auto"
    assert TrainerArgs(bf16=True).bf16 == "on" and TrainerArgs(bf16=False).bf16 == "off"
    with pytest.raises(ValidationError):
        TrainerArgs(bf16="yes")
    with pytest.raises(ValidationError):  # the device is train_bi_encoder's argument now
        TrainerArgs(device="cpu")
    assert TrainerArgs(**TrainerArgs(lr=1e-4).model_dump()) == TrainerArgs(lr=1e-4)
    assert all(f.description for f in TrainerArgs.model_fields.values())  # a readable UI form

    class PipelineArgs(TrainerArgs):  # a pipeline config adds fields of its own
        loss: str = "dpr"
    assert PipelineArgs(loss="weighted", batch_size=8).model_dump()["loss"] == "weighted"


class Recorder(TrainerCallback):
    def __init__(self):
        self.events, self.lrs = [], []

    def on_train_begin(self, model, optimizer):
        self.events.append(("begin", model, optimizer))

    def on_batch(self, step, batch):
        self.events.append(("batch", step, batch))

    def on_step_end(self, step, model, optimizer):
        self.events.append(("step_end", step))
        first = optimizer.param_groups[0]["params"][0]
        assert int(optimizer.state[first]["step"]) == step  # after optimizer.step()
        self.lrs.append(optimizer.param_groups[0]["lr"])  # after scheduler.step(): the next step's rate

    def on_evaluate(self, step, metrics):
        self.events.append(("evaluate", step, dict(metrics)))


def test_callbacks_see_every_step_and_evaluation(checkpoint, tmp_path):
    model = new_model(checkpoint)
    scores = iter([0.3, 0.1, 0.2])  # steps 0, 2, 4; lower is better here
    recorder = Recorder()
    args = tiny_args(max_steps=4, eval_every=2, eval_at_start=True, hard_negatives=1)
    result = train_bi_encoder(model, InBatchSoftmaxLoss(model), make_examples(n=8), args, tmp_path,
                              evaluator=FnEvaluator(lambda m: next(scores), greater_is_better=False),
                              callbacks=[recorder], progress=False)
    assert result["best_step"] == 2 and result["best_metric"] == pytest.approx(0.1)
    assert result["start_metric"] == pytest.approx(0.3)
    kinds = [e[0] if e[0] in ("begin", "batch", "step_end") else e[:2] for e in recorder.events]
    assert kinds == ["begin", ("evaluate", 0), "batch", "step_end", "batch", "step_end", ("evaluate", 2),
                     "batch", "step_end", "batch", "step_end", ("evaluate", 4)]
    assert recorder.events[0][1] is model and isinstance(recorder.events[0][2], torch.optim.Optimizer)
    assert [e[1] for e in recorder.events if e[0] == "batch"] == [1, 2, 3, 4]
    assert [e[1] for e in recorder.events if e[0] == "step_end"] == [1, 2, 3, 4]
    assert [e[2] for e in recorder.events if e[0] == "evaluate"] == [
        {"dev": 0.3, "other": -1.0}, {"dev": 0.1, "other": -1.0}, {"dev": 0.2, "other": -1.0}]
    q, p, n, w = recorder.events[2][2]
    assert q["input_ids"].shape[0] == 4 and p["input_ids"].shape[0] == 4 and n["input_ids"].shape[0] == 4
    assert torch.equal(w, torch.ones(4))
    lrs = [h["lr"] for h in result["history"]]
    assert recorder.lrs[:-1] == pytest.approx(lrs[1:]) and recorder.lrs[-1] == 0.0


class MomentumLoss(InBatchSoftmaxLoss, TrainerCallback):
    """A loss with state of its own: an EMA copy of the query projection, updated after each step."""

    def __init__(self, model, momentum=0.5):
        super().__init__(model)
        self.momentum = momentum
        self.register_buffer("ema", model.query_projection.weight.detach().clone())

    def on_step_end(self, step, model, optimizer):
        with torch.no_grad():
            self.ema.mul_(self.momentum).add_(model.query_projection.weight, alpha=1 - self.momentum)


class Snapshots(TrainerCallback):
    def __init__(self):
        self.weights = []

    def on_step_end(self, step, model, optimizer):
        self.weights.append(model.query_projection.weight.detach().clone())


def test_loss_that_is_a_callback_updates_its_state(checkpoint, tmp_path):
    model = new_model(checkpoint)
    loss = MomentumLoss(model, momentum=0.75)
    initial = loss.ema.clone()
    snapshots = Snapshots()
    train_bi_encoder(model, loss, make_examples(n=8), tiny_args(max_steps=3, hard_negatives=0), tmp_path,
                     callbacks=[snapshots, loss], progress=False)  # listed again: still called once
    assert len(snapshots.weights) == 3
    expected = initial
    for weight in snapshots.weights:  # ema <- 0.75 ema + 0.25 w after each step
        expected = expected.mul(0.75).add(weight, alpha=0.25)
    assert not torch.equal(loss.ema, initial)
    assert torch.equal(loss.ema, expected)


def test_resume_restores_the_loss_state(checkpoint, tmp_path):
    examples = make_examples(n=8)
    args = tiny_args(max_steps=4, checkpoint_every=2, hard_negatives=0)
    one = new_model(checkpoint, seed=1)
    one_loss = MomentumLoss(one)
    train_bi_encoder(one, one_loss, examples, args, tmp_path / "one", progress=False)

    first = new_model(checkpoint, seed=1)
    with pytest.raises(Crash):
        train_bi_encoder(first, MomentumLoss(first), examples, args, tmp_path / "two",
                         callbacks=[crash_at(3)], progress=False)
    second = new_model(checkpoint, seed=3)  # its EMA starts elsewhere: the checkpoint must restore it
    second_loss = MomentumLoss(second)
    result = train_bi_encoder(second, second_loss, examples, args, tmp_path / "two", progress=False)
    assert result["resumed_from"].endswith("step-0000002")
    assert torch.allclose(one_loss.ema, second_loss.ema, atol=1e-6, rtol=0)
    assert torch.allclose(one.query_projection.weight, second.query_projection.weight, atol=1e-6, rtol=0)


# -- distillation: the teacher scores the pairs each batch draws ---------------------------------

class CountingTeacher:
    """A deterministic stand-in for the cross-encoder: a logit from the pair's lengths; counts pairs."""

    def __init__(self):
        self.pairs = []

    def __call__(self, pairs):
        self.pairs += list(pairs)
        return [0.1 * len(q) - 0.05 * len(p) for q, p in pairs]


def test_the_teacher_scores_only_the_drawn_pairs_of_the_queries_trained_on(tokenizer):
    """GPL labels only the triplets it trains on: per question the positive and the N drawn of
    its pool of M, with the query the batch trains on (one of its generated queries)."""
    examples = make_examples(n=5, pool=4)
    for i, e in enumerate(examples[:2]):
        e.queries = [f"first query {i}", f"second longer query {i}"]
    teacher = CountingTeacher()
    coll = Collator(tokenizer, hard_negatives=2, seed=0, teacher_scores=True, teacher=teacher)
    *_, matrix = coll(examples, epoch=1)
    assert matrix.shape == (5, 3) and len(teacher.pairs) == 5 * 3   # not 5 * (1 + 4)
    drawn = coll.draw_negatives(examples, 1)
    for row, e in enumerate(examples):
        query = coll.choose_query(e, 1)
        texts = [e.positive[1]] + [negative[1] for negative in drawn[2 * row:2 * row + 2]]
        assert matrix[row].tolist() == pytest.approx([0.1 * len(query) - 0.05 * len(t) for t in texts])
        assert coll.teacher_rows[f"1:{e.qid}"] == pytest.approx(matrix[row].tolist())
    restored = Collator(tokenizer, hard_negatives=2, teacher_scores=True, teacher=teacher)
    restored.load_state_dict(coll.state_dict())
    assert restored.teacher_rows == coll.teacher_rows
    # scores an example carries (its whole pool, scored beforehand) are read, not asked for
    for e in examples:
        e.teacher_scores = [1.0, 2.0, 3.0, 4.0, 5.0]
    calls = len(teacher.pairs)
    *_, matrix = coll(examples)
    assert len(teacher.pairs) == calls and matrix[:, 0].tolist() == [1.0] * 5
    with pytest.raises(ValueError, match="no teacher"):
        Collator(tokenizer, hard_negatives=1, teacher_scores=True)(make_examples(n=2, pool=2))


def test_a_resumed_distilling_run_scores_only_the_steps_left_and_keeps_the_whole_record(checkpoint, tmp_path):
    from models.losses import build_loss

    examples = make_examples(n=12, pool=3)
    args = tiny_args(max_steps=8, checkpoint_every=4, hard_negatives=1)
    whole_teacher = CountingTeacher()
    one = new_model(checkpoint, seed=1)
    whole = train_bi_encoder(one, build_loss("margin_mse", one), examples, args, tmp_path / "one", progress=False,
                             teacher=whole_teacher)
    assert len(whole_teacher.pairs) == 8 * 4 * 2 and len(whole["teacher_rows"]) == 8 * 4

    first = new_model(checkpoint, seed=1)
    with pytest.raises(Crash):
        train_bi_encoder(first, build_loss("margin_mse", first), examples, args, tmp_path / "two",
                         callbacks=[crash_at(6)], progress=False, teacher=CountingTeacher())
    resumed_teacher = CountingTeacher()
    second = new_model(checkpoint, seed=3)
    result = train_bi_encoder(second, build_loss("margin_mse", second), examples, args, tmp_path / "two",
                              progress=False, teacher=resumed_teacher)
    assert result["resumed_from"].endswith("step-0000004")
    assert len(resumed_teacher.pairs) == 4 * 4 * 2   # steps 5 to 8 only
    assert torch.allclose(torch.tensor(result["teacher_rows"]), torch.tensor(whole["teacher_rows"]), atol=1e-6, rtol=0)
    for (name, a), (_, b) in zip(one.state_dict().items(), second.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name
    with pytest.raises(ValueError, match="teacher"):
        train_bi_encoder(second, build_loss("margin_mse", second), examples, args, tmp_path / "three", progress=False)
