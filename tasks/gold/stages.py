"""Gold family: gold passages per question (link_gold) and the gold training pairs (pairs:gold).

A pairs table (qid, query, pid, source, weight, split) is what every trainer reads: gold pairs
here; synthetic and silver pairs come from their own families in the same schema."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from storage import Artifact
from storage.parquet import write_table
from tasks.engine import NoParams, Stage
from tasks.gold.linking import gold_pairs, link_qrels_gold, link_span_gold

logger = logging.getLogger("passage_forge")


def build_gold(params: NoParams, inputs: dict[str, Artifact], out: Path) -> dict:
    questions = inputs["ingest_questions"]
    passages = inputs["chunk"].read_table(columns=["pid", "doc_id", "char_start", "char_end"])
    if "qrels" in questions.tables:
        gold, stats = link_qrels_gold(questions.read_table("qrels"), passages)
    else:
        gold, stats = link_span_gold(questions.read_table("questions"), passages)
    if stats["unlinked_questions"]:
        logger.warning("gold: %d of %d questions have no linkable gold passage: %s",
                       stats["unlinked_questions"], stats["questions"], json.dumps(stats["unlinked_by_reason"]))
    write_table(out, gold)
    return {"stats": stats}


def build_gold_pairs(params: NoParams, inputs: dict[str, Artifact], out: Path) -> dict:
    pairs = gold_pairs(inputs["ingest_questions"].read_table("questions"), inputs["link_gold"].read_table())
    write_table(out, pairs)
    return {"stats": {"pairs": pairs.num_rows}}


def stages(cfg, earlier: list[Stage]) -> list[Stage]:
    out = [Stage("link_gold", "gold", "1", ("ingest_questions", "chunk"), NoParams(), build_gold)]
    systems = cfg.dense.systems if cfg.dense else []
    generator_trains = cfg.qgen is not None and cfg.qgen.finetune.enabled  # on the train split's gold pairs
    # the silver stage reads the gold pairs too: a candidate already gold is not silver
    if generator_trains or any(s.train and {"gold", "silver"} & set(s.train.pairs) for s in systems):
        out.append(Stage("pairs:gold", "pairs", "1", ("ingest_questions", "link_gold"), NoParams(), build_gold_pairs,
                         variant={"source": "gold"}))
    return out
