"""Every shipped config, end to end under the smoke overlay (tasks/smoke.py): each stage of each
config runs once on a few seconds' work, in one process, one Prefect harness, one JVM and one
artifact root (configs share artifacts there as they do in a user's root, and
nfcorpus-transfer.yaml finds squad-open.yaml's model in it).

The inputs are small copies, in the format of the real files, under one data root (PFORGE_DATA):
SQuAD, the Wikipedia sample, BEIR NFCorpus and the NQ-open question files are cut from
../shared/data; DPR's psgs_w100.tsv, which is not there, is written here in DPR's TSV format
(header, quoted text with doubled quotes, title last) with passages that hold some answers."""
from __future__ import annotations

import bz2
import csv
import io
import json
import logging
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from tasks.config import PROJECT_ROOT, load_config
from tasks.smoke import STEPS, smoke_overlay

CONFIGS = sorted((PROJECT_ROOT / "configs").glob("*.yaml"))
SQUAD = "squad/dev-v1.1-partial.json"
WIKIPEDIA = "wikipedia/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
NQ_OPEN = ("nq_open/NQ-open.dev.jsonl", "nq_open/NQ-open.efficientqa.dev.1.1.jsonl", "nq_open/NQ-open.efficientqa.test.1.1.jsonl")
SECONDS: dict[str, float] = {}


# ------------------------------------------------------------------ small copies of the inputs
def _squad(source: Path, target: Path, articles: int = 3, paragraphs: int = 4, questions: int = 5) -> None:
    """The first articles, each cut to its first paragraphs with questions, and those to their
    first questions."""
    data = json.loads(source.read_text(encoding="utf-8"))
    kept = []
    for article in data["data"][:articles]:
        with_questions = [{**p, "qas": p["qas"][:questions]} for p in article["paragraphs"] if p["qas"]][:paragraphs]
        kept.append({**article, "paragraphs": with_questions})
    target.write_text(json.dumps({**data, "data": kept}), encoding="utf-8")


def _wikipedia(source: Path, target: Path, pages: int = 3, chars: int = 4000) -> None:
    """The dump's header, its first redirect (which ingestion skips) and its first articles of
    under `chars` characters of wikitext, each page as it is in the dump."""
    with bz2.open(source, "rt", encoding="utf-8") as f:
        text = f.read(30_000_000)
    head, rest = text.split("<page>", 1)
    blocks = [b + "</page>\n" for b in ("<page>" + rest).split("</page>")[:-1]]
    redirects = [b for b in blocks if "<redirect" in b][:1]
    short = [b for b in blocks if "<redirect" not in b and len(b[b.index("<text"):b.index("</text>")]) < chars]
    target.write_bytes(bz2.compress("".join([head, *redirects, *short[:pages], "</mediawiki>\n"]).encode("utf-8")))


def _beir(source: Path, target: Path, queries_per_split: int = 3, other_docs: int = 20) -> None:
    """The first judged queries of dev and test, the documents judged for them plus some others."""
    with zipfile.ZipFile(source) as z:
        qrels = {s: z.read(f"nfcorpus/qrels/{s}.tsv").decode().splitlines() for s in ("train", "dev", "test")}
        corpus = z.read("nfcorpus/corpus.jsonl").decode().splitlines()
        queries = z.read("nfcorpus/queries.jsonl").decode().splitlines()
    kept_queries: set[str] = set()
    for split in ("dev", "test"):
        ids = list(dict.fromkeys(line.split("\t")[0] for line in qrels[split][1:]))
        kept_queries.update(ids[:queries_per_split])
    judged = {line.split("\t")[1] for s in ("dev", "test") for line in qrels[s][1:] if line.split("\t")[0] in kept_queries}
    docs = [line for line in corpus if json.loads(line)["_id"] in judged][:40] + corpus[:other_docs]
    doc_ids = {json.loads(line)["_id"] for line in docs}
    with zipfile.ZipFile(target, "w") as z:
        z.writestr("nfcorpus/corpus.jsonl", "\n".join(dict.fromkeys(docs)) + "\n")
        z.writestr("nfcorpus/queries.jsonl",
                   "\n".join(q for q in queries if json.loads(q)["_id"] in kept_queries) + "\n")
        for split, lines in qrels.items():
            rows = [r for r in lines[1:] if r.split("\t")[0] in kept_queries and r.split("\t")[1] in doc_ids]
            z.writestr(f"nfcorpus/qrels/{split}.tsv", "\r\n".join([lines[0], *rows]) + "\r\n")


