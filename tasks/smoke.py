"""The smoke overlay (`pforge run CONFIG --smoke`): the same stages and the same code paths as the
config, on a few seconds' worth of work, to check a config end to end before paying for it.

`smoke_overlay(raw)` rewrites a config's raw mapping (after `extends:`, before validation). It
keeps every stage and every setting that chooses a code path (losses and their options, pooling,
towers, projections, negatives strategies, init_from, select_on_dev, pretrain forms, fusions,
reranks, runners, index kinds, splits) and shrinks only the amount of work:

- data: SQuAD to 3 articles (one per split, the split ratios made equal so that dev and test are
  never empty), Wikipedia dumps to 3 pages. BEIR corpora, question files and DPR passage TSVs have
  no size knob: they are read as configured (set $PFORGE_DATA to a folder of small copies).
- training (dense systems, pretrain runs, the cross-encoder, the generator's fine-tuning): 2
  optimizer steps of batches of 2. A schedule in epochs stays in epochs (1 of 4 examples, the
  generator's 2 of 2), so the epoch path is the one exercised. `eval_every` and
  `checkpoint_every` become 1 where they are set, so mid-run evaluations and checkpoints happen.
  Max lengths of 16-64 tokens; dev evaluation on at most 4 questions; the classifier trained on 8
  questions, half of them held out as its dev; xMoCo queues of the smallest size a step allows
  (so they wrap).
- generation: 3 passages, at most 2 queries each, 8 new tokens, shards of 2 passages. The prompt
  keeps the config's passage length: cut to a few words, the queries are about nothing the passage
  says, the round-trip filter (qgen.filter_bm25_top_k) drops them all, and a system trained on
  synthetic pairs alone has none.
- encoding, mining, labelling and reranking: tiny batches and shards, so that every sharded
  stage writes several shards.
- models: a base checkpoint that cannot load offline here (a hub name, or an alias whose package
  is not installed) is replaced by MiniLM (encoders) or SmolLM2 (generator), and said so.
- device: cpu everywhere, bf16 off (fp32). CUDA, bf16 autocast and NCCL stay for a GPU run.

A smoke run's versions are not the config's (its parameters differ), and its config name gets a
`-smoke` suffix, so its artifacts never pass for the real run's.
"""
from __future__ import annotations

import copy
import importlib.util
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger("passage_forge")

ARTICLES = 3
WIKIPEDIA_PAGES = 3
STEPS = 2
BATCH = 2
DEV_QUESTIONS = 4
# Examples of an epoch-based schedule: a batch keeps questions that share a positive passage
# apart, so 2 examples may make no batch of 2; 4 make 1 or 2.
EPOCH_EXAMPLES = 2 * BATCH
PASSAGE_LEN, QUERY_LEN, PAIR_LEN = 32, 16, 64
GENERATED_PASSAGES, QUERIES_PER_PASSAGE, NEW_TOKENS = 3, 2, 8
ENCODER, GENERATOR = "minilm", "smollm2"


def smoke_overlay(raw: dict[str, Any]) -> dict[str, Any]:
    """The smoke version of a resolved raw config (see the module docstring); `raw` is not changed."""
    cfg = copy.deepcopy(raw)
    notes: list[str] = ["device cpu and fp32 (CUDA, bf16 autocast and NCCL are checked only on a GPU)"]
    cfg["name"] = f"{cfg.get('name', 'squad-open')}-smoke"
    _data(cfg, notes)
    if cfg.get("qgen"):
        _qgen(cfg["qgen"], notes)
    for run in cfg.get("pretrain") or []:
        run["base"] = _encoder(run.get("base", ENCODER), f"pretrain {run.get('name')}", notes)
        _schedule(run, examples_key="max_passages", lengths=True)
        run["device"] = "cpu"
    if cfg.get("dense"):
        _dense(cfg["dense"], notes)
    negatives = cfg.setdefault("negatives", {})
    negatives.update(shard_size=8, questions_per_shard=4, judge_shard_size=8)
    if cfg.get("cross_encoder"):
        ce = cfg["cross_encoder"]
        ce["base"] = _encoder(ce.get("base", ENCODER), "cross_encoder", notes)
        ce["train"] = _schedule(dict(ce.get("train") or {}), examples_key=None)
        ce["train"]["max_length"] = PAIR_LEN
        # A question is held out as the classifier's dev by a hash, with probability dev_share:
        # 8 questions at 0.5 leave both sides empty 1 time in 256.
        ce.update(max_questions=_at_most(ce.get("max_questions"), 8), dev_share=max(float(ce.get("dev_share", 0.1)), 0.5),
                  report_max_questions=_at_most(ce.get("report_max_questions", 300), 3), batch_size=4, device="cpu",
                  bf16=False)
    silver = cfg.setdefault("silver", {})
    silver.update(max_queries=_at_most(silver.get("max_queries"), 3), shard_size=4)
    for entry in cfg.get("rerank") or []:
        entry.update(depth=_at_most(entry.get("depth", 100), 3), shard_questions=2)
    logger.info("smoke run of %s: %s", raw.get("name", "the config"), "; ".join(notes))
    return cfg


def _at_most(value: Any, limit: int) -> int:
    return limit if value is None else min(int(value), limit)


