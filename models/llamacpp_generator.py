"""doc2query through llama.cpp (llama-cpp-python's C API): a Llama-family generator written once
per model version as a GGUF file (models/gguf_export.py, cached by models/runtime_cache.py) and
decoded by llama.cpp's CPU kernels at q8_0 (`compute_type: int8`), bf16 or f32, many sequences per step.

`LlamaCppQueryGenerator.generate` keeps `QueryGenerator.generate`'s contract: the same prompts
(`prompt_ids`), up to n distinct questions per passage (`question_key`), each with its mean token
log-probability up to and including the first EOS under the model's raw distribution, in input
order, reproducible for a seed. llama.cpp only runs the model: sampling (top-k, then top-p, at
temperature 1, as transformers orders its warpers) and the log-probabilities happen here, in
numpy, from the raw logits, with one seeded generator per call.

A batch of prompts is decoded at once: each prompt's tokens are run once, into the KV stream of
its first sample sequence, and that stream is copied to its other n - 1 samples, so the prompt is
read once for its n questions; then every unfinished sequence advances one token per decode call.
Every sequence has a KV stream of its own (llama.cpp's non-unified cache): a decoding step's
attention reads each sample's own cells only, where one cache shared by all sequences has every
token attend over every prompt's cells of the batch, masked.
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from models.generator import Passage, QueryGenerator, questions_from_samples
from models.threads import kept_torch_threads

#: llama.cpp holds at most this many sequences in one context (LLAMA_MAX_SEQ)
MAX_SEQUENCES = 256
#: tokens per physical forward pass (the compute buffer grows with it)
UBATCH = 512
#: llama.cpp rounds each KV stream up to a multiple of this many cells (and says so on stderr)
STREAM_CELL_STEP = 256
#: compute types whose contexts keep an f32 KV cache without flash attention (which rounds through f16).
#: bf16 too: with the f32 cache its questions stay within fp32's seed-to-seed noise, with the f16 cache
#: they fall below it; the f32 cache costs some speed (docs/benchmarks.md, "CPU runtimes"); q8_0 keeps f16
F32_CACHE_TYPES = frozenset({"float32", "bfloat16"})


def llamacpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except (ImportError, OSError):  # OSError: the shared library does not load on this CPU
        return False
    return True


def llamacpp_bf16_in_hardware() -> bool:
    """Whether llama.cpp multiplies bf16 matrices in hardware here: the CPU has bf16 units
    (models/cpu_features.py) and the loaded build uses AVX-512's bf16 dot product (`make install`
    compiles for the machine's CPU; a build for any AVX2 CPU, as the Dockerfile's, emulates it)."""
    from models.cpu_features import has_bf16_units

    if not (has_bf16_units() and llamacpp_available()):
        return False
    import llama_cpp

    return "AVX512_BF16 = 1" in llama_cpp.llama_print_system_info().decode(errors="replace")


def convert(source: str | Path, compute_type: str) -> Path:
    """The GGUF file of the transformers folder `source` at `compute_type`, cached per model
    version, precision and writer versions."""
    import gguf
    import llama_cpp
    import transformers

    from models.gguf_export import TENSOR_TYPES, WRITER_VERSION, write_llama_gguf
    from models.runtime_cache import cached_conversion

    source = Path(source)
    if compute_type not in TENSOR_TYPES:
        raise ValueError(f"compute_type must be one of {sorted(TENSOR_TYPES)}, got {compute_type!r}")
    settings = {"tensor_type": TENSOR_TYPES[compute_type], "writer": WRITER_VERSION, "gguf": _version(gguf),
                "llama_cpp": llama_cpp.__version__,
                "transformers": transformers.__version__}
    folder = cached_conversion(source, "llamacpp", settings,
                               lambda target: write_llama_gguf(source, target / "model.gguf", compute_type))
    return folder / "model.gguf"


def _version(module) -> str:
    from importlib.metadata import version

    return getattr(module, "__version__", None) or version(module.__name__)


def sample_rows(logits: np.ndarray, rng: np.random.Generator, top_k: int, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """One token per row of `logits` (rows x vocab): the top_k most likely, then the smallest
    set of those whose mass reaches top_p (the most likely always kept), sampled at temperature
    1. Returns (tokens, their log-probability under the raw distribution)."""
    logits = logits.astype(np.float64, copy=False)
    rows, vocab = logits.shape
    k = vocab if top_k <= 0 else min(top_k, vocab)
    candidates = np.argpartition(-logits, k - 1, axis=1)[:, :k]
    picked = np.take_along_axis(logits, candidates, axis=1)
    order = np.argsort(-picked, axis=1, kind="stable")
    candidates, picked = np.take_along_axis(candidates, order, axis=1), np.take_along_axis(picked, order, axis=1)
    probs = np.exp(picked - picked[:, :1])
    probs /= probs.sum(axis=1, keepdims=True)
    keep = (np.cumsum(probs, axis=1) - probs) < top_p  # the mass before a token is under top_p
    keep[:, 0] = True
    probs = np.where(keep, probs, 0.0)
    cumulative = np.cumsum(probs, axis=1)
    draws = rng.random(rows) * cumulative[:, -1]
    index = np.minimum((cumulative <= draws[:, None]).sum(axis=1), k - 1)
    tokens = candidates[np.arange(rows), index]
    top = logits.max(axis=1)
    log_norm = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
    return tokens, logits[np.arange(rows), tokens] - log_norm


class _Context:
    """One llama.cpp context sized for a call: `sequences` sample sequences, each with a KV stream
    of `cells` cells, and a token batch of `batch_tokens`."""

    def __init__(self, model, cells: int, sequences: int, batch_tokens: int, threads: int, f32_cache: bool):
        import llama_cpp as L

        self.open(L, model, self.params(L, cells, sequences, batch_tokens, threads, f32_cache))

    @staticmethod
    def params(L, cells: int, sequences: int, batch_tokens: int, threads: int, f32_cache: bool):
        """The context parameters of the runtime's layout (benchmarks/llamacpp_context.py varies them)."""
        params = L.llama_context_default_params()
        # llama.cpp gives each stream n_ctx / n_seq_max cells, rounded up to its step: asking for
        # the rounded count allocates the same and keeps its "rounding down" notice off stderr
        params.n_ctx = -(-cells // STREAM_CELL_STEP) * STREAM_CELL_STEP * sequences
        params.n_batch = batch_tokens
        params.n_ubatch = min(UBATCH, batch_tokens)
        params.n_seq_max = sequences
        params.n_threads = params.n_threads_batch = threads
        params.kv_unified = False  # a stream per sequence: a step attends over its own cells only
        params.no_perf = True
        if f32_cache:  # f32 and bf16 runtimes keep an f32 cache; q8_0 keeps llama.cpp's f16 one
            params.type_k = params.type_v = L.GGML_TYPE_F32
            params.flash_attn_type = 0  # llama.cpp's CPU flash attention rounds through f16
        return params

    def open(self, L, model, params) -> None:
        self.L = L
        self.ctx = L.llama_init_from_model(model, params)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not create a context of {params.n_ctx // params.n_seq_max} cells "
                               f"for each of {params.n_seq_max} sequences")
        self.batch = L.llama_batch_init(params.n_batch, 0, params.n_seq_max)
        self.vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))

    def clear(self) -> None:
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)

    def copy_sequence(self, source: int, target: int) -> None:
        """`target`'s stream becomes a copy of `source`'s cells (done before the next decode)."""
        self.L.llama_memory_seq_cp(self.L.llama_get_memory(self.ctx), source, target, -1, -1)

    def prefill(self, prompts: Sequence[Sequence[int]], n: int) -> np.ndarray:
        """Each prompt run once into the stream of its first sample (sequence p * n), copied to its
        other n - 1; the logits of each prompt's last token, one row per prompt."""
        logits = self.decode([(token, pos, (p * n,), pos == len(prompt) - 1)
                              for p, prompt in enumerate(prompts) for pos, token in enumerate(prompt)])
        for p in range(len(prompts)):
            for s in range(p * n + 1, (p + 1) * n):
                self.copy_sequence(p * n, s)
        return logits

    def decode(self, tokens: Sequence[tuple[int, int, Sequence[int], bool]]) -> np.ndarray:
        """Run (token, position, sequence ids, wants logits) entries; the logits rows of the
        entries that want them, in order."""
        b = self.batch
        for i, (token, pos, seqs, logits) in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, len(seqs), logits
            for j, s in enumerate(seqs):
                b.seq_id[i][j] = s
        b.n_tokens = len(tokens)
        rc = self.L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc} for {len(tokens)} tokens")
        rows = [i for i, entry in enumerate(tokens) if entry[3]]
        out = np.empty((len(rows), self.vocab), dtype=np.float32)
        for r, i in enumerate(rows):
            pointer = self.L.llama_get_logits_ith(self.ctx, i)
            out[r] = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self.vocab,))
        return out

    def close(self) -> None:
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)