def _dpr_passages(questions: list[dict], squad: Path, target: Path) -> None:
    """DPR's psgs_w100.tsv format: id<TAB>"text"<TAB>title, text always quoted with "" for a
    quote (titles quoted only when they need it); one passage holding each question's first
    answer, then SQuAD paragraphs as the rest of the corpus."""
    rows = [(f'{q["answer"][0]} is the answer to "{q["question"]}", said the "reference" desk.', f'Answers, "{i}"')
            for i, q in enumerate(questions)]
    for article in json.loads(squad.read_text(encoding="utf-8"))["data"]:
        rows += [(" ".join(p["context"].split()[:100]), article["title"]) for p in article["paragraphs"]]
    out = io.StringIO()
    out.write("id\ttext\ttitle\n")
    titles = csv.writer(out, delimiter="\t", lineterminator="\n")
    for pid, (text, title) in enumerate(rows, start=1):
        out.write(f'{pid}\t"{text.replace(chr(34), 2 * chr(34))}"\t')
        titles.writerow([title])
    target.write_text(out.getvalue(), encoding="utf-8")


@pytest.fixture(scope="module")
def smoke_data(tmp_path_factory, shared_data) -> Path:
    root = tmp_path_factory.mktemp("smoke_data")
    for folder in ("squad", "wikipedia", "beir", "nq_open", "dpr"):
        (root / folder).mkdir()
    _squad(shared_data / SQUAD, root / SQUAD)
    _wikipedia(shared_data / WIKIPEDIA, root / WIKIPEDIA)
    _beir(shared_data / "beir" / "nfcorpus.zip", root / "beir" / "nfcorpus.zip")
    questions = []
    for name in NQ_OPEN:
        lines = (shared_data / name).read_text(encoding="utf-8").splitlines()[:5]
        (root / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
        questions += [json.loads(line) for line in lines]
    _dpr_passages(questions, root / SQUAD, root / "dpr" / "psgs_w100.tsv")
    return root


@pytest.fixture(scope="module")
def smoke_env(smoke_data, tmp_path_factory):
    """The small inputs as every config's data root (configs that a config refers to included),
    and one torch thread: batches of 2 gain nothing from a second one, and on a busy 2-core
    machine two spinning OpenMP threads make a step ~8x slower (a runtime setting: no version
    changes with it). Yields the shared artifact root."""
    import torch

    patch = pytest.MonkeyPatch()
    patch.setenv("PFORGE_DATA", str(smoke_data))
    patch.setenv("PFORGE_DOWNLOADS", str(tmp_path_factory.mktemp("no_downloads")))  # nothing is fetched
    patch.setenv("PFORGE_THREADS", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tmp_path_factory.mktemp("smoke_root")
    torch.set_num_threads(threads)
    patch.undo()


# ------------------------------------------------------------------ the overlay itself
@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_the_smoke_overlay_keeps_every_stage_of_the_config(config, smoke_env):
    from flows.registry import plan_for

    real, smoke = plan_for(load_config(config)), plan_for(load_config(config, smoke=True))
    assert smoke.names() == real.names()
    assert all(smoke[n].inputs == real[n].inputs for n in real.names())
    changed = [n for n in real.names() if smoke.planned_version(n) != real.planned_version(n)]
    assert "evaluate" in changed  # different parameters, different versions: never mistaken for the real run


def test_the_overlay_shrinks_the_work_keeps_the_code_paths_and_forces_cpu_fp32(caplog):
    raw = yaml.safe_load((PROJECT_ROOT / "configs" / "xmoco-full.yaml").read_text())
    raw["dense"]["systems"][1]["train"]["bf16"] = "on"
    raw["dense"]["systems"][0]["model"]["base"] = "bert-base-uncased"   # a hub name, not cached here
    before = json.dumps(raw, sort_keys=True)
    with caplog.at_level(logging.INFO, logger="passage_forge"):
        smoke = smoke_overlay(raw)
    assert json.dumps(raw, sort_keys=True) == before  # the caller's mapping is left alone
    dpr, xmoco, queues_only = smoke["dense"]["systems"]
    assert dpr["model"]["base"] == "minilm" and "'bert-base-uncased' does not load offline" in caplog.text
    assert "device cpu and fp32" in caplog.text
    for system in (dpr, xmoco, queues_only):
        t = system["train"]
        # 40 epochs stay a schedule in epochs (the epoch path): one of 1 or 2 batches
        assert (t["epochs"], t["batch_size"], t["max_questions"], t.get("max_steps")) == (1, 2, 4, None)
        assert t["eval_every"] == 1 and t["passage_max_len"] <= 32 and t["dev_max_questions"] <= 4
        assert t["loss"] == raw["dense"]["systems"][[dpr, xmoco, queues_only].index(system)]["train"]["loss"]
    assert xmoco["train"]["bf16"] == "off"
    # the smallest queue a step accepts (2 x batch, and the positives and hard negatives): it wraps
    assert xmoco["train"]["loss_options"] == {**raw["dense"]["systems"][1]["train"]["loss_options"], "queue_size": 4}
    assert smoke["dense"]["encode"]["device"] == "cpu" and smoke["dense"]["encode"]["bf16"] is False
    assert smoke["name"] == "xmoco-full-smoke"


def test_squad_keeps_one_article_per_split_and_max_steps_stay_max_steps():
    from tasks.config import _resolved_raw

    smoke = smoke_overlay(_resolved_raw(PROJECT_ROOT / "configs" / "query-as-context.yaml"))
    assert smoke["data"]["squad"]["max_articles"] == 3 and smoke["split"]["ratios"] == {"train": 1.0, "dev": 1.0, "test": 1.0}
    assert smoke["data"]["wikipedia_max_pages"] == 3
    assert all(p["max_steps"] == STEPS and p["device"] == "cpu" for p in smoke["pretrain"])
    assert smoke["pretrain"][0]["max_passages"] == 4 and smoke["pretrain"][0]["form"] == "passage-passage"
    gen = smoke["qgen"]["generate"]
    assert (gen["max_passages"], gen["queries_per_passage"], gen["shard_size"], gen["device"]) == (3, 2, 2, "cpu")
    assert smoke["qgen"]["generator"] == "smollm2" and smoke["qgen"]["finetune"]["max_pairs"] == 2


def test_pforge_run_smoke_and_its_refusal_with_nproc(prefect_harness, shared_data, tmp_path):
    import contextlib

    from flows.cli import main
    from storage import ArtifactStore

    # --debug: main() leaves Prefect's terminal handlers alone (they would keep this test's
    # captured stream and write to it, closed, in the tests after it)
    tiny = str(PROJECT_ROOT / "configs" / "tiny.yaml")
    with contextlib.redirect_stderr(io.StringIO()) as err:
        refused = main(["--root", str(tmp_path / "a"), "run", tiny, "--smoke", "--nproc", "2", "--stage", "train:x", "--debug"])
    assert refused == 2 and "pforge: error: --smoke runs in one process" in err.getvalue()
    assert not (tmp_path / "a" / "documents").exists()
    assert main(["--root", str(tmp_path / "b"), "run", tiny, "--smoke", "--debug"]) == 0
    store = ArtifactStore(tmp_path / "b")
    [row] = store.list_artifacts("evaluation")
    report = (store.get("evaluation", row["version"]).path / "report.md").read_text(encoding="utf-8")
    assert report.startswith("# Evaluation: tiny-smoke")  # titled by the smoke config's name
    assert store.sql("SELECT count(DISTINCT doc_id) AS n FROM documents").column("n")[0].as_py() == 3


# ------------------------------------------------------------------ every shipped config, end to end
_RUNS: dict[Path, dict[str, str]] = {}


def _run_smoke(config: Path, root: Path) -> dict[str, str]:
    """The config's smoke run into `root`, after the configs it refers to (init_from: X.yaml:NAME,
    qgen.generator: X.yaml:qgen_model, cross_encoder.model: X.yaml:cross_encoder)."""
    from flows.pipeline import pipeline
    from flows.registry import config_references

    config = config.resolve()
    if config not in _RUNS:
        cfg = load_config(config, smoke=True)
        for reference in config_references(cfg):
            _run_smoke(reference.config, root)
        started = time.perf_counter()
        _RUNS[config] = pipeline(config=cfg, root=str(root))
        SECONDS[config.stem] = time.perf_counter() - started
    return _RUNS[config]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_config_runs_end_to_end_under_the_smoke_overlay(config, prefect_harness, smoke_env, flush_denormals):
    from flows.registry import plan_for
    from storage import ArtifactStore

    versions = _run_smoke(config, smoke_env)
    plan = plan_for(load_config(config, smoke=True))
    assert list(versions) == plan.names()
    store = ArtifactStore(smoke_env)
    artifacts = {name: store.get(plan[name].artifact, version) for name, version in versions.items()}
    assert all(a is not None for a in artifacts.values()), [n for n, a in artifacts.items() if a is None]
    for name, artifact in artifacts.items():
        if name.startswith(("train:", "pretrain:")):  # the overlay's steps (about STEPS), not the config's
            assert 1 <= artifact.manifest["stats"]["steps"] <= 2 * STEPS, (name, artifact.manifest["stats"])
    evaluated = artifacts["evaluate"].manifest["stats"]["systems"]
    assert len(evaluated) == len(plan["evaluate"].params.runs)  # every runs stage is scored, under its own name
    report = (artifacts["evaluate"].path / "report.md").read_text(encoding="utf-8")
    assert all(system in report for system in evaluated)


def _beir_zip_from_squad(squad: Path, target: Path, folder: str) -> int:
    """Another BEIR-format zip (its own folder name): SQuAD paragraphs as documents with their
    article's title, each paragraph's first question judged against it, half dev and half test;
    no train queries. Returns the number of documents."""
    paragraphs = [(a["title"], p) for a in json.loads(squad.read_text(encoding="utf-8"))["data"] for p in a["paragraphs"]]
    corpus = [json.dumps({"_id": f"p{i}", "title": title, "text": p["context"]}) for i, (title, p) in enumerate(paragraphs)]
    queries = [json.dumps({"_id": f"q{i}", "text": p["qas"][0]["question"]}) for i, (_, p) in enumerate(paragraphs)]
    half = len(paragraphs) // 2
    with zipfile.ZipFile(target, "w") as z:
        z.writestr(f"{folder}/corpus.jsonl", "\n".join(corpus) + "\n")
        z.writestr(f"{folder}/queries.jsonl", "\n".join(queries) + "\n")
        for split, ids in (("dev", range(half)), ("test", range(half, len(paragraphs)))):
            z.writestr(f"{folder}/qrels/{split}.tsv", "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\tp{i}\t1\n" for i in ids))
    return len(paragraphs)


CHANGED_DATA = {
    # another BEIR zip, without train queries
    "beir-zip": {"beir": {"path": "beir/squad-as-beir.zip", "download": None, "qrels_splits": ["dev", "test"]}},
    # a Wikipedia dump, with NQ-open questions (answer strings) to evaluate on
    "wikipedia-dump": {"beir": None, "wikipedia": [WIKIPEDIA],
                       "qa": {"files": [{"path": NQ_OPEN[0], "format": "nq_open", "split": "dev"},
                                        {"path": NQ_OPEN[2], "format": "nq_open", "split": "test"}]}},
}


@pytest.mark.parametrize("corpus", list(CHANGED_DATA))
def test_the_adaptation_recipe_takes_another_corpus_by_changing_only_its_data_section(
        corpus, prefect_harness, smoke_env, smoke_data, tmp_path, flush_denormals):
    """Issue 25: a user's config outside configs/ that extends nfcorpus-adapt.yaml and changes only
    `data:` (plus `chunk:` for a dump, whose articles are cut into 100-word passages) plans the
    same stages, finds the generator and the teacher through nfcorpus-adapt.yaml's references,
    writes queries for the new corpus and evaluates the adapted student on its questions."""
    from flows.pipeline import pipeline
    from flows.registry import plan_for
    from storage import ArtifactStore

    recipe = PROJECT_ROOT / "configs" / "nfcorpus-adapt.yaml"
    for reference in ("squad-open.yaml", "study-teacher.yaml"):  # the two models, as a user builds them first
        _run_smoke(PROJECT_ROOT / "configs" / reference, smoke_env)
    beir_documents = _beir_zip_from_squad(smoke_data / SQUAD, smoke_data / "beir" / "squad-as-beir.zip", "squad-as-beir")
    mine = {"extends": str(recipe), "name": f"my-{corpus}", "data": CHANGED_DATA[corpus]}
    if corpus == "wikipedia-dump":
        mine["chunk"] = {"words": 100}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(mine), encoding="utf-8")
    cfg = load_config(tmp_path / "mine.yaml", smoke=True)
    plan, reference = plan_for(cfg), plan_for(load_config(recipe, smoke=True))
    assert plan.names() == reference.names()
    for stage, pinned in (("synthetic_queries", "generator"), ("cross_encoder", "source")):
        assert plan[stage].pinned[pinned] == reference[stage].pinned[pinned]
    versions = pipeline(config=cfg, root=str(smoke_env))
    store = ArtifactStore(smoke_env)
    documents = set(store.get("documents", versions["ingest_documents"]).read_table().column("doc_id").to_pylist())
    queries = store.get("synthetic_queries", versions["synthetic_queries"]).read_table().to_pylist()
    assert queries and all(q["pid"].split("#")[0] in documents for q in queries)
    evaluated = store.get("evaluation", versions["evaluate"])
    assert {"adapt-mmse", "hybrid-adapt-mmse", "bm25"} <= set(evaluated.manifest["stats"]["systems"])
    metric = "ndcg_cut" if corpus == "beir-zip" else "top_k_accuracy"
    rows = store.sql(f"SELECT * FROM read_parquet('{evaluated.path}/data/metrics/*.parquet') "
                     f"WHERE system = 'adapt-mmse' AND split = 'test' AND metric = '{metric}' AND k = 10").to_pylist()
    assert len(rows) == 1 and 0.0 <= rows[0]["value"] <= 1.0
    if corpus == "beir-zip":
        assert documents == {f"p{i}" for i in range(beir_documents)}
    else:  # the dump's first pages (the smoke overlay's wikipedia_max_pages), cut into passages
        assert len(documents) == 3 and len(store.get("passages", versions["chunk"]).read_table()) > 3


