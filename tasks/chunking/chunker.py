"""DPR-style chunking: non-overlapping 100-word passages, title kept beside each chunk."""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable, Iterator

# DPR (Karpukhin et al. 2020, section 4.1; xMoCo paper section 4.1): articles are split into
# disjoint 100-word blocks. Words are whitespace-separated tokens.
DEFAULT_WORDS = 100
_WORD = re.compile(r"\S+")


def chunk_document(doc: dict, words: int = DEFAULT_WORDS, stride: int | None = None) -> Iterator[dict]:
    """Yield passages of `words` words every `stride` words (stride defaults to words: no overlap).

    words <= 0 keeps the whole document as one passage (BEIR corpora are judged per document).
    A document shorter than `words` is one passage. char_start/char_end locate the chunk in the
    document text so gold answer spans can be mapped onto passages.
    """
    text = doc["text"]
    if words > 0 and stride in (None, words):
        yield from _disjoint_chunks(doc, words)
        return
    spans = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    if not spans:
        return
    if words <= 0:
        windows = [(0, len(spans))]
    else:
        step = stride or words
        if step <= 0:
            raise ValueError(f"chunk stride must be positive, got {step}")
        windows = []
        for start in range(0, len(spans), step):
            windows.append((start, min(start + words, len(spans))))
            if start + words >= len(spans):
                break
    for index, (first, last) in enumerate(windows):
        char_start, char_end = spans[first][0], spans[last - 1][1]
        yield {
            "pid": f"{doc['doc_id']}#{index}",
            "doc_id": doc["doc_id"],
            "title": doc["title"],
            "text": " ".join(text[s:e] for s, e in spans[first:last]),
            "chunk_index": index,
            "n_words": last - first,
            "char_start": char_start,
            "char_end": char_end,
        }


@lru_cache(maxsize=8)
def _chunk_pattern(words: int) -> re.Pattern:
    # One match per chunk: up to `words` whitespace-separated words (the common, disjoint case).
    return re.compile(r"\S+(?:\s+\S+){0,%d}" % (words - 1))


def _disjoint_chunks(doc: dict, words: int) -> Iterator[dict]:
    for index, match in enumerate(_chunk_pattern(words).finditer(doc["text"])):
        tokens = match.group().split()
        yield {
            "pid": f"{doc['doc_id']}#{index}",
            "doc_id": doc["doc_id"],
            "title": doc["title"],
            "text": " ".join(tokens),
            "chunk_index": index,
            "n_words": len(tokens),
            "char_start": match.start(),
            "char_end": match.end(),
        }


def chunk_documents(docs: Iterable[dict], words: int = DEFAULT_WORDS, stride: int | None = None) -> Iterator[dict]:
    for doc in docs:
        yield from chunk_document(doc, words, stride)
