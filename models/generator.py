"""doc2query: generate questions for passages with a seq2seq model (T5 family) or a causal LM.

`load_generator` picks the kind; `QueryGenerator` builds prompts, training batches (for
fine-tuning on passage -> question pairs), the training loss and sampled questions.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer,
                          DynamicCache, LogitsProcessor, LogitsProcessorList)

from models.checkpoints import resolve_checkpoint

Passage = tuple[str | None, str]  # (title, text)

#: The causal LM prompt: the question follows after one space and ends with EOS.
CAUSAL_TEMPLATE = "Passage: {passage}\nQuestion:"
#: Written by `save_pretrained` beside the model, read back by `load_generator`.
GENERATOR_FILE = "generator.json"
KINDS = ("seq2seq", "causal")


def passage_text(title: str | None, text: str) -> str:
    return f"{title}. {text}" if title else text


def question_key(question: str) -> str:
    """Questions differing only in case or whitespace count as the same question."""
    return " ".join(question.split()).casefold()


def pad_sequences(seqs: Sequence[list[int]], pad_value: int, left: bool) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    rows = [[pad_value] * (width - len(s)) + s if left else s + [pad_value] * (width - len(s))
            for s in seqs]
    return torch.tensor(rows, dtype=torch.long)


def mean_token_logprobs(token_logprobs: torch.Tensor, tokens: torch.Tensor,
                        eos_id: int | None) -> torch.Tensor:
    """Mean of each row's per-token log-probabilities, up to and including its first EOS.

    `token_logprobs[r, i]` is the model's log-probability of `tokens[r, i]`. Tokens after EOS are
    padding (which may be EOS itself when the tokenizer has no pad token)."""
    if eos_id is None:
        valid = torch.ones_like(tokens, dtype=torch.bool)
    else:
        is_eos = (tokens == eos_id).long()
        valid = (is_eos.cumsum(1) - is_eos) == 0  # no EOS strictly before this position
    return (token_logprobs * valid).sum(1) / valid.sum(1).clamp(min=1)


class SampledTokenLogprobs(LogitsProcessor):
    """Records the log-probability of every sampled token under the model's raw distribution.

    `generate` calls its logits processors once per step, before the top-k/top-p warpers, with
    the tokens so far: the previous step's log-softmax is kept (one rows x vocab tensor, not one
    per step as `output_logits` would) and read at the token that was sampled from it."""

    def __init__(self):
        self.picked: list[torch.Tensor] = []
        self._last: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._last is not None:
            self.picked.append(self._last.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self._last = scores.float().log_softmax(-1)
        return scores

    def token_logprobs(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """(rows, steps) log-probabilities of `new_tokens`, the generated tokens of the call."""
        picked = list(self.picked)
        if self._last is not None:
            picked.append(self._last.gather(-1, new_tokens[:, -1:].to(self._last.device)).squeeze(-1))
        if len(picked) != new_tokens.shape[1]:
            raise RuntimeError(f"recorded {len(picked)} steps for {new_tokens.shape[1]} generated tokens")
        return torch.stack(picked, 1).to(new_tokens.device)


def _plain_lm_head(model) -> bool:
    """Logits are lm_head(hidden) and nothing else (no soft-capping or scaling of the logits)."""
    config = model.config
    return (model.get_output_embeddings() is not None and getattr(config, "final_logit_softcapping", None) is None
            and getattr(config, "logit_scale", None) is None and hasattr(model, "base_model"))


def _question_token_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The causal LM loss (mean cross-entropy of the next token where labels are not -100),
    with the vocabulary projection applied only at those positions: a question is ~20 of a
    prompt's ~200 tokens, and the projection to SmolLM2's 49k tokens is ~20% of a step's
    compute plus a (tokens x vocab) logits tensor and its gradient."""
    hidden = model.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    targets = batch["labels"][:, 1:]
    wanted = targets != -100
    logits = model.get_output_embeddings()(hidden[:, :-1][wanted])
    return torch.nn.functional.cross_entropy(logits.float(), targets[wanted])