class LlamaCppQueryGenerator:
    """`QueryGenerator.generate` run by llama.cpp; `base` (the torch generator, used for its
    tokenizer and prompts only) and the GGUF file at `gguf_path`."""

    def __init__(self, base: QueryGenerator, gguf_path: str | Path, compute_type: str, threads: int | None = None):
        import llama_cpp
        import llama_cpp._logger
        import torch

        if base.kind != "causal":
            raise ValueError("the llamacpp runtime generates with causal models only")
        self.base, self.compute_type, self.path = base, compute_type, str(gguf_path)
        # the project's one thread count (models/threads.py): torch's, in the calling thread
        self.threads = threads or torch.get_num_threads()
        llama_cpp._logger.set_verbose(False)  # llama.cpp's load report goes to stderr otherwise
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        self._model = llama_cpp.llama_model_load_from_file(self.path.encode(), params)
        if not self._model:
            raise RuntimeError(f"{self.path}: llama.cpp could not load the model")
        self._free = llama_cpp.llama_model_free

    def __del__(self):
        model, self._model = getattr(self, "_model", None), None
        if model and self._free is not None:
            self._free(model)

    @property
    def tokenizer(self):
        return self.base.tokenizer

    def generate(self, passages: Sequence[Passage], n: int = 5, top_p: float = 0.95, top_k: int = 25,
                 max_new_tokens: int = 32, batch_size: int = 16, seed: int = 0, max_source_len: int = 256,
                 device=None, progress: Callable[[int, int], None] | None = None) -> list[list[tuple[str, float]]]:
        """As `QueryGenerator.generate` (CPU only: `device` is ignored). Batches of at most
        `batch_size` prompts (and MAX_SEQUENCES samples) run longest prompt first."""
        tok = self.tokenizer
        ids = self.base.prompt_ids(passages, max_source_len)
        results: list[list[tuple[str, float]]] = [[] for _ in ids]
        if not ids:
            return results
        per_batch = max(1, min(batch_size, MAX_SEQUENCES // n))
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        longest = len(ids[order[0]])
        rng = np.random.default_rng(seed)
        with kept_torch_threads():
            context = _Context(self._model, cells=longest + max_new_tokens, sequences=per_batch * n,
                               batch_tokens=per_batch * max(longest, n), threads=self.threads,
                               f32_cache=self.compute_type in F32_CACHE_TYPES)
            try:
                for start in range(0, len(order), per_batch):
                    chunk = order[start:start + per_batch]
                    sampled = self.sample_ids(context, [ids[i] for i in chunk], n, top_p, top_k, max_new_tokens, rng)
                    for i, samples in zip(chunk, sampled):
                        results[i] = questions_from_samples(tok, samples, n)
                    if progress is not None:
                        progress(min(start + per_batch, len(order)), len(order))
            finally:
                context.close()
        return results

    def sample_ids(self, context: _Context, prompts: list[list[int]], n: int, top_p: float, top_k: int,
                   max_new_tokens: int, rng: np.random.Generator) -> list[list[tuple[list[int], float]]]:
        """n samples per prompt: (new token ids, EOS included when reached; mean token log-prob)."""
        eos = self.tokenizer.eos_token_id
        context.clear()
        logits = np.repeat(context.prefill(prompts, n), n, axis=0)  # sequence s = prompt s // n
        tokens: list[list[int]] = [[] for _ in range(len(prompts) * n)]
        logprobs = [0.0] * len(tokens)
        active = list(range(len(tokens)))
        while active:
            drawn, lps = sample_rows(logits, rng, top_k, top_p)
            still = []
            for s, token, lp in zip(active, drawn.tolist(), lps.tolist()):
                tokens[s].append(token)
                logprobs[s] += lp
                if token != eos and len(tokens[s]) < max_new_tokens:
                    still.append(s)
            active = still
            if active:
                logits = context.decode([(tokens[s][-1], len(prompts[s // n]) + len(tokens[s]) - 1, (s,), True)
                                         for s in active])
        return [[(tokens[s], logprobs[s] / len(tokens[s])) for s in range(p * n, (p + 1) * n)]
                for p in range(len(prompts))]


def load_llamacpp_generator(base: QueryGenerator, source: str, compute_type: str,
                            threads: int | None = None) -> LlamaCppQueryGenerator:
    """`base` (loaded from `source`, an alias or folder) wrapped with its cached GGUF file."""
    from models.checkpoints import resolve_checkpoint

    return LlamaCppQueryGenerator(base, convert(resolve_checkpoint(source), compute_type), compute_type, threads)
