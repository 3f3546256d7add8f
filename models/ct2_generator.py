"""doc2query through CTranslate2: a causal (Llama-family) generator converted once per model
version (models/runtime_cache.py) and sampled by CTranslate2's C++ decoder, int8 or float32.

`CT2QueryGenerator.generate` keeps `QueryGenerator.generate`'s contract: the same prompts
(`prompt_ids`), up to n distinct questions per passage (`question_key`), each with its mean token
log-probability up to and including the first EOS under the model's raw distribution, in input
order, reproducible for a seed. CTranslate2's `scores` under sampling with `return_end_token` are
exactly that mean (length_penalty 1 divides the summed log-probabilities, EOS included, by the
token count); tests/test_ctranslate2_generator.py holds it to the torch model's scoring.

Which runtime generates ('auto') is chosen in models/generator_runtime.py.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from models.generator import Passage, QueryGenerator, questions_from_samples
from models.threads import kept_torch_threads

#: model_type values (config.json) whose decoder CTranslate2's Llama loader converts
LLAMA_FAMILY = frozenset({"llama"})


def ctranslate2_available() -> bool:
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return False
    return True


def convert(source: str | Path, compute_type: str) -> Path:
    """The CTranslate2 conversion of the transformers folder `source` at `compute_type`, cached
    per model version, precision and converter versions."""
    import ctranslate2
    import transformers

    from models.runtime_cache import cached_conversion

    source = Path(source)
    config = source / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{source}: no config.json (ctranslate2 converts a local transformers model folder)")
    model_type = json.loads(config.read_text()).get("model_type")
    if model_type not in LLAMA_FAMILY:
        raise ValueError(f"{config}: model_type {model_type!r}; the ctranslate2 runtime takes Llama-family causal "
                         "models only (set qgen.generate.runtime: torch)")
    settings = {"quantization": compute_type, "ctranslate2": ctranslate2.__version__,
                "transformers": transformers.__version__}

    def build(target: Path) -> None:
        # the cache hands an empty folder: force lets the converter write into it
        ctranslate2.converters.TransformersConverter(str(source)).convert(str(target), quantization=compute_type,
                                                                          force=True)
        _check_conversion(source, target)

    return cached_conversion(source, "ctranslate2", settings, build)


def _check_conversion(source: Path, target: Path) -> None:
    """Fill special tokens the tokenizer lacks (CTranslate2 refuses a null one at load time) and
    check the vocabulary maps every token string to the tokenizer's id: prompts travel as strings."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(source))
    config_file = target / "config.json"
    config = json.loads(config_file.read_text())
    for key in ("bos_token", "unk_token"):
        if config.get(key) is None:
            config[key] = config["eos_token"]  # never emitted: generation starts from the prompt
    config_file.write_text(json.dumps(config, indent=2) + "\n")
    vocabulary = json.loads((target / "vocabulary.json").read_text())
    tokens = tok.convert_ids_to_tokens(list(range(len(tok))))
    if vocabulary[:len(tokens)] != tokens:
        bad = next(i for i, (a, b) in enumerate(zip(vocabulary, tokens)) if a != b)
        raise ValueError(f"{source}: ctranslate2's vocabulary differs from the tokenizer's at id {bad}")


#: CTranslate2 forwards a batch's prompts at once only up to the shortest one, then feeds the rest
#: one decoding step per token: a batch's prompt lengths may differ by this many tokens at most
MAX_PROMPT_SPREAD = 6


def length_batches(lengths: Sequence[int], batch_size: int, spread: int = MAX_PROMPT_SPREAD) -> list[list[int]]:
    """Indices of `lengths`, longest first, cut into batches of at most `batch_size` whose
    lengths lie within `spread` of their first (longest) one."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and len(batches[-1]) < batch_size and lengths[batches[-1][0]] - lengths[i] <= spread:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


class CT2QueryGenerator:
    """`QueryGenerator.generate` run by CTranslate2; `base` (the torch generator, used for its
    tokenizer and prompts only) and the conversion at `model_dir`."""

    def __init__(self, base: QueryGenerator, model_dir: str | Path, compute_type: str, device: str = "cpu",
                 threads: int | None = None):
        import ctranslate2
        import torch

        if base.kind != "causal":
            raise ValueError("the ctranslate2 runtime generates with causal models only")
        self.base, self.compute_type, self.device = base, compute_type, device
        # the project's one thread count (models/threads.py): torch's, in the calling thread
        self.threads = threads or torch.get_num_threads()
        self.model_dir = str(model_dir)
        self._ct2 = ctranslate2

    def _load(self):
        # A fresh Generator per call: CTranslate2 seeds a thread's sampler once, when that thread
        # first samples (set_random_seed does not reseed a running worker), so only new worker
        # threads make a seed give the same questions on every call.
        with kept_torch_threads():
            return self._ct2.Generator(self.model_dir, device=self.device, compute_type=self.compute_type,
                                       intra_threads=self.threads, inter_threads=1)

    @property
    def tokenizer(self):
        return self.base.tokenizer

    def generate(self, passages: Sequence[Passage], n: int = 5, top_p: float = 0.95, top_k: int = 25,
                 max_new_tokens: int = 32, batch_size: int = 16, seed: int = 0, max_source_len: int = 256,
                 device=None, progress: Callable[[int, int], None] | None = None) -> list[list[tuple[str, float]]]:
        """As `QueryGenerator.generate` (`device` is fixed at construction). Batches run longest
        prompt first, at most `batch_size` prompts whose lengths differ by `MAX_PROMPT_SPREAD`
        tokens at most (`length_batches`)."""
        tok = self.tokenizer
        ids = self.base.prompt_ids(passages, max_source_len)
        results: list[list[tuple[str, float]]] = [[] for _ in ids]
        self._ct2.set_random_seed(seed)
        generator = self._load()
        done = 0
        for chunk in length_batches([len(x) for x in ids], batch_size):
            sampled = self.sample_ids(generator, [ids[i] for i in chunk], n, top_p, top_k, max_new_tokens)
            for i, samples in zip(chunk, sampled):
                results[i] = questions_from_samples(tok, samples, n)
            done += len(chunk)
            if progress is not None:
                progress(done, len(ids))
        return results

    def sample_ids(self, generator, prompts: list[list[int]], n: int, top_p: float, top_k: int,
                   max_new_tokens: int) -> list[list[tuple[list[int], float]]]:
        """n samples per prompt: (new token ids, EOS included when reached; mean token log-prob).
        `generator` is a `ctranslate2.Generator` (`_load`); prompts travel as token strings."""
        tok = self.tokenizer
        with kept_torch_threads():
            out = generator.generate_batch(
                [tok.convert_ids_to_tokens(p) for p in prompts], num_hypotheses=n, beam_size=1,
                sampling_topk=top_k, sampling_topp=top_p, sampling_temperature=1.0, max_length=max_new_tokens,
                include_prompt_in_result=False, end_token=[tok.eos_token_id], return_end_token=True,
                return_scores=True, length_penalty=1.0)  # scores: summed log-probs / token count
        return [[(list(ids), float(score)) for ids, score in zip(r.sequences_ids, r.scores)] for r in out]


def load_ct2_generator(base: QueryGenerator, source: str, compute_type: str, device: str = "cpu",
                       threads: int | None = None) -> CT2QueryGenerator:
    """`base` (loaded from `source`, an alias or folder) wrapped with its cached conversion."""
    from models.checkpoints import resolve_checkpoint

    return CT2QueryGenerator(base, convert(resolve_checkpoint(source), compute_type), compute_type, device, threads)
