"""DPR's answer matching (DESIGN.md section 6), written from its description.

An answer is contained in a passage when, after Unicode NFD normalisation, the DPR word /
punctuation tokenizer and lowercasing, the answer's token sequence occurs contiguously in the
passage's token sequence (``match_type='string'``). CuratedTREC answers are regular expressions
searched in the NFD-normalised passage (``match_type='regex'``).

Behaviour worth knowing (pinned by tests/test_evaluation.py):

* NFD keeps accents as combining marks (``\\p{M}``) and the word pattern includes them, so
  ``'Beyoncé'`` tokenizes to ``'beyonce\\u0301'``: it matches ``'Beyoncé'`` in either NFC or NFD
  form, but *not* ``'Beyonce'`` (DPR does the same).
* Punctuation characters are tokens of their own: ``'U.S.'`` is ``u . s .`` and ``'1,000'`` is
  ``1 , 000``; matching is on whole tokens, so ``'art'`` does not match ``'party'``.
* An answer with no tokens (empty or blank) never matches (DPR's loop would match it anywhere).
* In regex mode an invalid pattern is skipped (counts as no match) and never raises.
"""
from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Sequence
from functools import lru_cache

import regex

__all__ = ["SimpleTokenizer", "normalize", "has_answer", "answer_tokens", "contains_tokens",
           "regex_match", "MATCH_TYPES"]

MATCH_TYPES = ("string", "regex")

_FLAGS = regex.IGNORECASE | regex.UNICODE | regex.MULTILINE


def normalize(text: str) -> str:
    """Unicode NFD normalisation (what DPR applies before matching)."""
    return unicodedata.normalize("NFD", text)


class SimpleTokenizer:
    """Runs of letters/digits/marks are words; every other non-space, non-control char is a token."""

    ALPHA_NUM = r"[\p{L}\p{N}\p{M}]+"
    NON_WS = r"[^\p{Z}\p{C}]"

    def __init__(self) -> None:
        self._pattern = regex.compile(f"({self.ALPHA_NUM})|({self.NON_WS})", flags=_FLAGS)

    def tokenize(self, text: str, uncased: bool = False) -> list[str]:
        """Token texts in order; lowercased when ``uncased``."""
        tokens = [m.group() for m in self._pattern.finditer(text)]
        if uncased:
            tokens = [t.lower() for t in tokens]
        return tokens


_TOKENIZER = SimpleTokenizer()


@lru_cache(maxsize=65536)
def _cached_tokens(text: str) -> tuple[str, ...]:
    return tuple(_TOKENIZER.tokenize(normalize(text), uncased=True))


def answer_tokens(text: str) -> tuple[str, ...]:
    """NFD-normalised, lowercased DPR tokens of ``text`` (cached; used for answers and passages)."""
    return _cached_tokens(text)


def contains_tokens(haystack: Sequence[str], needle: Sequence[str]) -> bool:
    """True when the non-empty ``needle`` occurs contiguously in ``haystack``."""
    n = len(needle)
    if n == 0 or n > len(haystack):
        return False
    first = needle[0]
    needle = tuple(needle)
    for i in range(len(haystack) - n + 1):
        if haystack[i] == first and tuple(haystack[i:i + n]) == needle:
            return True
    return False


@lru_cache(maxsize=4096)
def _compile(pattern: str):
    try:
        return regex.compile(pattern, flags=_FLAGS)
    except Exception:  # invalid pattern (regex.error), or anything else the engine rejects
        return None


def regex_match(pattern: str, text: str) -> bool:
    """CuratedTREC-style match of one answer pattern against already-normalised ``text``."""
    if not pattern or not pattern.strip():
        return False
    compiled = _compile(pattern)
    if compiled is None:
        return False
    try:
        return compiled.search(text) is not None
    except Exception:
        return False


def has_answer(answers: Iterable[str], text: str, match_type: str = "string") -> bool:
    """True when any of ``answers`` is contained in the passage ``text`` (DPR's rule)."""
    if isinstance(answers, str):
        answers = [answers]
    if text is None:
        return False
    if match_type == "string":
        passage = answer_tokens(text)
        return any(contains_tokens(passage, answer_tokens(a)) for a in answers if a)
    if match_type == "regex":
        normalized = normalize(text)
        return any(regex_match(normalize(a), normalized) for a in answers if a)
    raise ValueError(f"match_type must be one of {MATCH_TYPES}, got {match_type!r}")
