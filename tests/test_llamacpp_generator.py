"""The llama.cpp question-generation runtime (models/llamacpp_generator.py) and its GGUF writer
(models/gguf_export.py) on the tiny random Llama of the CTranslate2 tests (SmolLM2's
architecture: grouped-query attention, rope_theta 1e5, tied embeddings), written in the fixture."""
import json
import math
import shutil

import numpy as np
import pytest
import torch

from models.generator import load_generator
from models.gguf_export import TENSOR_TYPES, rope_permuted, write_llama_gguf
from tests.test_ctranslate2_generator import assert_generation_contract, assert_scores_are_the_torch_models
from tests.test_ctranslate2_generator import gpt2, llama  # noqa: F401  (fixtures)
from tests.test_generator import PASSAGES

llama_cpp = pytest.importorskip("llama_cpp")
from models.llamacpp_generator import (LlamaCppQueryGenerator, _Context, convert,  # noqa: E402
                                       load_llamacpp_generator, sample_rows)

N = 4


def _logits(generator: LlamaCppQueryGenerator, prompt: list[int]) -> np.ndarray:
    """llama.cpp's logits at every position of `prompt` (one sequence)."""
    context = _Context(generator._model, cells=64, sequences=1, batch_tokens=len(prompt), threads=1,
                       f32_cache=generator.compute_type == "float32")
    try:
        return context.decode([(t, pos, (0,), True) for pos, t in enumerate(prompt)])
    finally:
        context.close()


@pytest.fixture(scope="module", params=["float32", "int8", "bfloat16"])
def lcpp(request, llama):  # noqa: F811
    return load_llamacpp_generator(load_generator(str(llama)), str(llama), request.param, threads=1)


def test_written_file_computes_the_torch_models_logits(lcpp):
    """f32: the GGUF file gives the torch model's logits up to float32 rounding (the weights,
    their names, the rotary permutation and the hyper-parameters are right); q8_0: within the
    8-bit blocks' rounding."""
    base = lcpp.base
    prompt = base.prompt_ids(PASSAGES)[0]
    with torch.no_grad():
        expected = base.model.eval()(torch.tensor([prompt])).logits[0].numpy()
    got = _logits(lcpp, prompt)
    scale = float(np.abs(expected).max())
    if lcpp.compute_type == "float32":
        # a few hundred float32 products and sums per logit: far below 1e-4 of the logits' range
        np.testing.assert_allclose(got, expected, atol=1e-4 * max(scale, 1.0), rtol=0)
    else:  # q8_0's 8-bit blocks and bf16's 8-bit mantissas: a few percent of the logits' range
        assert np.abs(got - expected).max() < 0.05 * scale
        assert (got.argmax(-1) == expected.argmax(-1)).mean() >= 0.9
    import gguf

    matrices = {t.tensor_type.name for t in gguf.GGUFReader(lcpp.path).tensors if len(t.shape) == 2}
    assert matrices == {TENSOR_TYPES[lcpp.compute_type]}  # every matrix at the precision asked for


def test_questions_distinct_scored_and_reproducible(lcpp):
    assert_generation_contract(lcpp)


def test_mean_logprob_is_the_torch_models_score_of_the_same_tokens(llama):  # noqa: F811
    """A sample's score equals the torch model's mean token log-probability of its tokens (raw
    distribution, up to and including EOS); the n samples of a prompt read its KV cells, run once
    into the first sample's stream and copied to the others."""
    base = load_generator(str(llama))
    gen = load_llamacpp_generator(base, str(llama), "float32", threads=1)
    prompts = base.prompt_ids(PASSAGES)
    context = _Context(gen._model, cells=max(map(len, prompts)) + 6, sequences=len(prompts) * N,
                       batch_tokens=sum(map(len, prompts)), threads=1, f32_cache=True)
    try:
        sampled = gen.sample_ids(context, prompts, N, 0.95, 25, 6, np.random.default_rng(0))
    finally:
        context.close()
    assert_scores_are_the_torch_models(base, prompts, sampled, n=N, max_new_tokens=6)


