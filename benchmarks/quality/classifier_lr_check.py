"""Can the cross-attention classifier learn at a given learning rate? Each rate fine-tunes a fresh
MiniLM classifier for a few steps on a small fixed sample of the classifier's own training pairs
(1:1:1 negatives of train-split questions, never its dev split or the test split) and reports the
AUC on those same pairs: a rate that cannot fit 64 pairs will not fit 20,000 in an epoch. This is
how the study chose its classifier rate (README, corpus-scale study).

    .venv/bin/python benchmarks/quality/classifier_lr_check.py --root ~/pforge-runs/study --lr 3e-5 1e-4 2e-4
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import _quality_bootstrap  # noqa: F401  (puts benchmarks/ and the project on sys.path)
import reporting  # noqa: E402


def training_sample(root: Path, pairs: int, seed: int):
    """`pairs` of the classifier's training pairs (dev questions held out as the stage holds them)."""
    import pyarrow.compute as pc

    from storage import ArtifactStore
    from tasks.silver.sampling import as_text_pairs, classifier_pairs, held_out

    store = ArtifactStore(root, create=False)
    questions = store.latest("questions").read_table("questions", columns=["qid", "question", "answers", "split"])
    passages = store.latest("passages").read_table(columns=["pid", "doc_id", "text"])
    dense = store.latest("dense_runs", {"system": "zero-shot"})
    train = questions.filter(pc.equal(questions.column("split"), "train")).slice(0, 400)
    labelled = [p for p in classifier_pairs(train, store.latest("gold").read_table(), passages,
                                            store.latest("bm25_runs").read_table(),
                                            dense.read_table() if dense is not None else None, depth=10, seed=13)
                if not held_out(p.qid, 0.1, 13)]
    sample = random.Random(seed).sample(labelled, pairs)
    text_of = dict(zip(passages.column("pid").to_pylist(), passages.column("text").to_pylist()))
    return as_text_pairs(sample, text_of), [p.label for p in sample]


def main(argv=None) -> int:
    import torch

    from models.cross_encoder import CrossEncoderModel
    from tasks.silver.classifier import ClassifierTrainArgs, auc, train_classifier

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="an artifact root holding a squad-open-style run")
    parser.add_argument("--lr", type=float, nargs="+", default=[3e-5, 1e-4, 2e-4])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--base", default="minilm")
    args = parser.parse_args(argv)
    pairs, labels = training_sample(args.root, args.pairs, seed=0)
    print(reporting.header("Cross-attention classifier: AUC after a few steps at each learning rate", __file__, argv))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.pairs} training "
          f"pairs ({sum(labels)} positive), {args.steps} steps of 16, 10% warm-up\n")
    # the header now, each rate's row once it is trained (minutes each)
    print(reporting.markdown_table(["lr", "AUC before", "AUC after", "loss, first 3 steps", "loss, last 3 steps",
                                    "seconds"], [], align="rrrllr"), flush=True)
    for lr in args.lr:
        torch.manual_seed(0)  # the same fresh head for every rate
        model = CrossEncoderModel.from_base(args.base, 256)
        before = auc(labels, model.score(pairs, device="cpu"))
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as out:
            result = train_classifier(model, pairs, labels, ClassifierTrainArgs(lr=lr, batch_size=16, max_steps=args.steps,
                                                                                warmup_ratio=0.1, seed=1), out, device="cpu")
        after = auc(labels, model.score(pairs, device="cpu"))
        losses = [h["loss"] for h in result["history"]]
        print(reporting.table_row([f"{lr:g}", f"{before:.3f}", f"{after:.3f}", ", ".join(f"{x:.3f}" for x in losses[:3]),
                                   ", ".join(f"{x:.3f}" for x in losses[-3:]), f"{time.perf_counter() - started:.0f}"]),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
