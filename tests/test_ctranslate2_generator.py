"""The CTranslate2 question-generation runtime (models/ct2_generator.py) on a tiny random Llama
(SmolLM2's architecture: grouped-query attention, rope_theta 1e5, tied embeddings) with the
word-level tokenizer of the generator tests, converted in the fixture (no hub access)."""
import math
from types import SimpleNamespace

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from models import ct2_generator
from models.ct2_generator import CT2QueryGenerator, convert, load_ct2_generator
from models.generator_runtime import resolve_generator_runtime
from models.generator import load_generator, mean_token_logprobs, question_key
from models.llamacpp_generator import llamacpp_available
from tests.test_generator import PASSAGES, word_tokenizer

ctranslate2 = pytest.importorskip("ctranslate2")
N = 4


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    tokenizer = word_tokenizer(seq2seq=False)
    folder = tmp_path_factory.mktemp("tiny_llama")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, rope_theta=100000.0, tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id))
    with torch.no_grad():  # a louder EOS row: some samples stop before max_new_tokens, some do not
        model.model.embed_tokens.weight[tokenizer.eos_token_id] *= 8
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    tokenizer = word_tokenizer(seq2seq=False)
    folder = tmp_path_factory.mktemp("tiny_gpt2")
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=1, n_head=2)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=["float32", "int8"])
def ct2(request, llama):
    return load_ct2_generator(load_generator(str(llama)), str(llama), request.param, threads=1)


def test_questions_distinct_scored_and_reproducible(ct2):
    assert_generation_contract(ct2)


def assert_generation_contract(gen) -> None:
    """`QueryGenerator.generate`'s contract for a runtime: up to N distinct, stripped, scored
    questions per passage, the same for a seed, longest prompt first whatever the input order."""
    kw = dict(n=N, max_new_tokens=8, batch_size=2)
    first = gen.generate(PASSAGES, seed=3, **kw)
    assert len(first) == len(PASSAGES) and any(first)
    for questions in first:
        assert len(questions) <= N
        assert len({question_key(q) for q, _ in questions}) == len(questions)
        assert all(q == q.strip() and q for q, _ in questions)
        assert all(math.isfinite(lp) and lp <= 0 for _, lp in questions)
    assert gen.generate(PASSAGES, seed=3, **kw) == first  # the seed decides
    assert gen.generate(PASSAGES, seed=4, **kw) != first
    # batches of one run longest prompt first whatever the input order: reversed in, reversed out
    one = dict(kw, batch_size=1)
    assert gen.generate(PASSAGES[::-1], seed=3, **one) == gen.generate(PASSAGES, seed=3, **one)[::-1]


def test_mean_logprob_is_the_torch_models_score_of_the_same_tokens(llama):
    """CTranslate2's score of a sample equals the torch model's mean token log-probability of
    those tokens (raw distribution, up to and including EOS), as the torch path records it."""
    base = load_generator(str(llama))
    gen = load_ct2_generator(base, str(llama), "float32", threads=1)
    prompts = base.prompt_ids(PASSAGES)
    ctranslate2.set_random_seed(0)
    sampled = gen.sample_ids(gen._load(), prompts, n=N, top_p=0.95, top_k=25, max_new_tokens=6)
    assert_scores_are_the_torch_models(base, prompts, sampled, n=N, max_new_tokens=6)


def assert_scores_are_the_torch_models(base, prompts, sampled, n: int, max_new_tokens: int) -> None:
    """Each sample (ids, score) of each prompt: at most max_new_tokens ids, stopping at the first
    EOS, scored with the torch model's mean token log-probability of those ids (raw distribution,
    EOS included); some samples stop at EOS and some run to the limit, so both endings are checked."""
    eos, stopped, full_length, model = base.tokenizer.eos_token_id, 0, 0, base.model.eval()
    for prompt, samples in zip(prompts, sampled):
        assert len(samples) == n
        for ids, score in samples:
            assert 1 <= len(ids) <= max_new_tokens and eos not in ids[:-1]
            stopped += ids[-1] == eos
            full_length += len(ids) == max_new_tokens and ids[-1] != eos
            with torch.no_grad():
                logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1]
            token_lp = logits.log_softmax(-1).gather(-1, torch.tensor(ids)[:, None]).T
            expected = mean_token_logprobs(token_lp, torch.tensor([ids]), eos)
            assert score == pytest.approx(float(expected), abs=1e-4)
    assert stopped and full_length