class QueryGenerator:
    """A question generator: `kind` is 'seq2seq' or 'causal'; `prefix` goes before each input
    (doc2query T5 checkpoints expect their task prefix, e.g. 'text2query: ')."""

    def __init__(self, model, tokenizer, kind: str, prefix: str | None = None):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.model, self.tokenizer, self.kind, self.prefix = model, tokenizer, kind, prefix or ""
        #: causal LMs: run each prompt once for its n samples (False: `num_return_sequences`)
        self.share_prompt_cache = True
        if kind == "causal" and tokenizer.eos_token_id is None:
            raise ValueError("a causal generator needs a tokenizer with an EOS token")

    @property
    def pad_id(self) -> int:
        # causal tokenizers often lack a pad token; padding is masked anyway, so EOS serves
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def prompts(self, passages: Sequence[Passage]) -> list[str]:
        sources = [self.prefix + passage_text(title, text) for title, text in passages]
        if self.kind == "seq2seq":
            return sources
        return [CAUSAL_TEMPLATE.format(passage=s) for s in sources]

    def prompt_ids(self, passages: Sequence[Passage], max_source_len: int = 256) -> list[list[int]]:
        """Token ids of each prompt, unpadded; a long causal prompt loses passage tokens, never
        the template's tail, so the model is always asked for a question."""
        tok = self.tokenizer
        if self.kind == "seq2seq":
            return tok(self.prompts(passages), truncation=True, max_length=max_source_len)["input_ids"]
        head, tail = CAUSAL_TEMPLATE.split("{passage}")
        tail_ids = tok(tail, add_special_tokens=False)["input_ids"]
        heads = [head + self.prefix + passage_text(t, x) for t, x in passages]
        head_ids = tok(heads, truncation=True, max_length=max(1, max_source_len - len(tail_ids)))
        return [ids + tail_ids for ids in head_ids["input_ids"]]

    def training_batch(self, passages: Sequence[Passage], questions: Sequence[str],
                       max_source_len: int = 256, max_target_len: int = 32) -> dict[str, torch.Tensor]:
        """input_ids, attention_mask and labels; labels are -100 where no loss is wanted
        (padding; for causal LMs also the prompt, so the loss is on the question only)."""
        if len(passages) != len(questions):
            raise ValueError(f"{len(passages)} passages but {len(questions)} questions")
        sources = self.prompt_ids(passages, max_source_len)
        if self.kind == "seq2seq":
            targets = self.tokenizer(text_target=list(questions), truncation=True,
                                     max_length=max_target_len)["input_ids"]
            input_ids = pad_sequences(sources, self.pad_id, left=False)
            labels = pad_sequences(targets, -100, left=False)
            return {"input_ids": input_ids, "attention_mask": self._mask(sources, left=False),
                    "labels": labels}
        eos = self.tokenizer.eos_token_id
        answers = self.tokenizer([" " + q.strip() for q in questions], add_special_tokens=False)
        answers = [ids[: max_target_len - 1] + [eos] for ids in answers["input_ids"]]
        full = [s + a for s, a in zip(sources, answers)]
        # right padding: positions stay 0..n-1 for every row, as in generation after left-padding
        labels = [[-100] * len(s) + a for s, a in zip(sources, answers)]
        return {"input_ids": pad_sequences(full, self.pad_id, left=False),
                "attention_mask": self._mask(full, left=False),
                "labels": pad_sequences(labels, -100, left=False)}

    @staticmethod
    def _mask(seqs: Sequence[list[int]], left: bool) -> torch.Tensor:
        return pad_sequences([[1] * len(s) for s in seqs], 0, left=left)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The model's mean token cross-entropy over the labels that are not -100."""
        device = self.model.device
        batch = {k: v.to(device) for k, v in batch.items()}
        if self.kind == "causal" and _plain_lm_head(self.model):
            return _question_token_loss(self.model, batch)
        return self.model(**batch).loss

    # paper 002 section 3.1: nucleus sampling, top-p 0.95 with top-k 25, C (= n) queries per passage
    def generate(self, passages: Sequence[Passage], n: int = 5, top_p: float = 0.95, top_k: int = 25,
                 max_new_tokens: int = 32, batch_size: int = 16, seed: int = 0,
                 max_source_len: int = 256, device: str | torch.device = "cpu",
                 progress: Callable[[int, int], None] | None = None) -> list[list[tuple[str, float]]]:
        """Up to `n` distinct questions per passage, each with its mean token log-probability,
        in input order.

        Reproducible: torch's RNG is seeded once with `seed` before the first batch, inside a
        forked RNG state (the caller's global RNG is left as it was). The same passages, seed
        and batch size give the same questions; batches run longest prompt first (less padding)."""
        ids = self.prompt_ids(passages, max_source_len)
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        results: list[list[tuple[str, float]]] = [[] for _ in ids]
        was_training = self.model.training
        self.model.to(device).eval()
        device = torch.device(device)
        rng_devices = [device] if device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=rng_devices), torch.inference_mode():
                torch.manual_seed(seed)
                for start in range(0, len(order), batch_size):
                    chunk = order[start:start + batch_size]
                    sampled = self._sample([ids[i] for i in chunk], n, top_p, top_k,
                                           max_new_tokens, device)
                    for row, i in enumerate(chunk):
                        results[i] = self._distinct(sampled[row * n:(row + 1) * n], n)
                    if progress is not None:
                        progress(min(start + batch_size, len(order)), len(order))
        finally:
            self.model.train(was_training)
        return results

    def _sample(self, prompts: list[list[int]], n: int, top_p: float, top_k: int,
                max_new_tokens: int, device: torch.device) -> list[tuple[str, float]]:
        """n sampled continuations per prompt, row-major: (text, mean token log-prob)."""
        # decoder-only models continue from the last position, so prompts are left-padded
        left = self.kind == "causal"
        input_ids = pad_sequences(prompts, self.pad_id, left=left).to(device)
        attention_mask = self._mask(prompts, left=left).to(device)
        extra, returns = {}, n
        if self.kind == "causal" and n > 1 and self.share_prompt_cache:
            # The n samples of a prompt share its prefix: run the prompt once and copy its KV
            # cache n times, instead of `num_return_sequences` running it n times. Rows come out
            # in the same order (each prompt's n samples together), so a seed samples the same.
            extra["cache"] = self._prompt_cache(input_ids, attention_mask, n)
            input_ids = input_ids.repeat_interleave(n, 0)
            attention_mask = attention_mask.repeat_interleave(n, 0)
            returns = 1
        recorder = SampledTokenLogprobs()
        out = self.model.generate(
            input_ids=input_ids, attention_mask=attention_mask,
            do_sample=True, top_p=top_p, top_k=top_k, temperature=1.0, num_return_sequences=returns,
            max_new_tokens=max_new_tokens, use_cache=True, pad_token_id=self.pad_id,
            eos_token_id=self.tokenizer.eos_token_id, logits_processor=LogitsProcessorList([recorder]),
            return_dict_in_generate=True, **extra)
        # causal outputs repeat the prompt, seq2seq ones start with the decoder start token
        width = input_ids.shape[1] if self.kind == "causal" else 1
        new_tokens = out.sequences[:, width:]
        scores = mean_token_logprobs(recorder.token_logprobs(new_tokens), new_tokens,
                                     self.tokenizer.eos_token_id)
        texts = self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        return [(t.strip(), float(s)) for t, s in zip(texts, scores)]

    def _prompt_cache(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int) -> DynamicCache:
        """The KV cache of every prompt but its last token, each row repeated n times: `generate`
        then feeds only the last token (positions as `generate` numbers left-padded rows)."""
        positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
        cache = DynamicCache(config=self.model.config)
        last_only = {"logits_to_keep": 1} if self.model._supports_logits_to_keep() else {}
        self.model(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1],
                   position_ids=positions[:, :-1], cache=cache, use_cache=True, **last_only)
        cache.batch_repeat_interleave(n)
        return cache

    @staticmethod
    def _distinct(sampled: list[tuple[str, float]], n: int) -> list[tuple[str, float]]:
        seen: set[str] = set()
        kept = []
        for text, score in sampled:
            key = question_key(text)
            if key and key not in seen:
                seen.add(key)
                kept.append((text, score))
        return kept[:n]

    def save_pretrained(self, directory: str | Path) -> Path:
        """Model, tokenizer and generator.json (kind, prefix): a folder `load_generator` reads."""
        directory = Path(directory)
        self.model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        (directory / GENERATOR_FILE).write_text(
            json.dumps({"kind": self.kind, "prefix": self.prefix}, indent=2) + "\n")
        return directory


