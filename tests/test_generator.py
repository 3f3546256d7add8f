"""Question generation (doc2query) with tiny random T5 and GPT-2 models and a word-level
tokenizer trained in the fixture (no hub access)."""
import math
from types import SimpleNamespace

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast, T5Config, T5ForConditionalGeneration

from models.generator import (QueryGenerator, SampledTokenLogprobs, load_generator, mean_token_logprobs,
                              question_key)

CORPUS = ["Passage: Paris. Paris is the capital of France.\nQuestion: what is the capital of France?",
          "The Seine river flows through Paris. What where who does is a of",
          "text2query: title passage text city largest"]
PASSAGES = [(None, "Paris"),  # short, long and middle: length sorting reorders them
            ("Seine", "The Seine river flows through Paris the city of France the largest city"),
            ("France", "France is a city")]


def word_tokenizer(seq2seq: bool) -> PreTrainedTokenizerFast:
    """T5-like (pad token, EOS appended to every input) or GPT-2-like (no pad token)."""
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=["<pad>", "</s>", "<unk>"]))
    if seq2seq:
        tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
        return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                                       unk_token="<unk>")
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")


def tiny_model(seq2seq: bool, vocab_size: int):
    torch.manual_seed(0)
    if seq2seq:
        return T5ForConditionalGeneration(T5Config(
            vocab_size=vocab_size, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2,
            pad_token_id=0, eos_token_id=1, decoder_start_token_id=0))
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_positions=128, n_embd=32, n_layer=1,
                                      n_head=2, bos_token_id=1, eos_token_id=1))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A folder with a tiny random model of each kind, as a user's checkpoint would be."""
    out = {}
    for kind in ("seq2seq", "causal"):
        tokenizer = word_tokenizer(kind == "seq2seq")
        out[kind] = tmp_path_factory.mktemp(kind)
        tiny_model(kind == "seq2seq", len(tokenizer)).save_pretrained(out[kind])
        tokenizer.save_pretrained(out[kind])
    return out


@pytest.fixture(params=["seq2seq", "causal"])
def saved(request, folders):
    return request.param, folders[request.param]


@pytest.fixture
def gen(saved):
    return load_generator(str(saved[1]))


def test_kind_detected_and_save_round_trip(saved, tmp_path):
    kind, folder = saved
    gen = load_generator(str(folder), prefix="text2query: ")
    assert gen.kind == kind
    batch = gen.training_batch(PASSAGES, ["what is Paris?"] * 3)
    again = load_generator(str(gen.save_pretrained(tmp_path / "out")))
    assert (again.kind, again.prefix) == (kind, "text2query: ")
    assert again.prompts(PASSAGES) == gen.prompts(PASSAGES)
    torch.testing.assert_close(again.loss(batch), gen.loss(batch))
    with pytest.raises(ValueError, match="kind"):
        load_generator(str(folder), kind="encoder")


def test_prompts_and_truncation_keep_the_question_cue(gen):
    gen.prefix = "text2query: "
    prompts = gen.prompts(PASSAGES)
    if gen.kind == "seq2seq":
        assert prompts[:2] == ["text2query: Paris", "text2query: Seine. The Seine river flows through "
                               "Paris the city of France the largest city"]
    else:
        assert prompts[0] == "Passage: text2query: Paris\nQuestion:"
        cue = gen.tokenizer("\nQuestion:", add_special_tokens=False)["input_ids"]
        ids = gen.prompt_ids(PASSAGES, max_source_len=8)
        assert all(len(row) <= 8 and row[-len(cue):] == cue for row in ids)
        assert len(gen.prompt_ids(PASSAGES)[1]) > 8


def test_seq2seq_labels_mask_only_padding(folders):
    gen = load_generator(str(folders["seq2seq"]))
    questions = ["what is Paris?", "where does the Seine river flow through the city?", "who"]
    batch = gen.training_batch(PASSAGES, questions, max_target_len=32)
    targets = gen.tokenizer(text_target=questions)["input_ids"]
    for row, target in enumerate(targets):
        labels = batch["labels"][row].tolist()
        assert labels == target + [-100] * (len(labels) - len(target))
        assert target[-1] == gen.tokenizer.eos_token_id
    mask = batch["attention_mask"]
    assert (batch["input_ids"][mask == 0] == gen.tokenizer.pad_token_id).all()
    assert mask.sum(1).tolist() == [len(ids) for ids in gen.prompt_ids(PASSAGES)]
    assert torch.isfinite(gen.loss(batch))