def test_conversion_cached_once_per_precision(llama, monkeypatch, tmp_path):
    monkeypatch.setenv("PFORGE_RUNTIME_CACHE", str(tmp_path))
    calls = []
    real = ctranslate2.converters.TransformersConverter

    class Counting(real):
        def convert(self, *args, **kwargs):
            calls.append(kwargs.get("quantization"))
            return super().convert(*args, **kwargs)

    monkeypatch.setattr(ctranslate2.converters, "TransformersConverter", Counting)
    first = convert(llama, "float32")
    again = convert(llama, "float32")
    other = convert(llama, "int8")
    assert first == again and other != first and first.is_relative_to(tmp_path)
    assert convert(llama, "int8") == other and calls == ["float32", "int8"]
    settings = (first / "conversion.json").read_text()
    assert ctranslate2.__version__ in settings and "transformers" in settings


def test_only_llama_family_converts(gpt2):
    with pytest.raises(ValueError, match="model_type 'gpt2'.*runtime: torch"):
        convert(gpt2, "int8")
    with pytest.raises(ValueError, match="causal"):
        CT2QueryGenerator(SimpleNamespace(kind="seq2seq"), gpt2, "int8")


def test_auto_resolution(llama, gpt2, monkeypatch):
    """auto: llama.cpp on a CPU for a Llama-family model, else CTranslate2, else torch."""
    from models import llamacpp_generator

    monkeypatch.setattr(llamacpp_generator, "llamacpp_available", lambda: True)
    monkeypatch.setattr(llamacpp_generator, "llamacpp_bf16_in_hardware", lambda: False)
    assert resolve_generator_runtime("auto", "auto", str(llama), "auto", "cpu") == ("llamacpp", "int8")
    assert resolve_generator_runtime("auto", "auto", "smollm2", "causal", "cpu") == ("llamacpp", "int8")
    assert resolve_generator_runtime("auto", "float32", "smollm2", "auto", "cpu") == ("llamacpp", "float32")
    assert resolve_generator_runtime("auto", "auto", "smollm2", "auto", "cuda") == ("torch", "float32")
    assert resolve_generator_runtime("auto", "auto", str(gpt2), "auto", "cpu") == ("torch", "float32")
    assert resolve_generator_runtime("auto", "auto", "smollm2", "seq2seq", "cpu") == ("torch", "float32")
    assert resolve_generator_runtime("auto", "auto", "some/hub-model", "auto", "cpu") == ("torch", "float32")
    assert resolve_generator_runtime("ctranslate2", "auto", str(gpt2), "auto", "cpu") == ("ctranslate2", "int8")
    assert resolve_generator_runtime("ctranslate2", "float32", "smollm2", "auto", "cpu") == ("ctranslate2", "float32")
    with pytest.raises(ValueError, match="needs runtime llamacpp or ctranslate2"):
        resolve_generator_runtime("torch", "int8", "smollm2", "auto", "cpu")
    assert resolve_generator_runtime("llamacpp", "bfloat16", "smollm2", "auto", "cpu") == ("llamacpp", "bfloat16")
    monkeypatch.setattr(llamacpp_generator, "llamacpp_bf16_in_hardware", lambda: True)  # a Zen 5, built natively
    assert resolve_generator_runtime("auto", "auto", "smollm2", "auto", "cpu") == ("llamacpp", "bfloat16")
    assert resolve_generator_runtime("auto", "int8", "smollm2", "auto", "cpu") == ("llamacpp", "int8")  # named: kept
    assert resolve_generator_runtime("ctranslate2", "auto", "smollm2", "auto", "cpu") == ("ctranslate2", "int8")
    monkeypatch.setattr(llamacpp_generator, "llamacpp_bf16_in_hardware", lambda: False)
    with pytest.raises(ValueError, match="bfloat16 needs runtime llamacpp"):
        resolve_generator_runtime("ctranslate2", "bfloat16", "smollm2", "auto", "cpu")
    monkeypatch.setattr(llamacpp_generator, "llamacpp_available", lambda: False)
    assert resolve_generator_runtime("auto", "auto", "smollm2", "auto", "cpu") == ("ctranslate2", "int8")
    monkeypatch.setattr(ct2_generator, "ctranslate2_available", lambda: False)
    assert resolve_generator_runtime("auto", "auto", "smollm2", "auto", "cpu") == ("torch", "float32")