def test_a_title_longer_than_the_passage_length_is_cut_in_its_row_only():
    """Found by the NFCorpus smoke run: a title that fills max_length made the tokenizer raise
    "Sequence to truncate too short" and the whole encode stage fail (a GPU run of a corpus with
    one long title would have died there too)."""
    from transformers import AutoTokenizer

    from models.checkpoints import resolve_checkpoint
    from tasks.compute.batch_encode import _tokenize_unpadded

    tokenizer = AutoTokenizer.from_pretrained(resolve_checkpoint("minilm"))
    pairs = [("Short title", "some passage text " * 20), ("a very long title " * 20, "its passage text " * 20)]
    ids = _tokenize_unpadded(pairs, tokenizer, 32)["input_ids"]
    assert [len(row) for row in ids] == [32, 32]
    alone = _tokenize_unpadded(pairs[:1], tokenizer, 32)["input_ids"]
    assert ids[0] == alone[0]  # a row that fits is cut as before: only its text
    sep = tokenizer.sep_token_id
    assert ids[1].count(sep) == 2 and ids[1].index(sep) < 31  # the title was cut, some text remains


def test_a_train_section_that_writes_its_schedule_as_a_mapping_is_shrunk_too():
    from tasks.config import PipelineConfig

    raw = {"dense": {"systems": [{"name": "s", "train": {"loss": "dpr", "schedule": {"epochs": 3, "batch_size": 64,
                                                                                      "seed": 7}}}]}}
    smoke = smoke_overlay(raw)
    train = smoke["dense"]["systems"][0]["train"]
    assert "schedule" not in train and (train["batch_size"], train["seed"]) == (2, 7)
    schedule = PipelineConfig.model_validate(smoke).dense.systems[0].train.schedule
    assert (schedule.batch_size, schedule.bf16, schedule.passage_max_len) == (2, "off", train["passage_max_len"])


def test_a_setting_given_flat_and_in_the_schedule_is_refused_by_the_overlay_as_by_the_config():
    from pydantic import ValidationError

    from tasks.config import PipelineConfig

    raw = {"dense": {"systems": [{"name": "s", "train": {"seed": 3, "schedule": {"seed": 7}}}]}}
    with pytest.raises(ValidationError, match="seed: given both"):
        PipelineConfig.model_validate(raw)
    with pytest.raises(ValueError, match="dense system s: train: seed: given both"):
        smoke_overlay(raw)