def _data(cfg: dict, notes: list[str]) -> None:
    if cfg.get("data") is None:  # PipelineConfig's default data section: SQuAD
        cfg["data"] = {"squad": {}}
    data = cfg["data"]
    if data.get("squad") is not None:
        split = cfg.setdefault("split", {})
        names = list(split.get("ratios") or {"train": 0.6, "dev": 0.1, "test": 0.3})
        split["ratios"] = {name: 1.0 for name in names}  # one article per split: none is empty
        squad = data["squad"]
        squad["max_articles"] = max(len(names), _at_most(squad.get("max_articles"), ARTICLES))
        notes.append(f"{squad['max_articles']} SQuAD articles, one per split")
    if data.get("wikipedia"):
        data["wikipedia_max_pages"] = _at_most(data.get("wikipedia_max_pages"), WIKIPEDIA_PAGES)
    for source in ("beir", "qa", "dpr_passages"):
        if data.get(source):
            notes.append(f"data.{source} read as configured (no size knob)")


def _schedule(section: dict, examples_key: str | None = "max_questions", per_epoch: int = EPOCH_EXAMPLES,
              lengths: bool = False) -> dict:
    """2 steps of batches of 2: max_steps stays max_steps; epochs stay epochs (about 2 steps' worth,
    of at most `per_epoch` examples where `examples_key` caps them)."""
    section["batch_size"] = BATCH
    if section.get("max_steps") is not None or "epochs" not in section:
        section["max_steps"] = STEPS
        if examples_key:
            section[examples_key] = _at_most(section.get(examples_key), STEPS * BATCH)
    else:  # as many epochs as make about STEPS steps: 1 of 1-2 batches, or 2 of one batch each
        section["epochs"] = min(int(section["epochs"]), max(1, STEPS * BATCH // per_epoch))
        if examples_key:
            section[examples_key] = per_epoch
    for every in ("eval_every", "checkpoint_every"):
        if section.get(every) is not None:
            section[every] = 1
    section["bf16"] = "off"  # fp32 on every machine: 'auto' is bf16 on CPUs with bf16 units
    if lengths:
        section["passage_max_len"], section["query_max_len"] = PASSAGE_LEN, QUERY_LEN
    return section


def _qgen(qgen: dict, notes: list[str]) -> None:
    from tasks.stage_refs import is_reference

    generator = qgen.get("generator", GENERATOR)
    # another run's generator (other.yaml:qgen_model) is that run's smoke model: kept as configured
    if not is_reference(generator, "qgen_model") and not loads_offline(generator):
        notes.append(f"generator {generator!r} does not load offline here: {GENERATOR} instead")
        qgen["generator"], qgen["kind"], qgen["prefix"] = GENERATOR, "auto", None
    finetune = qgen.setdefault("finetune", {})
    _schedule(finetune, examples_key="max_pairs", per_epoch=BATCH)  # plain shuffled batches: 1 step an epoch
    finetune.update(max_dev_pairs=2, max_source_len=PAIR_LEN, max_target_len=QUERY_LEN)
    generate = qgen.setdefault("generate", {})
    generate.update(max_passages=_at_most(generate.get("max_passages"), GENERATED_PASSAGES),
                    queries_per_passage=min(int(generate.get("queries_per_passage", 5)), QUERIES_PER_PASSAGE),
                    max_new_tokens=NEW_TOKENS, batch_size=BATCH, shard_size=2, device="cpu")


def _dense(dense: dict, notes: list[str]) -> None:
    encode = dense.setdefault("encode", {})
    encode.update(batch_size=4, shard_size=16, passage_max_len=PASSAGE_LEN, query_max_len=QUERY_LEN, device="cpu", bf16=False)
    for system in dense.get("systems") or []:
        model = system.setdefault("model", {})
        model["base"] = _encoder(model.get("base", ENCODER), f"dense system {system.get('name')}", notes)
        train = system.get("train")
        if not train:
            continue
        train = _flat_schedule(system)
        _schedule(train, lengths=True)
        train["dev_max_questions"] = _at_most(train.get("dev_max_questions"), DEV_QUESTIONS)
        if train.get("dev_distractors"):
            train["dev_distractors"] = min(int(train["dev_distractors"]), 8)
        options = train.get("loss_options") or {}
        if "queue_size" in options:  # the smallest queue a step accepts: it wraps at every step
            pushed = BATCH * (1 + int(train.get("hard_negatives", 2)))
            options["queue_size"] = max(2 * BATCH, pushed)


def _flat_schedule(system: dict) -> dict:
    """The system's train section with a `schedule:` mapping written flat, merged as the config reads
    it (one setting given both ways is refused here too, naming the system)."""
    from tasks.training.arguments import trainer_settings_of

    try:
        rest, schedule = trainer_settings_of(system["train"])
    except ValueError as err:
        raise ValueError(f"dense system {system.get('name')}: train: {err}") from None
    system["train"] = {**rest, **schedule}
    return system["train"]


def _encoder(base: str, where: str, notes: list[str]) -> str:
    if loads_offline(base):
        return base
    notes.append(f"{where}: base {base!r} does not load offline here: {ENCODER} instead")
    return ENCODER


def loads_offline(name: str) -> bool:
    """Whether a checkpoint name loads without a network: an installed alias, a local folder, or
    a hub name already in the Hugging Face cache."""
    from models.checkpoints import ALIASES

    spec = ALIASES.get(str(name).lower())
    if spec is not None:
        return all(importlib.util.find_spec(module) is not None for module in spec.modules)
    if str(name).startswith((".", "/", "~")) or Path(name).expanduser().exists():
        return True  # a path: kept as configured (a missing folder fails as it would in the real run)
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(str(name), "config.json"), str)
    except Exception:  # not a valid repo id either
        return False