def _generate_params(**generate):
    from tasks.qgen.stages import QgenConfig, stages
    from tasks.runners import RunnerConfig

    cfg = SimpleNamespace(qgen=QgenConfig(generator="smollm2", finetune={"enabled": False},
                                          generate={"device": "cpu", **generate}), runner=RunnerConfig())
    return next(s for s in stages(cfg, []) if s.name == "synthetic_queries").params


def test_runtime_resolved_at_planning_and_hashed():
    auto, torch_params = _generate_params(), _generate_params(runtime="torch")
    int8, fp32 = _generate_params(runtime="ctranslate2"), _generate_params(runtime="ctranslate2", compute_type="float32")
    q8 = _generate_params(runtime="llamacpp")
    expected = "llamacpp" if llamacpp_available() else "ctranslate2"
    assert (auto.generate.runtime, auto.generate.compute_type) == (expected, "int8")
    assert auto.hashed() == _generate_params(runtime=expected).hashed()  # auto is hashed as what it resolved to
    hashes = [p.hashed() for p in (torch_params, int8, fp32, q8)]
    assert all(a != b for i, a in enumerate(hashes) for b in hashes[i + 1:])


def test_synthetic_queries_shard_through_ctranslate2(llama):
    from tasks.qgen.stages import GenerateConfig, _generate_shard, _GenerateJob

    g = GenerateConfig(queries_per_passage=2, max_new_tokens=6, batch_size=2, device="cpu", runtime="ctranslate2",
                       compute_type="int8")
    spec = (0, ["p0", "p1", "p2"], [t for t, _ in PASSAGES], [x for _, x in PASSAGES])
    table = _generate_shard(_GenerateJob(str(llama), "auto", None, g, 1), spec)
    assert table.num_rows >= 3 and set(table.column("pid").to_pylist()) == {"p0", "p1", "p2"}
    assert all(lp <= 0 for lp in table.column("logprob").to_pylist())
    assert _generate_shard(_GenerateJob(str(llama), "auto", None, g, 1), spec).equals(table)


def test_length_batches_keep_prompt_lengths_close():
    from models.ct2_generator import length_batches

    lengths = [10, 30, 12, 29, 31, 11, 50, 30]
    batches = length_batches(lengths, batch_size=2, spread=2)
    assert batches == [[6], [4, 1], [7, 3], [2, 5], [0]]
    assert sorted(i for b in length_batches(lengths, 16) for i in b) == list(range(len(lengths)))
    assert length_batches(lengths, 16, spread=100) == [sorted(range(8), key=lambda i: -lengths[i])]


def test_generation_leaves_torchs_thread_count_alone(llama):
    """CTranslate2 sets the OpenMP thread count of the thread that calls it: torch's count (and
    so every later encode in this thread, models/threads.py) is as it was after generating."""
    gen = load_ct2_generator(load_generator(str(llama)), str(llama), "float32", threads=1)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        gen.generate(PASSAGES, seed=3, n=N, max_new_tokens=4, batch_size=2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_load_on_runtime_moves_a_torch_generator_to_its_device_and_returns_it():
    from models.generator_runtime import load_on_runtime

    class Model:
        def __init__(self):
            self.calls = []

        def to(self, device):
            self.calls.append(("to", device))
            return self

        def eval(self):
            self.calls.append(("eval",))
            return self

    base = type("Base", (), {})()
    base.model = Model()
    assert load_on_runtime(base, "smollm2", "torch", "float32", "cpu", threads=1) is base
    assert base.model.calls == [("to", "cpu"), ("eval",)]
