"""What a run is scored on: the questions of the splits it has questions of, and how deep a first
hit is looked for (the report's top-k curves run to CURVE_K)."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

CURVE_K = 100   # the curves run over k = 1..CURVE_K


def questions_of_run(run: pa.Table, questions: pa.Table, gold: pa.Table, split_of: dict) -> tuple[pa.Table, pa.Table]:
    """The questions and gold of the splits `run` has questions of: a system run on some splits
    only (a reranker of the test split, say) is scored on those, not counted as missing the rest."""
    splits = {split_of.get(q) for q in pc.unique(run.column("qid")).to_pylist()} - {None}
    if splits >= set(split_of.values()):
        return questions, gold
    kept = questions.filter(pc.is_in(questions.column("split"), value_set=pa.array(sorted(splits), pa.string())))
    return kept, gold.filter(pc.is_in(gold.column("qid"), value_set=kept.column("qid")))