def test_sampling_keeps_top_k_then_top_p_and_scores_the_raw_distribution():
    rng = np.random.default_rng(0)
    logits = np.log(np.array([[0.5, 0.3, 0.1, 0.06, 0.04]] * 20000))
    tokens, lps = sample_rows(logits, rng, top_k=3, top_p=1.0)
    assert set(tokens.tolist()) == {0, 1, 2}
    np.testing.assert_allclose(lps, np.log([0.5, 0.3, 0.1, 0.06, 0.04])[tokens], atol=1e-12)
    share = np.bincount(tokens, minlength=5) / len(tokens)
    # renormalised over the top 3: 0.5/0.9, 0.3/0.9, 0.1/0.9 (5 standard errors at n = 20,000)
    np.testing.assert_allclose(share[:3], [5 / 9, 3 / 9, 1 / 9], atol=5 * math.sqrt(0.25 / 20000))
    # top-p 0.75: 0.5 alone is under it, 0.5 + 0.3 reaches it: the first two only
    tokens, _ = sample_rows(logits[:2000], rng, top_k=25, top_p=0.75)
    assert set(tokens.tolist()) == {0, 1}
    tokens, _ = sample_rows(logits[:100], rng, top_k=1, top_p=0.95)
    assert set(tokens.tolist()) == {0}
    tokens, _ = sample_rows(logits[:100], rng, top_k=25, top_p=0.01)  # the most likely is always kept
    assert set(tokens.tolist()) == {0}


