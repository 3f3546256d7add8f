"""Pre-training pairs as the trainer's examples: each passage with its contexts, of which the
collator uses one per epoch (`TrainExample.queries`, drawn per (seed, epoch, passage)).

- query as context (paper 002 section 3.1): a passage's C generated queries; "during training,
  we will randomly select one of the candidate queries to use as the context for the passage".
- passage as context (section 2, the baseline): the other passages of its document ("we randomly
  extract pairs of passages from each document"); the context is the other passage's text (its
  title, the same as the passage's, is left out: it would make the pair trivial to match).
"""
from __future__ import annotations

import random
from typing import Optional

import pyarrow as pa

from tasks.training.data import TrainExample


def query_context_examples(passages: pa.Table, queries: pa.Table) -> list[TrainExample]:
    """One example per passage with at least one generated query (in corpus order); its queries
    in `n` order, blank and repeated ones dropped. `queries` has pid, n, query."""
    by_pid: dict[str, list[tuple[int, str]]] = {}
    for pid, n, query in zip(*(queries.column(c).to_pylist() for c in ("pid", "n", "query"))):
        if query is not None and query.strip():
            by_pid.setdefault(pid, []).append((int(n), query.strip()))
    examples = []
    for pid, title, text in zip(*(passages.column(c).to_pylist() for c in ("pid", "title", "text"))):
        candidates = list(dict.fromkeys(q for _, q in sorted(by_pid.get(pid, []))))
        if candidates:
            examples.append(TrainExample(qid=f"ctx:{pid}", query=candidates[0], positive=(title, text),
                                         positive_id=pid, queries=candidates))
    return examples


def passage_context_examples(passages: pa.Table) -> list[TrainExample]:
    """One example per passage whose document has another passage (in corpus order); its
    contexts are the texts of the document's other passages."""
    docs: dict[str, list[int]] = {}
    doc_ids = passages.column("doc_id").to_pylist()
    for i, doc in enumerate(doc_ids):
        docs.setdefault(doc, []).append(i)
    pids, titles, texts = (passages.column(c).to_pylist() for c in ("pid", "title", "text"))
    examples = []
    for i, pid in enumerate(pids):
        others = [texts[j] for j in docs[doc_ids[i]] if j != i]
        if others:
            examples.append(TrainExample(qid=f"ctx:{pid}", query=others[0], positive=(titles[i], texts[i]),
                                         positive_id=pid, queries=others))
    return examples


def sample_examples(examples: list[TrainExample], limit: Optional[int], seed: int) -> list[TrainExample]:
    """At most `limit` examples, a seeded sample kept in corpus order."""
    if limit is None or len(examples) <= limit:
        return examples
    keep = sorted(random.Random(seed).sample(range(len(examples)), limit))
    return [examples[i] for i in keep]
