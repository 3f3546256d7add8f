"""Paper 000 figure 2 at CPU size: xMoCo's top-20 accuracy against its queue size, and xMoCo
against DPR at equal steps with and without hard negatives, on the embedded default.

    HF_HUB_OFFLINE=1 nice -n 10 python benchmarks/quality/xmoco_queue_study.py [--steps 30] [--batch-size 16] \
        [--queue-sizes 32,256,1024,4096,16384] [--root DIR] [--out benchmarks/results/xmoco_queue_study_cpu.md]

It drives the pipeline: writes a config that extends configs/squad-open.yaml with one dense system
per row (MiniLM, two towers, [CLS], dot product: configs/xmoco.yaml's model), runs
`pforge run CONFIG` (reusing the root's ingest, BM25 and negative artifacts; a rerun is all cache
hits) and reads the evaluation's test-split metrics. Every system trains --steps steps of
--batch-size train-split questions, seed 42, and keeps its last step (no checkpoint selection, so
nothing is chosen on any split; the test split is only reported).

Rows: xmoco with one BM25 negative per question (section 4.4) for each queue size; dpr with the
same negative; and both without hard negatives (in-batch only; xmoco with the largest queue).
The smallest queue, 2 x batch, holds exactly one step's positives and hard negatives: in-batch
negatives (section 5.3). A queue that one run cannot fill (steps x batch x (1 + negatives) vectors
or more) never evicts, so every such size trains the same model: the study trains the largest of
them once and reports it for each (said in the table).

Direct mode, for a GPU machine (no Prefect, BM25 or FAISS there): the same study from the
pipeline's tables exported to Parquet, by plain functions (the trainer, the encode function,
exact inner-product search: FAISS IndexFlatIP's ranking, and the evaluation's answer matching):

    python benchmarks/quality/dense_quality.py --export-data DIR          # here, after `make demo`
    python benchmarks/quality/xmoco_queue_study.py --direct DIR --model PATH --device cuda \
        --batch-size 128 --epochs 5 --lr 3e-5 --warmup-ratio 0.05 --queue-sizes 256,1024,4096,16384 \
        --out benchmarks/results/xmoco_queue_study_h100.md

It trains the same rows as the pipeline mode (training examples from
tasks.training.examples.training_examples: the train split's gold pairs, the top answer-free BM25
negative each), keeps the last step, and reports the test split.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _quality_bootstrap import ROOT  # noqa: E402  (puts the project on sys.path)
import reporting  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODEL = {"base": "minilm", "shared": False, "pooling": "cls", "normalize": False, "scale": 1.0}


def systems(steps: int, batch: int, queue_sizes: list[int], lr: float) -> tuple[list[dict], dict[int, str]]:
    """The dense systems of the study and, for each queue size, the system that stands for it."""
    common = {"batch_size": batch, "max_steps": steps, "lr": lr, "select_on_dev": False}
    hard = {"hard_negatives": 1, "negative_pool": 1}        # configs/dpr.yaml's BM25 negative
    in_batch = {"negatives": [], "hard_negatives": 0}
    never_evicts = steps * batch * 2                          # passage vectors pushed by a whole run
    trained = sorted({q if q < never_evicts else max(queue_sizes) for q in queue_sizes})
    out = [{"name": f"xmoco-q{q}", "model": MODEL,
            "train": {"loss": "xmoco", "loss_options": {"queue_size": q}, **hard, **common}} for q in trained]
    out += [
        {"name": "dpr", "model": MODEL, "train": {"loss": "dpr", **hard, **common}},
        {"name": f"xmoco-q{max(queue_sizes)}-in-batch", "model": MODEL,
         "train": {"loss": "xmoco", "loss_options": {"queue_size": max(queue_sizes)}, **in_batch, **common}},
        {"name": "dpr-in-batch", "model": MODEL, "train": {"loss": "dpr", **in_batch, **common}},
    ]
    stands_for = {q: f"xmoco-q{q if q < never_evicts else max(queue_sizes)}" for q in queue_sizes}
    return out, stands_for


def config_text(name: str, dense_systems: list[dict]) -> str:
    import yaml

    raw = {"extends": str(ROOT / "configs" / "squad-open.yaml"), "name": name, "qgen": None,
           "dense": {"systems": dense_systems, "hybrid": None}}
    class Plain(yaml.SafeDumper):  # every system written out in full, no &anchors
        def ignore_aliases(self, data):
            return True

    return yaml.dump(raw, Dumper=Plain, sort_keys=False, width=120)


def run_pipeline(config: Path, root: str | None) -> tuple[Path, dict[str, str], float]:
    """`pforge run CONFIG`; returns (the evaluation report's path, stage -> version, seconds)."""
    pforge = Path(sys.executable).with_name("pforge")
    cmd = [str(pforge)] + (["--root", root] if root else []) + ["run", str(config)]
    print("$ " + " ".join(cmd), flush=True)
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode:
        sys.stdout.write(proc.stdout)
        raise SystemExit(f"pforge run failed ({proc.returncode})")
    versions = dict(re.findall(r"^(\S+)\s+([0-9a-f]{16})$", proc.stdout, flags=re.M))
    report = re.search(r"^report: (.+)$", proc.stdout, flags=re.M)
    if not report:
        raise SystemExit("pforge run printed no report path:\n" + proc.stdout[-2000:])
    return Path(report.group(1)), versions, seconds


def test_metrics(report: Path) -> dict[tuple[str, int], float]:
    """(system, k) -> top-k accuracy on the test split, from the evaluation artifact."""
    import pyarrow.parquet as pq

    table = pq.read_table(report.parent / "data" / "metrics").to_pylist()
    return {(r["system"], r["k"]): r["value"] for r in table
            if r["split"] == "test" and r["metric"] == "top_k_accuracy"}


def training_seconds(report: Path, versions: dict[str, str]) -> dict[str, float]:
    """System -> its training stage's build time (the dense_model manifest), where recorded."""
    out = {}
    for stage, version in versions.items():
        manifest = report.parents[2] / "dense_model" / version / "manifest.json"
        if stage.startswith("train:") and manifest.is_file():
            out[stage.split(":", 1)[1]] = json.loads(manifest.read_text())["timings"].get("build_s")
    return out


def run_direct(args, dense_systems: list[dict], stands_for: dict[int, str]) -> None:
    """The study from exported tables (benchmarks/quality/dense_quality.py --export-data), by plain functions;
    writes the report after every system, so a run stopped early still leaves its rows."""
    from types import SimpleNamespace

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import torch
    from dense_quality import TABLES, exact_search

    from models import BiEncoder
    from models.checkpoints import resolve_checkpoint
    from models.losses import build_loss
    from tasks.compute.batch_encode import encode_texts
    from tasks.evaluation.qa_metrics import first_hit_ranks, qa_accuracy_metrics
    from tasks.schemas import RUNS
    from tasks.training.examples import training_examples
    from tasks.training.arguments import TrainerArgs
    from tasks.training.trainer import train_bi_encoder

    started = time.perf_counter()
    t = {name: pq.read_table(Path(args.direct) / f"{name}.parquet") for name in TABLES}
    passages, questions = t["passages"], t["questions"]
    test = questions.filter(pc.equal(questions.column("split"), "test"))
    corpus = passages
    if args.limit_passages:  # smoke tests: the test questions' gold passages plus the first N
        gold_test = pc.is_in(t["gold"].column("qid"), value_set=test.column("qid"))
        keep = set(passages.column("pid").to_pylist()[:args.limit_passages])
        keep |= set(t["gold"].filter(gold_test).column("pid").to_pylist())
        corpus = passages.filter(pc.is_in(passages.column("pid"), value_set=pa.array(sorted(keep))))
    pids = corpus.column("pid").to_pylist()
    pairs = list(zip(corpus.column("title").to_pylist(), corpus.column("text").to_pylist()))
    text_of = dict(zip(pids, corpus.column("text").to_pylist()))
    examples_by_hard = {}
    base = resolve_checkpoint(args.model)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    top, train_s, steps_run = {}, {}, {}

    def encode(model, texts, side):
        fn = model.encode_passage if side == "passage" else model.encode_query
        with torch.inference_mode():  # the pipeline's encode settings: 256 / 64 tokens
            return encode_texts(texts, model.tokenizer, fn, batch_size=args.encode_batch, device=args.device,
                                max_length=256 if side == "passage" else 64, autocast_bf16=args.device == "cuda")

    for system in dense_systems:
        name, train = system["name"], system["train"]
        if args.deadline_min and time.perf_counter() - started > 60 * args.deadline_min:
            print(f"deadline: {name} and later systems skipped", flush=True)
            break
        torch.manual_seed(42)
        model = BiEncoder.from_pretrained(base, shared=False, pooling="cls", normalize=False, scale=1.0).float()
        loss = build_loss(train["loss"], model, **train.get("loss_options", {}))
        hard = train.get("hard_negatives", 0)
        if hard not in examples_by_hard:
            pool = SimpleNamespace(negative_pool=1, hard_negatives=hard, max_questions=None,
                                   batch_size=args.batch_size, seed=42)
            examples_by_hard[hard] = training_examples(pool, questions, passages, t["gold"], t["bm25_runs"])
        examples = examples_by_hard[hard]
        trainer_args = TrainerArgs(lr=args.lr, batch_size=args.batch_size, max_steps=args.steps if not args.epochs else None,
                                   epochs=args.epochs or 1, warmup_ratio=args.warmup_ratio, hard_negatives=hard, seed=42,
                                   query_max_len=32, passage_max_len=128)
        with tempfile.TemporaryDirectory() as out:
            result = train_bi_encoder(model, loss, examples, trainer_args, out, progress=False, device=args.device)
        train_s[name], steps_run[name] = result["seconds"], result["total_steps"]
        model.to(args.device).eval()
        p = torch.from_numpy(encode(model, pairs, "passage")).to(args.device)
        q = encode(model, test.column("question").to_pylist(), "query")
        run = exact_search(q, p, 100, pids, test.column("qid").to_pylist(), name)
        metrics = qa_accuracy_metrics(first_hit_ranks(run.cast(RUNS), text_of, test, "string", 100), (1, 5, 20, 100))
        top.update({(name, r["k"]): r["value"] for r in metrics.to_pylist()
                    if r["split"] == "test" and r["metric"] == "top_k_accuracy"})
        print(f"{name}: top-20 {100 * top[(name, 20)]:.1f}, {result['total_steps']} steps in {result['seconds']:.0f} s, "
              f"final loss {result['history'][-1]['loss']:.3f}", flush=True)
        write_report(args, top, train_s, stands_for, dense_systems, None,
                     f"direct mode on {device_name} from `{args.direct}` ({len(examples):,} training examples for "
                     f"the last row; {next(iter(steps_run.values()))} steps each), "
                     f"{(time.perf_counter() - started) / 60:.1f} min so far")
        del model, loss, p
        if args.device == "cuda":
            torch.cuda.empty_cache()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--queue-sizes", default="32,256,1024,4096,16384",
                    help="comma-separated; the smallest should be 2 x batch (in-batch negatives)")
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--root", default=None, help="artifact root (pforge --root; default $PFORGE_HOME, else ./artifacts)")
    ap.add_argument("--name", default="xmoco-queue-study")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "xmoco_queue_study_cpu.md"))
    ap.add_argument("--print-config", action="store_true", help="print the generated config and stop")
    ap.add_argument("--direct", help="direct mode: a folder of exported tables (benchmarks/quality/dense_quality.py --export-data)")
    ap.add_argument("--model", default="minilm", help="direct mode: the base checkpoint (alias or folder)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="direct mode: where to train and encode")
    ap.add_argument("--epochs", type=int, default=None, help="direct mode: train epochs instead of --steps")
    ap.add_argument("--warmup-ratio", type=float, default=0.1, help="direct mode (the pipeline's default: 0.1)")
    ap.add_argument("--encode-batch", type=int, default=256, help="direct mode")
    ap.add_argument("--limit-passages", type=int, default=None,
                    help="direct mode, smoke tests: search only the test gold passages plus the first N")
    ap.add_argument("--deadline-min", type=float, default=None, help="direct mode: start no system after this")
    args = ap.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv  # for the report's command line

    queue_sizes = sorted(int(q) for q in args.queue_sizes.split(","))
    if queue_sizes[0] < 2 * args.batch_size:
        raise SystemExit(f"queue sizes start at 2 x batch = {2 * args.batch_size} (section 5.3)")
    by_epochs = bool(args.direct and args.epochs)  # then the run is long enough for every size to evict
    dense_systems, stands_for = systems(10**9 if by_epochs else args.steps, args.batch_size, queue_sizes, args.lr)
    text = config_text(args.name, dense_systems)
    if args.print_config:
        print(text)
        return
    if args.direct:
        return run_direct(args, dense_systems, stands_for)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / f"{args.name}.yaml"
        config.write_text(text)
        report, versions, seconds = run_pipeline(config, args.root)
    top = test_metrics(report)
    where = (f"`pforge run`, pipeline wall time {seconds / 60:.1f} min, evaluation {report.parent.name}")
    write_report(args, top, training_seconds(report, versions), stands_for, dense_systems, text, where)


def write_report(args, top, train_s, stands_for, dense_systems, config, where) -> None:
    """The study's markdown (both modes): rows whose system has results so far."""
    queue_sizes = sorted(stands_for)
    largest = stands_for[queue_sizes[-1]]

    def row(label, system, note=""):
        if (system, 20) not in top:
            return None
        seconds_cell = f"{train_s[system]:.0f}" if train_s.get(system) is not None else "-"
        return [label, f"`{system}`", *(f"{100 * top[(system, k)]:.1f}" for k in (1, 5, 20, 100)), seconds_cell, note]

    def table(first, first_align, rows):
        return reporting.markdown_table([first, "system", "top-1", "top-5", "top-20", "top-100", "train s", "note"],
                                        [r for r in rows if r is not None], align=first_align + "lrrrrrl")

    never = args.steps * args.batch_size * 2
    schedule = (f"{args.epochs} epochs" if args.direct and args.epochs else f"{args.steps} steps") + f" of {args.batch_size}"
    env = "HF_HUB_OFFLINE=1" + ("" if args.direct else " nice -n 10")
    lines = [
        reporting.header("xMoCo queue-size study (paper 000 figure 2)", __file__, args.argv, env=env),
        f"Embedded default (configs/squad-open.yaml), test split (questions about articles no system trained on); "
        f"every system MiniLM with two towers, [CLS], dot product, {schedule} train-split questions, "
        f"lr {args.lr:g}, seed 42, last step kept (no selection on any split). xmoco: paper defaults (momentum 0.001, "
        "lambda 0.5); hard negatives: one BM25 negative per question (the top one without the answer). "
        f"{where}; train s: seconds of training.",
        "",
        "## Queue size (with one hard negative per question)",
        "",
    ]
    by_size = []
    for q in queue_sizes:
        note = "2 x batch: in-batch negatives" if q == 2 * args.batch_size else ""
        if q >= never and not (args.direct and args.epochs):
            note = f"never evicts in {args.steps} steps ({never} passage vectors): same run as every size >= {never}"
        by_size.append(row(str(q), stands_for[q], note))
    lines.append(table("queue size", "r", by_size))
    lines += [
        "",
        "## xMoCo against DPR at equal steps",
        "",
        table("hard negatives", "l", [
            row("1 BM25", largest, f"queue {queue_sizes[-1]}"),
            row("1 BM25", "dpr", "in-batch + the hard negatives"),
            row("none", f"xmoco-q{queue_sizes[-1]}-in-batch", f"queue {queue_sizes[-1]}"),
            row("none", "dpr-in-batch", "in-batch only"),
            row("-", "bm25", "for reference"),
        ]),
    ]
    if config:
        lines += ["", "Generated config:", "", "```yaml", config.rstrip(), "```"]
    text = "\n".join(lines)
    print(text)
    print(f"\nwritten: {reporting.write_report(Path(args.out), text)}")


if __name__ == "__main__":
    main()