def test_rope_permutation_interleaves_each_heads_halves():
    heads, head_dim = 2, 4
    rows = np.arange(heads * head_dim, dtype=np.float32)[:, None].repeat(3, axis=1)
    # transformers: head h's rotary pairs are (i, i + head_dim/2); llama.cpp: (2i, 2i + 1)
    assert rope_permuted(rows, heads)[:, 0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_conversion_cached_once_per_precision(llama, monkeypatch, tmp_path):  # noqa: F811
    monkeypatch.setenv("PFORGE_RUNTIME_CACHE", str(tmp_path))
    import models.gguf_export as export

    calls, real = [], export.write_llama_gguf

    def counting(source, target, compute_type):  # convert imports the writer when it runs
        calls.append(compute_type)
        return real(source, target, compute_type)

    monkeypatch.setattr(export, "write_llama_gguf", counting)
    first = convert(llama, "float32")
    again = convert(llama, "float32")
    other = convert(llama, "int8")
    assert first == again and other != first and first.is_relative_to(tmp_path) and first.name == "model.gguf"
    assert convert(llama, "int8") == other and calls == ["float32", "int8"]
    settings = json.loads((first.parent / "conversion.json").read_text())["settings"]
    assert settings["tensor_type"] == "F32" and settings["llama_cpp"] == llama_cpp.__version__
    assert settings["writer"] == export.WRITER_VERSION  # a changed writer never reuses an old file
    import gguf

    fields = gguf.GGUFReader(str(first)).fields
    types = fields["tokenizer.ggml.token_type"].contents()
    eos = load_generator(str(llama)).tokenizer.eos_token_id
    assert types[eos] == 3 and types[3] == 1  # control (</s>), normal (the first word) (llama.cpp's token types)
    assert fields["llama.rope.freq_base"].contents() == 100000.0


def test_only_the_llama_layout_is_written(gpt2, llama, tmp_path):  # noqa: F811
    with pytest.raises(ValueError, match="model_type 'gpt2'.*runtime: torch"):
        write_llama_gguf(gpt2, tmp_path / "a.gguf", "int8")
    scaled = tmp_path / "scaled"
    shutil.copytree(llama, scaled)
    config = json.loads((scaled / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e5}
    (scaled / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="rope_type = 'linear'.*runtime: torch"):
        write_llama_gguf(scaled, tmp_path / "b.gguf", "int8")
    with pytest.raises(ValueError, match="compute_type"):
        write_llama_gguf(llama, tmp_path / "c.gguf", "float16")
    with pytest.raises(ValueError, match="causal"):
        LlamaCppQueryGenerator(type("Seq2Seq", (), {"kind": "seq2seq"})(), tmp_path / "x.gguf", "int8")


def test_synthetic_queries_shard_through_llamacpp(llama):  # noqa: F811
    from tasks.qgen.stages import GenerateConfig, _generate_shard, _GenerateJob

    g = GenerateConfig(queries_per_passage=2, max_new_tokens=6, batch_size=2, device="cpu", runtime="llamacpp",
                       compute_type="int8")
    spec = (0, ["p0", "p1", "p2"], [t for t, _ in PASSAGES], [x for _, x in PASSAGES])
    table = _generate_shard(_GenerateJob(str(llama), "auto", None, g, 1), spec)
    # a passage whose samples all stop at once has no question (the tiny model's loud EOS)
    assert table.num_rows >= 3 and len(set(table.column("pid").to_pylist()) & {"p0", "p1", "p2"}) >= 2
    assert all(lp <= 0 for lp in table.column("logprob").to_pylist())
    assert _generate_shard(_GenerateJob(str(llama), "auto", None, g, 1), spec).equals(table)


def test_generation_leaves_torchs_thread_count_alone(llama):  # noqa: F811
    gen = load_llamacpp_generator(load_generator(str(llama)), str(llama), "float32", threads=1)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        gen.generate(PASSAGES, seed=3, n=N, max_new_tokens=4, batch_size=2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_more_samples_than_prompt_tokens(lcpp):
    """A decoding step carries one token per sample: the batch holds n of them even where n is
    longer than the prompt."""
    n = len(lcpp.base.prompt_ids(PASSAGES[:1])[0]) + 4
    questions = lcpp.generate(PASSAGES[:1], n=n, max_new_tokens=2, batch_size=1)
    assert len(questions) == 1 and len(questions[0]) <= n


def test_streams_are_asked_for_in_llama_cpps_own_cell_step(lcpp, capfd):
    """Every stream gets at least the cells asked for, in the count llama.cpp allocates anyway,
    so it has no rounding to announce on stderr (it did for every prompt length before)."""
    from models.llamacpp_generator import STREAM_CELL_STEP

    capfd.readouterr()
    # 16 streams of 201 cells: 3,216 in all, which llama.cpp used to round up to 16 x 256, saying so
    context = _Context(lcpp._model, cells=STREAM_CELL_STEP - 55, sequences=16, batch_tokens=32, threads=1,
                       f32_cache=lcpp.compute_type == "float32")
    try:
        assert llama_cpp.llama_n_ctx(context.ctx) == 16 * STREAM_CELL_STEP
    finally:
        context.close()
    assert "rounding" not in capfd.readouterr().err


def test_bf16_in_hardware_needs_both_the_cpus_units_and_the_builds_kernels(cpuinfo, monkeypatch):
    from models.llamacpp_generator import llamacpp_bf16_in_hardware

    def machine(flags: str, system_info: str):
        cpuinfo(f"processor\t: 0\nflags\t\t: {flags}\n")
        monkeypatch.setattr(llama_cpp, "llama_print_system_info", lambda: system_info.encode())
        return llamacpp_bf16_in_hardware()

    assert machine("avx2 avx512f avx512_bf16", "CPU : AVX2 = 1 | AVX512 = 1 | AVX512_BF16 = 1 |")
    assert not machine("avx2 avx512f avx512_bf16", "CPU : AVX2 = 1 |")  # a build for any AVX2 CPU
    assert not machine("avx2 fma", "CPU : AVX2 = 1 | AVX512_BF16 = 1 |")  # no bf16 units here


def test_f32_and_bf16_generate_with_an_f32_cache_and_q8_0_with_f16(lcpp, monkeypatch):
    """The KV cache of a generation call: f32 (no flash attention) for the f32 and bf16 runtimes,
    llama.cpp's f16 for q8_0 (bf16's questions with the f16 cache fell 0.86 ROUGE-L under fp32's)."""
    import models.llamacpp_generator as module

    asked = []
    real_params = module._Context.params

    def params(L, cells, sequences, batch_tokens, threads, f32_cache):
        asked.append(f32_cache)
        out = real_params(L, cells, sequences, batch_tokens, threads, f32_cache)
        asked.append((out.type_k, out.type_v, out.flash_attn_type))
        return out
    monkeypatch.setattr(module._Context, "params", staticmethod(params))
    lcpp.generate(PASSAGES[:1], n=2, max_new_tokens=2)
    f32 = lcpp.compute_type in ("float32", "bfloat16")
    assert asked[0] is f32
    assert (asked[1] == (llama_cpp.GGML_TYPE_F32, llama_cpp.GGML_TYPE_F32, 0)) is f32