def questions_from_samples(tokenizer, samples: list[tuple[list[int], float]], n: int) -> list[tuple[str, float]]:
    """A prompt's sampled (token ids, mean log-prob) decoded and reduced to its distinct questions:
    what the CTranslate2 and llama.cpp runtimes return per passage."""
    texts = tokenizer.batch_decode([ids for ids, _ in samples], skip_special_tokens=True)
    return QueryGenerator._distinct([(t.strip(), lp) for t, (_, lp) in zip(texts, samples)], n)


def load_generator(name_or_path: str, kind: str = "auto", prefix: str | None = None) -> QueryGenerator:
    """Load a question generator from an alias ('smollm2'), a local folder or a hub name.

    kind: 'seq2seq', 'causal', or 'auto' (the config's `is_encoder_decoder`, or the kind saved by
    `save_pretrained`). prefix: text put before every input; doc2query T5 checkpoints such as
    `doc2query/all-with-prefix-t5-base-v1` need their task prefix, e.g. prefix='text2query: '.
    None keeps the saved prefix (if any), else none."""
    path = resolve_checkpoint(name_or_path)
    saved_file = Path(path) / GENERATOR_FILE
    saved = json.loads(saved_file.read_text()) if saved_file.is_file() else {}
    if kind == "auto":
        kind = saved.get("kind") or (
            "seq2seq" if AutoConfig.from_pretrained(path).is_encoder_decoder else "causal")
    if kind not in KINDS:
        raise ValueError(f"kind must be 'auto' or one of {KINDS}, got {kind!r}")
    if prefix is None:
        prefix = saved.get("prefix")
    auto_model = AutoModelForSeq2SeqLM if kind == "seq2seq" else AutoModelForCausalLM
    tokenizer = AutoTokenizer.from_pretrained(path)
    return QueryGenerator(auto_model.from_pretrained(path), tokenizer, kind, prefix)