def test_causal_labels_cover_the_question_only(folders):
    gen = load_generator(str(folders["causal"]))
    assert gen.tokenizer.pad_token_id is None  # padding falls back to EOS
    questions = [" what is Paris? ", "where does the Seine river flow?", "who"]
    batch = gen.training_batch(PASSAGES, questions, max_target_len=4)
    eos = gen.tokenizer.eos_token_id
    for row, prompt in enumerate(gen.prompt_ids(PASSAGES)):
        answer = gen.tokenizer(" " + questions[row].strip(), add_special_tokens=False)["input_ids"][:3] + [eos]
        length = len(prompt) + len(answer)
        ids, labels = batch["input_ids"][row].tolist(), batch["labels"][row].tolist()
        assert ids[:length] == prompt + answer and set(ids[length:]) <= {eos}  # right padding
        assert labels == [-100] * len(prompt) + answer + [-100] * (len(labels) - length)
        assert batch["attention_mask"][row].tolist() == [1] * length + [0] * (len(ids) - length)
    # the loss is the mean cross-entropy of the question tokens (next-token shifted)
    logits = gen.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    expected = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), batch["labels"][:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(gen.loss(batch), expected)


def capture_generate(gen, monkeypatch):
    calls = []
    real = gen.model.generate

    def spy(**kwargs):
        cache = kwargs.get("cache")  # generation extends the cache: its length now, at the call
        calls.append({**kwargs, "cached_tokens": None if cache is None else cache.get_seq_length()})
        return real(**kwargs)

    monkeypatch.setattr(gen.model, "generate", spy)
    return calls


def test_sampling_settings_reach_generate(gen, monkeypatch):
    calls = capture_generate(gen, monkeypatch)
    done = []
    out = gen.generate(PASSAGES, n=3, max_new_tokens=4, batch_size=2,
                       progress=lambda d, t: done.append((d, t)))
    assert done == [(2, 3), (3, 3)]
    assert len(calls) == 2
    for kwargs, rows in zip(calls, (2, 1)):
        assert kwargs["do_sample"] is True and kwargs["use_cache"] is True
        assert (kwargs["top_p"], kwargs["top_k"], kwargs["max_new_tokens"]) == (0.95, 25, 4)
        if gen.kind == "causal":  # the prompt ran once; its cache holds 3 copies of each row
            assert kwargs["num_return_sequences"] == 1 and len(kwargs["input_ids"]) == rows * 3
            assert kwargs["cached_tokens"] == kwargs["input_ids"].shape[1] - 1
        else:
            assert kwargs["num_return_sequences"] == 3 and kwargs["cached_tokens"] is None
    if gen.kind == "causal":  # left padding: every prompt ends at the last column
        mask = calls[0]["attention_mask"]
        assert mask[:, -1].all() and (mask.diff(dim=1) >= 0).all() and not mask.all()
    assert len(out) == 3 and all(1 <= len(qs) <= 3 for qs in out)
    for questions in out:
        for text, score in questions:
            assert text == text.strip() and text and -math.log(len(gen.tokenizer)) * 10 < score < 0
    assert not gen.model.training


def test_shared_prompt_cache_samples_what_num_return_sequences_samples(folders):
    """Running each causal prompt once for its n samples changes the cost, not the samples: the
    same seed gives the same questions and log-probabilities as plain `num_return_sequences`."""
    gen = load_generator(str(folders["causal"]))
    shared = gen.generate(PASSAGES, n=4, max_new_tokens=6, batch_size=2, seed=3)
    gen.share_prompt_cache = False
    plain = gen.generate(PASSAGES, n=4, max_new_tokens=6, batch_size=2, seed=3)
    assert [[q for q, _ in qs] for qs in shared] == [[q for q, _ in qs] for qs in plain]
    for a, b in zip(shared, plain):
        assert [s for _, s in a] == pytest.approx([s for _, s in b], abs=1e-4)


def test_same_seed_same_questions_other_seed_differs(gen):
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    first = gen.generate(PASSAGES, n=4, max_new_tokens=6, seed=7)
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's RNG is untouched
    assert gen.generate(PASSAGES, n=4, max_new_tokens=6, seed=7) == first
    assert gen.generate(PASSAGES, n=4, max_new_tokens=6, seed=8) != first


def test_distinct_questions_in_input_order(gen, monkeypatch):
    """A fake model answers '<first passage word> What|what|is' so each result shows which
    passage it came from and duplicates differ only in case."""
    tok = gen.tokenizer
    words = [tok.convert_tokens_to_ids(w) for w in ("What", "what", "What", "is", "is")]
    skip = len(tok("Passage:", add_special_tokens=False)["input_ids"]) if gen.kind == "causal" else 0
    batches = []

    def fake_generate(input_ids, attention_mask, num_return_sequences, logits_processor, **kwargs):
        first = attention_mask.argmax(1) + skip  # first token of the passage in each row
        batches.append(tok.batch_decode(input_ids[torch.arange(len(first)), first][:, None]))
        new = torch.tensor([[int(input_ids[row, first[row]]), w, tok.eos_token_id]
                            for row in range(len(first)) for w in words[:num_return_sequences]])
        start = (input_ids.repeat_interleave(num_return_sequences, 0) if gen.kind == "causal"
                 else torch.zeros(len(new), 1, dtype=torch.long))
        sequences = torch.cat([start, new], 1)
        for step in range(new.shape[1]):  # uniform logits at every step
            logits_processor(sequences[:, :start.shape[1] + step], torch.zeros(len(new), len(tok)))
        return SimpleNamespace(sequences=sequences)

    gen.share_prompt_cache = False  # one row per prompt, so the fake sees each passage once
    monkeypatch.setattr(gen.model, "generate", fake_generate)
    out = gen.generate(PASSAGES, n=5, batch_size=2)
    assert batches == [["Seine", "France"], ["Paris"]]  # longest prompts first
    uniform = -math.log(len(tok))
    assert out == [[("Paris What", pytest.approx(uniform)), ("Paris is", pytest.approx(uniform))],
                   [("Seine What", pytest.approx(uniform)), ("Seine is", pytest.approx(uniform))],
                   [("France What", pytest.approx(uniform)), ("France is", pytest.approx(uniform))]]
    assert question_key("  What is\tParis? ") == question_key("what IS paris?")


def test_mean_logprob_stops_at_the_first_eos():
    eos = 1
    probs = torch.tensor([[[0.5, 0.25, 0.25]], [[0.2, 0.6, 0.2]], [[0.9, 0.05, 0.05]]])
    # row: token 0, then EOS, then EOS as padding (tokenizers without a pad token)
    tokens = torch.tensor([[0, eos, eos]])
    recorder = SampledTokenLogprobs()
    for step, logits in enumerate(torch.log(probs * 7).unbind(0)):  # unnormalised, as models give
        assert recorder(tokens[:, :step], logits) is logits  # the scores go on unchanged
    token_logprobs = recorder.token_logprobs(tokens)
    torch.testing.assert_close(token_logprobs, torch.log(torch.tensor([[0.5, 0.6, 0.05]])))
    score = mean_token_logprobs(token_logprobs, tokens, eos)
    torch.testing.assert_close(score, torch.tensor([(math.log(0.5) + math.log(0.6)) / 2]))


def test_a_causal_tokenizer_needs_eos():
    tok = word_tokenizer(seq2seq=False)
    tok.eos_token = None
    with pytest.raises(ValueError, match="EOS"):
        QueryGenerator(tiny_model(False, len(tok)), tok, "causal")


def test_causal_loss_projects_only_question_positions_and_equals_the_models_own(folders):
    """QueryGenerator.loss applies the vocabulary projection at the question's positions only
    (models/generator.py _question_token_loss): the same mean cross-entropy, and the same
    gradients, as the model's own loss over all positions."""
    gen = load_generator(str(folders["causal"]))
    batch = gen.training_batch(PASSAGES, ["what is Paris?", "who wrote it?", "when was it built?"])
    gen.model.train()
    torch.manual_seed(0)  # dropout: the same mask stream for both passes
    own = gen.model(**batch).loss
    own.backward()
    reference = {n: p.grad.clone() for n, p in gen.model.named_parameters() if p.grad is not None}
    gen.model.zero_grad()
    torch.manual_seed(0)
    sliced = gen.loss(batch)
    sliced.backward()
    # float32: the two sum the same terms in another order, a few ulps of the loss apart
    assert abs(float(sliced) - float(own)) <= 1e-5 * max(1.0, abs(float(own)))
    for name, grad in reference.items():
        assert torch.allclose(gen.model.get_parameter(name).grad, grad, rtol=1e-4, atol=1e-6), name
    gen.model.zero_grad()
