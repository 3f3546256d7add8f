"""Cross-encoder scoring throughput: ours (models.cross_encoder.CrossEncoderModel.score: one
tokenizer call for all pairs, batches longest first) vs sentence-transformers'
``CrossEncoder.predict`` on the same checkpoint folder, pairs, batch size and device, same run.

    HF_HUB_OFFLINE=1 python benchmarks/cross_encoder_throughput.py [--model FOLDER] [--pairs 400] \
        [--batch-size 32] [--max-length 256] [--threads 2] [--repeat 5] [--device cpu|cuda] [--bf16] [--out r.json]

Model: --model, a folder written by the cross_encoder stage (artifacts/cross_encoder/VERSION/model);
without it, MiniLM (alias 'minilm') with a one-logit head seeded 0 (throughput and agreement do
not depend on the head's training). Our model saves the folder and sentence-transformers loads
it, so both score the same weights with the same truncation (max length from the folder).
Pairs: SQuAD dev questions, each with its own paragraph and with another article's paragraph
(half positives), the first --pairs of them.

Timing (benchmarks/timing.py): one untimed warm-up call each, then every repeat scores all the
pairs with every system, alternated and the order swapped each repeat; end to end, strings in,
a numpy array of sigmoid probabilities out. Reported: pairs/s median (min-max), the ratio of
medians vs sentence-transformers with its range, and the largest |difference| of the scores (the
aim: identical to 1e-5). --bf16 adds ours under bf16 autocast (CUDA), with its own difference.
"""
from __future__ import annotations

import argparse
import os
import random
import tempfile
from pathlib import Path

import numpy as np

from _bootstrap import DEFAULT_SQUAD  # noqa: E402  (puts the project on sys.path)
import reporting  # noqa: E402
import timing  # noqa: E402
from _shared import squad_articles  # noqa: E402
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def squad_pairs(path: Path, n: int, seed: int = 0) -> list[tuple[str, str]]:
    """(question, paragraph) pairs: each paragraph's first question with its own paragraph, then with
    a paragraph of another article drawn at random (seeded); the first `n`."""
    articles = squad_articles(path)
    rng = random.Random(seed)
    pairs = []
    for a_i, article in enumerate(articles):
        for para in article.paragraphs:
            for q in para.questions[:1]:
                pairs.append((q["question"], para.context))
                other = articles[(a_i + 1 + rng.randrange(len(articles) - 1)) % len(articles)]
                pairs.append((q["question"], rng.choice(other.paragraphs).context))
    return pairs[:n]


def main(argv=None) -> None:
    from sentence_transformers import CrossEncoder

    from models.cross_encoder import CrossEncoderModel

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--squad", default=str(DEFAULT_SQUAD))
    parser.add_argument("--pairs", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--out", default=None)
    timing.add_repeat_argument(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    if args.model:
        ours = CrossEncoderModel.from_pretrained(args.model)
    else:
        torch.manual_seed(0)
        ours = CrossEncoderModel.from_base("minilm", args.max_length)
    ours.float().to(args.device).eval()  # a half-precision folder (carried to a GPU machine) scores in fp32 too
    folder = Path(tempfile.mkdtemp(prefix="ce-bench-"))
    ours.save_pretrained(folder)
    st = CrossEncoder(str(folder), device=args.device)
    pairs = squad_pairs(Path(args.squad), args.pairs)

    systems = {
        "st": lambda r: st.predict(pairs, batch_size=args.batch_size, show_progress_bar=False, convert_to_numpy=True),
        "ours": lambda r: ours.score(pairs, batch_size=args.batch_size, device=args.device),
    }
    if args.bf16:
        systems["ours-bf16"] = lambda r: ours.score(pairs, batch_size=args.batch_size, device=args.device, bf16=True)
    for run in systems.values():  # warm-up
        run(0)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else None
    seconds, last = timing.alternate(systems, args.repeat, sync=sync)
    summaries = {name: timing.summarize(timing.rates(len(pairs), s)) for name, s in seconds.items()}
    diffs = {name: float(np.max(np.abs(np.asarray(last[name]) - np.asarray(last["st"])))) for name in systems}

    device = reporting.device_name(args.device) + ("" if args.device.startswith("cuda") else f", {args.threads} threads")
    print(reporting.header("Cross-encoder scoring throughput: ours vs sentence-transformers", __file__, argv))
    print(f"Cross-encoder scoring, {len(pairs)} pairs, batch {args.batch_size}, max length {ours.max_length}, "
          f"device {device}")
    print(timing.protocol_line(args.repeat, list(systems)))
    rows = [row + [f"{diffs[name]:.1e}"] for row, name in
            zip(timing.comparison_rows(summaries, "st"), summaries)]
    print(reporting.markdown_table(["system", "pairs/s", "vs sentence-transformers", "max |score diff| vs st"], rows))
    if args.out:
        reporting.write_json(Path(args.out), {"device": device, "pairs": len(pairs), "batch_size": args.batch_size,
                                              "seconds": seconds, "max_abs_diff": diffs})


if __name__ == "__main__":
    main()
