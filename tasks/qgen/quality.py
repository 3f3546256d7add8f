"""How good the synthetic queries are: BLEU-4 and ROUGE-L of the generated queries against the gold
questions of the same passage (sacrebleu, rouge-score), the share of generated queries whose own
passage BM25 ranks first, the duplicate share, and examples."""
from __future__ import annotations

from typing import Mapping, Sequence


def bleu_rouge(generated: Mapping[str, Sequence[str]], references: Mapping[str, Sequence[str]]) -> dict:
    """Mean sentence BLEU-4 (sacrebleu, exponential smoothing) and mean ROUGE-L F1 (best reference)
    of every generated query of a passage that has reference questions, in 0..100."""
    from rouge_score import rouge_scorer
    from sacrebleu.metrics import BLEU

    bleu = BLEU(effective_order=True)
    rouge = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    bleus, rouges = [], []
    for pid, queries in generated.items():
        refs = list(references.get(pid, ()))
        if not refs:
            continue
        for query in queries:
            bleus.append(bleu.sentence_score(query, refs).score)
            rouges.append(100 * max(rouge.score(ref, query)["rougeL"].fmeasure for ref in refs))
    n = len(bleus)
    return {"scored_queries": n, "bleu4": sum(bleus) / n if n else None, "rougeL": sum(rouges) / n if n else None}


def duplicate_share(generated: Mapping[str, Sequence[str]]) -> float:
    """Share of generated queries that repeat another query of the whole set (after lowercasing)."""
    seen: set[str] = set()
    total = duplicates = 0
    for queries in generated.values():
        for query in queries:
            key = " ".join(query.lower().split())
            duplicates += key in seen
            seen.add(key)
            total += 1
    return duplicates / total if total else 0.0
