"""Texts encoded into an embedding matrix, in batches (embeddings.py stores them as tables).

Texts are tokenised once (truncated, unpadded), sorted by token count so every batch holds
texts of similar length, padded once per batch (dynamic padding), encoded under
``torch.inference_mode()`` and written back in input order.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

_STORAGE_DTYPES = {"float32": np.float32, "float16": np.float16}

ProgressFn = Callable[[int, int], None]  # (items done, items total)


def _tokenize_unpadded(texts, tokenizer, max_length: int) -> dict[str, list[list[int]]]:
    if len(texts) and isinstance(texts[0], (tuple, list)):
        titles = [t[0] if t[0] is not None else "" for t in texts]
        bodies = [t[1] if t[1] is not None else "" for t in texts]
        if not max_length:
            enc = tokenizer(titles, bodies, truncation=False, padding=False)
        else:
            return _tokenize_pairs(titles, bodies, tokenizer, max_length)
    else:
        enc = tokenizer(list(texts), truncation=True, max_length=max_length, padding=False)
    return {key: enc[key] for key in enc.keys()}


def _tokenize_pairs(titles, bodies, tokenizer, max_length: int) -> dict[str, list[list[int]]]:
    """(title, text) pairs cut to max_length by cutting the text; a title that alone leaves no
    room for text (tokenizers raises "Sequence to truncate too short") is cut too, in that row only."""
    try:
        enc = tokenizer(titles, bodies, truncation="only_second", max_length=max_length, padding=False)
        return {key: enc[key] for key in enc.keys()}
    except Exception as exc:
        if "too short" not in str(exc):
            raise
    rows = []
    for title, body in zip(titles, bodies):
        try:
            rows.append(tokenizer(title, body, truncation="only_second", max_length=max_length, padding=False))
        except Exception as exc:
            if "too short" not in str(exc):
                raise
            rows.append(tokenizer(title, body, truncation="longest_first", max_length=max_length, padding=False))
    return {key: [row[key] for row in rows] for key in rows[0].keys()}


def _pad_batch(features: dict[str, list[list[int]]], rows: np.ndarray, pad_id: int,
               left: bool) -> dict[str, torch.Tensor]:
    lengths = [len(features["input_ids"][i]) for i in rows]
    width = max(lengths)
    out: dict[str, torch.Tensor] = {}
    for key, seqs in features.items():
        fill = pad_id if key == "input_ids" else 0
        arr = np.full((len(rows), width), fill, dtype=np.int64)
        for j, i in enumerate(rows):
            seq = seqs[i]
            if left:
                arr[j, width - len(seq):] = seq
            else:
                arr[j, : len(seq)] = seq
        out[key] = torch.from_numpy(arr)
    if "attention_mask" not in out:
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for j, n in enumerate(lengths):
            if left:
                mask[j, width - n:] = 1
            else:
                mask[j, :n] = 1
        out["attention_mask"] = torch.from_numpy(mask)
    return out


def encode_texts(
    texts: Sequence[str] | Sequence[tuple[str, str]],
    tokenizer,
    encode_fn: Callable[[dict[str, torch.Tensor]], torch.Tensor],
    batch_size: int = 64,
    max_length: int = 256,
    device: str | torch.device = "cpu",
    dtype: str = "float32",
    autocast_bf16: bool = False,
    progress: ProgressFn | None = None,
) -> np.ndarray:
    """Encode ``texts`` (strings, or (title, text) pairs) into an ``[n, dim]`` array in input order.

    ``encode_fn`` takes a padded batch dict of tensors (``input_ids``, ``attention_mask``, ...,
    already on ``device``) and returns ``[batch, dim]`` embeddings. ``dtype`` is the storage dtype
    of the result (``float32`` or ``float16``); computation is float32 unless ``autocast_bf16``,
    which runs ``encode_fn`` under ``torch.autocast(device_type, dtype=torch.bfloat16)`` (CUDA or
    CPU). ``progress(done, total)`` is called after every batch.
    The whole input is tokenised at once: callers shard large collections (``iter_shards``).
    """
    if dtype not in _STORAGE_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_STORAGE_DTYPES)}, got {dtype!r}")
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    n = len(texts)
    np_dtype = _STORAGE_DTYPES[dtype]
    if n == 0:
        return np.zeros((0, 0), dtype=np_dtype)
    device = torch.device(device)
    features = _tokenize_unpadded(texts, tokenizer, max_length)
    lengths = np.fromiter((len(ids) for ids in features["input_ids"]), dtype=np.int64, count=n)
    # Longest first: the first batch shows the peak memory at once; stable sort keeps ties in order.
    order = np.argsort(-lengths, kind="stable")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    left = getattr(tokenizer, "padding_side", "right") == "left"
    autocast = (torch.autocast(device_type=device.type, dtype=torch.bfloat16)
                if autocast_bf16 else contextlib.nullcontext())
    out: np.ndarray | None = None
    done = 0
    with torch.inference_mode(), autocast:
        for start in range(0, n, batch_size):
            rows = order[start:start + batch_size]
            batch = {k: v.to(device) for k, v in _pad_batch(features, rows, pad_id, left).items()}
            emb = encode_fn(batch)
            if emb.ndim != 2 or emb.shape[0] != len(rows):
                raise ValueError(f"encode_fn returned shape {tuple(emb.shape)} for a batch of {len(rows)}")
            emb_np = emb.detach().float().cpu().numpy()
            if out is None:
                out = np.empty((n, emb_np.shape[1]), dtype=np_dtype)
            out[rows] = emb_np.astype(np_dtype, copy=False)
            done += len(rows)
            if progress is not None:
                progress(done, n)
    assert out is not None
    return out


def iter_shards(n: int, shard_size: int) -> Iterator[tuple[int, int]]:
    """Yield ``(start, stop)`` half-open ranges covering ``range(n)`` in shards of ``shard_size``."""
    if shard_size < 1:
        raise ValueError("shard_size must be >= 1")
    for start in range(0, n, shard_size):
        yield start, min(start + shard_size, n)
