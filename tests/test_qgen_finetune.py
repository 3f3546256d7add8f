"""Generator fine-tuning (tasks/qgen/finetune.py, on the shared training loop) on a tiny random
GPT-2 with a toy WordLevel tokenizer built offline."""
import json
import logging

import pytest
import torch

from tasks.qgen.finetune import GeneratorTrainArgs, finetune_generator
from tasks.training.data import epoch_order
from tasks.training.checkpoints import list_checkpoints

PAIRS = [
    (("Paris", "Paris is the capital of France."), "what is the capital of france"),
    (("Seine", "The Seine flows through Paris."), "what river flows through paris"),
    (("Rhine", "The Rhine is the largest river of the city."), "what is the largest river"),
    ((None, "Lyon is a city of France."), "where is lyon"),
    (("Loire", "The Loire flows through the city of Tours."), "where does the loire flow"),
]
TRAIN = PAIRS * 2  # 10 pairs: batches of 4 give 3 steps per epoch, the last one short
DEV = PAIRS[:3]


@pytest.fixture(scope="module")
def generator_dir(tmp_path_factory, flush_denormals):
    """A tiny random GPT-2 (dropout on, so training draws from the RNG) and its tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = ["Passage: . \n Question:"] + [f"{t} {x} {q}" for (t, x), q in PAIRS]
    tok.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[EOS]"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]",
                                        eos_token="[EOS]")
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=tokenizer.vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                     bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                     pad_token_id=tokenizer.pad_token_id)
    d = tmp_path_factory.mktemp("tiny_gpt2")
    GPT2LMHeadModel(cfg).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


@pytest.fixture
def make_generator(generator_dir):
    from models.generator import load_generator

    return lambda path=generator_dir: load_generator(str(path), kind="causal")


def args(**kw):
    base = dict(lr=1e-2, batch_size=4, max_steps=8, warmup_ratio=0.25, seed=3, bf16="off")
    return GeneratorTrainArgs(**{**base, **kw})


def weights(generator):
    return {k: v.detach().clone() for k, v in generator.model.state_dict().items()}


def assert_same_weights(a, b, tol=1e-6):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=tol, rtol=0), k


def test_args_are_a_strict_documented_form():
    with pytest.raises(Exception, match="extra"):
        GeneratorTrainArgs(learning_rate=1e-4)
    assert all(f.description for f in GeneratorTrainArgs.model_fields.values())
    assert GeneratorTrainArgs().lr == 1e-4 and GeneratorTrainArgs().bf16 == "auto"


def test_epoch_order_depends_on_seed_and_epoch_only():
    assert epoch_order(10, 3, 0) == epoch_order(10, 3, 0)
    assert sorted(epoch_order(10, 3, 1)) == list(range(10))
    assert epoch_order(10, 3, 0) != epoch_order(10, 3, 1) != epoch_order(10, 4, 1)


def test_each_epoch_is_a_new_shuffle_of_all_pairs(make_generator, tmp_path, monkeypatch):
    gen = make_generator()
    pairs = [(p, f"{q} {i}") for i, (p, q) in enumerate(TRAIN)]  # tell the repeats apart
    real_batch, seen = gen.training_batch, []

    def recording_batch(passages, questions, **kw):
        if gen.model.training:
            seen.append(list(questions))
        return real_batch(passages, questions, **kw)

    monkeypatch.setattr(gen, "training_batch", recording_batch)
    out = finetune_generator(gen, pairs, DEV, args(max_steps=6), tmp_path, device="cpu")
    assert [len(b) for b in seen] == [4, 4, 2] * 2
    assert out["pairs_per_second"] * out["seconds"] == pytest.approx(20)  # the short batches count as they are
    epochs = [sum(seen[:3], []), sum(seen[3:], [])]
    for epoch, questions in enumerate(epochs):
        assert questions == [pairs[i][1] for i in epoch_order(len(pairs), 3, epoch)]
    assert epochs[0] != epochs[1]


def test_training_lowers_train_and_dev_loss(make_generator, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tasks.training.trainer")
    out = finetune_generator(make_generator(), TRAIN * 2, DEV, args(max_steps=None, epochs=6, eval_every=5),
                             tmp_path, device="cpu")
    losses = [h["loss"] for h in out["history"]]
    assert out["total_steps"] == len(losses) == 6 * 5  # 20 pairs in batches of 4, six epochs
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5])
    assert [s for s, _ in out["dev_curve"]] == [0, 5, 10, 15, 20, 25, 30]
    assert out["dev_curve"][-1][1] < 0.5 * out["dev_curve"][0][1]
    assert out["best_step"] > 0 and out["best_metric"] == min(v for _, v in out["dev_curve"])
    assert out["start_metric"] == out["dev_curve"][0][1]
    assert out["resumed_from"] is None and out["pairs_per_second"] > 0
    assert json.loads((tmp_path / "history.json").read_text())["best_step"] == out["best_step"]
    # about every 10% of the steps a line, when there is no bar
    assert sum("generator step" in r.getMessage() and "/30" in r.getMessage() for r in caplog.records) == 10
    # best/ is a generator folder holding the best step's weights: its dev loss is the best one
    best = make_generator(tmp_path / "best")
    best.model.eval()
    with torch.no_grad():
        batch = best.training_batch([p for p, _ in DEV], [q for _, q in DEV])
        assert float(best.loss(batch)) == pytest.approx(out["best_metric"], rel=1e-4)


def test_resume_is_exact(make_generator, tmp_path, monkeypatch):
    run = args(max_steps=8, checkpoint_every=4, eval_every=3, keep_checkpoints=1)
    whole_gen = make_generator()
    whole = finetune_generator(whole_gen, TRAIN, DEV, run, tmp_path / "whole", device="cpu")

    # killed during step 6, after the checkpoint at step 4 (mid-epoch: 3 steps per epoch)
    killed_gen = make_generator()
    real_loss, calls = killed_gen.loss, []

    def dying_loss(batch):
        if killed_gen.model.training:
            calls.append(1)
            if len(calls) == 6:
                raise KeyboardInterrupt
        return real_loss(batch)

    monkeypatch.setattr(killed_gen, "loss", dying_loss)
    with pytest.raises(KeyboardInterrupt):
        finetune_generator(killed_gen, TRAIN, DEV, run, tmp_path / "parts", device="cpu")
    assert [s for s, _ in list_checkpoints(tmp_path / "parts")] == [4]
    # a checkpoint's model is a generator folder, as best/ is
    saved = make_generator(list_checkpoints(tmp_path / "parts")[0][1] / "model")
    assert saved.kind == "causal" and saved.model.state_dict().keys() == killed_gen.model.state_dict().keys()

    torch.manual_seed(123)  # a fresh process's RNG: the checkpoint must restore it
    resumed_gen = make_generator()
    resumed = finetune_generator(resumed_gen, TRAIN, DEV, run, tmp_path / "parts", device="cpu")
    assert resumed["resumed_from"].endswith("step-0000004")
    assert_same_weights(weights(whole_gen), weights(resumed_gen))
    for a, b in zip(whole["history"], resumed["history"], strict=True):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], abs=1e-6) for k in a)
    assert [s for s, _ in resumed["dev_curve"]] == [s for s, _ in whole["dev_curve"]] == [0, 3, 6, 8]
    assert [v for _, v in resumed["dev_curve"]] == pytest.approx([v for _, v in whole["dev_curve"]], abs=1e-6)
    assert (resumed["best_step"], resumed["total_steps"]) == (whole["best_step"], 8)
    assert [s for s, _ in list_checkpoints(tmp_path / "parts")] == [8]  # keep_checkpoints=1


def test_a_checkpoint_holding_a_bare_state_dict_is_dropped_and_the_run_starts_afresh(make_generator, tmp_path, caplog):
    old = tmp_path / "checkpoints" / "step-0000002"
    old.mkdir(parents=True)
    gen = make_generator()
    torch.save(gen.model.state_dict(), old / "model.pt")
    torch.save({"step": 2, "total_steps": 3, "n_train": len(TRAIN)}, old / "trainer_state.pt")
    with caplog.at_level(logging.WARNING, logger="tasks.qgen.finetune"):
        out = finetune_generator(gen, TRAIN, DEV, args(max_steps=3), tmp_path, device="cpu")
    assert out["resumed_from"] is None and len(out["history"]) == 3 and not old.exists()
    assert any("cannot resume" in r.getMessage() for r in caplog.records)


def test_resume_refuses_another_run(make_generator, tmp_path):
    finetune_generator(make_generator(), TRAIN, DEV, args(max_steps=2, checkpoint_every=2), tmp_path, device="cpu")
    with pytest.raises(ValueError, match="another out_dir"):
        finetune_generator(make_generator(), TRAIN, DEV, args(max_steps=4), tmp_path, device="cpu")


def test_rising_dev_loss_keeps_the_untrained_model(make_generator, tmp_path):
    gen = make_generator()
    start = weights(gen)
    out = finetune_generator(gen, TRAIN, DEV, args(lr=30.0, warmup_ratio=0, max_grad_norm=None, eval_every=2),
                             tmp_path, device="cpu")
    assert min(v for s, v in out["dev_curve"] if s > 0) > out["dev_curve"][0][1]
    assert (out["best_step"], out["best_metric"]) == (0, out["dev_curve"][0][1])
    assert_same_weights(weights(make_generator(tmp_path / "best")), start, tol=0)


def test_dev_evaluations_leave_the_training_stream_alone(make_generator, tmp_path, monkeypatch):
    """Dropout (and any random batch building) must draw the same numbers with or without dev
    evaluations in between."""
    runs = []
    for eval_every in (None, 1):
        gen = make_generator()
        real_batch = gen.training_batch

        def random_batch(*a, **kw):
            torch.rand(1)  # as a generator sampling prompt templates would
            return real_batch(*a, **kw)

        monkeypatch.setattr(gen, "training_batch", random_batch)
        out = finetune_generator(gen, TRAIN, DEV, args(max_steps=5, eval_every=eval_every),
                                 tmp_path / str(eval_every), device="cpu")
        runs.append((weights(gen), [h["loss"] for h in out["history"]]))
    assert_same_weights(runs[0][0], runs[1][0], tol=0)
    assert runs[0][1] == runs[1][1]


def test_bf16_on_the_cpu_autocasts_the_training_step(make_generator, tmp_path):
    """bf16 'on' trains under the CPU's bf16 autocast (its matrix products in bf16: forward hooks see
    bf16 outputs), near fp32's losses; on a CPU without bf16 units it says it is emulated. The
    suite's CPU has none (tests/conftest.py)."""
    seen: list[torch.dtype] = []

    def recorded(generator):
        linear = next(m for m in generator.model.modules() if type(m).__name__ == "Conv1D")  # GPT-2's projections
        linear.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
        return generator

    fp32 = finetune_generator(recorded(make_generator()), TRAIN, DEV, args(max_steps=3), tmp_path / "off", device="cpu")
    assert set(seen) == {torch.float32}
    seen.clear()
    with pytest.warns(UserWarning, match="emulated"):
        on = finetune_generator(recorded(make_generator()), TRAIN, DEV, args(max_steps=3, bf16="on"), tmp_path / "on",
                                device="cpu")
    assert torch.bfloat16 in seen
    # the same batches: bf16's 8-bit mantissas move a step's loss by about 2^-8 of its terms' size
    first_fp32, first_bf16 = fp32["history"][0]["loss"], on["history"][0]["loss"]
    assert first_bf16 != first_fp32 and abs(first_bf16 - first_fp32) < 0.02 * abs(first_fp32)


def test_empty_pairs_are_refused(make_generator, tmp_path):
    with pytest.raises(ValueError, match="no train pairs"):
        finetune_generator(make_generator(), [], DEV, args(), tmp_path, device="cpu")
    with pytest.raises(ValueError, match="no dev pairs"):
        finetune_generator(make_generator(), TRAIN, [], args(), tmp_path, device="cpu")
