"""Explicit Arrow schemas of the core tables (DESIGN.md section 5)."""
from __future__ import annotations

import pyarrow as pa

DOCUMENTS = pa.schema([
    ("doc_id", pa.string()),
    ("title", pa.string()),
    ("text", pa.string()),
    ("source", pa.string()),
    ("content_hash", pa.string()),
])

# char_start/char_end locate the chunk inside its document's text, so gold spans can be mapped.
PASSAGES = pa.schema([
    ("pid", pa.string()),
    ("doc_id", pa.string()),
    ("title", pa.string()),
    ("text", pa.string()),
    ("chunk_index", pa.int32()),
    ("n_words", pa.int32()),
    ("char_start", pa.int64()),
    ("char_end", pa.int64()),
])

SPAN = pa.struct([("start", pa.int64()), ("end", pa.int64())])

# doc_id/answer_spans are set where the QA set names its gold article (SQuAD); empty otherwise.
QUESTIONS = pa.schema([
    ("qid", pa.string()),
    ("question", pa.string()),
    ("answers", pa.list_(pa.string())),
    ("split", pa.string()),
    ("source", pa.string()),
    ("doc_id", pa.string()),
    ("answer_spans", pa.list_(SPAN)),
])

# Graded relevance judgements from a qrels file (BEIR): document-level.
QRELS = pa.schema([
    ("qid", pa.string()),
    ("doc_id", pa.string()),
    ("relevance", pa.int32()),
])

GOLD = pa.schema([
    ("qid", pa.string()),
    ("pid", pa.string()),
    ("relevance", pa.int32()),
])

RUNS = pa.schema([
    ("qid", pa.string()),
    ("pid", pa.string()),
    ("rank", pa.int32()),
    ("score", pa.float32()),
    ("system", pa.string()),
])

METRICS = pa.schema([
    ("system", pa.string()),
    ("metric", pa.string()),
    ("k", pa.int32()),
    ("value", pa.float64()),
    ("split", pa.string()),
])

# One row per (system, question): rank of the first passage containing an answer (null: none).
QUESTION_RESULTS = pa.schema([
    ("system", pa.string()),
    ("qid", pa.string()),
    ("split", pa.string()),
    ("first_hit_rank", pa.int32()),
])

# One row per (pair of systems, k): the paired bootstrap interval of A's top-k accuracy minus B's.
COMPARISONS = pa.schema([
    ("system_a", pa.string()),
    ("system_b", pa.string()),
    ("split", pa.string()),
    ("metric", pa.string()),
    ("k", pa.int32()),
    ("questions", pa.int32()),
    ("a", pa.float64()),
    ("b", pa.float64()),
    ("difference", pa.float64()),
    ("low", pa.float64()),
    ("high", pa.float64()),
    ("p_not_better", pa.float64()),
    ("samples", pa.int32()),
    ("level", pa.float64()),
])

# Training pairs: a query (a question, or a synthetic one) and a positive passage. source: gold,
# synthetic, silver; weight: the loss weight (silver pairs: p^2, paper 001 section 4.2).
PAIRS = pa.schema([
    ("qid", pa.string()),
    ("query", pa.string()),
    ("pid", pa.string()),
    ("source", pa.string()),
    ("weight", pa.float32()),
    ("split", pa.string()),
])

# Hard negatives per query, each with the strategy that mined it and its rank there. `text` is set
# only for a negative that is not a corpus passage (half of a single-passage document).
NEGATIVES = pa.schema([
    ("qid", pa.string()),
    ("pid", pa.string()),
    ("strategy", pa.string()),
    ("rank", pa.int32()),
    ("score", pa.float32()),
    ("text", pa.string()),
])

# Synthetic queries (doc2query, paper 002 section 3.1): the n-th distinct sampled query of a
# passage, with its mean token log-probability under the generator.
SYNTHETIC_QUERIES = pa.schema([
    ("pid", pa.string()),
    ("n", pa.int32()),
    ("query", pa.string()),
    ("logprob", pa.float32()),
])
