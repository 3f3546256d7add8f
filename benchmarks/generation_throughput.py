"""doc2query generation throughput: ours (models.generator `QueryGenerator.generate`) vs a plain
`model.generate` loop over unsorted batches, same model, prompts, settings and hardware, same run.

    HF_HUB_OFFLINE=1 python benchmarks/generation_throughput.py --passages P.parquet|FOLDER \
        [--limit 64] [--generator smollm2] [--queries-per-passage 5] [--max-new-tokens 24] \
        [--batch-size 16] [--threads 2] [--repeat 5] [--seed 0] [--device cpu|cuda] [--out r.json]

Systems:
- ours: ``load_generator(G).generate(passages, n=C, top_p=0.95, top_k=25, max_new_tokens=M,
  batch_size=B, seed=S)``: prompts tokenised once, batches of B taken longest prompt first (less
  left padding), each prompt run once and its KV cache copied for its C samples (the peer's
  ``num_return_sequences`` runs it C times), the log-probability of every sampled token recorded
  step by step, distinct questions per passage.
- peer: the passages in their corpus order (unsorted), batches of B, each
  ``model.generate(**tokenizer(prompts, padding=True, padding_side='left', truncation=True,
  max_length=256), do_sample=True, top_p=0.95, top_k=25, num_return_sequences=C,
  max_new_tokens=M, use_cache=True)`` then ``batch_decode``. The prompts are the generator's own
  ``prompts()``; the script checks that the peer's token ids (padding removed) equal ours
  (``prompt_ids()``) and says how many differ.

Both sample (top-p 0.95, top-k 25, temperature 1), so their outputs differ and may stop at EOS at
different steps: the script reports the mean number of generated tokens per query (up to and
including the first EOS) and the mean decoding steps per batch (a batch runs until its last row
stops) for each, so that a speed difference is not just shorter outputs.

Timing (benchmarks/timing.py): each system generates for 4 passages once untimed (warm-up), then
every repeat generates for all --limit passages with each system, alternated and the order
swapped each repeat; end to end, passages in and question strings out, tokenisation included.
torch's RNG is seeded with --seed at the start of every call of both systems. Reported:
passages/s median (min-max), the ratio of medians (ours / peer) with its range, "parity" where
the ranges overlap.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import pyarrow.parquet as pq

import _bootstrap  # noqa: F401,E402  (puts the project on sys.path)
import timing  # noqa: E402
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

TOP_P, TOP_K = 0.95, 25
MAX_SOURCE_LEN = 256
NAMES = {"peer": "plain `model.generate` loop, corpus order (peer)",
         "ours": "ours (`QueryGenerator.generate`: length-sorted batches, shared prompt cache)"}


def load_passages(path: str, limit: int) -> list[tuple[str, str]]:
    table = pq.read_table(path, columns=["title", "text"])
    table = table.slice(0, limit or table.num_rows)
    return [(t or "", x or "") for t, x in zip(table.column("title").to_pylist(),
                                               table.column("text").to_pylist())]


class StepCounter:
    """Generated tokens per query (up to and including the first EOS) and steps per batch."""

    def __init__(self, eos_id: int):
        self.eos_id = eos_id
        self.reset()

    def reset(self) -> None:
        self.tokens, self.queries, self.steps, self.batches = 0, 0, 0, 0

    def add(self, new_tokens: torch.Tensor) -> None:
        is_eos = new_tokens == self.eos_id
        first = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1,
                            torch.full_like(is_eos[:, 0], new_tokens.shape[1], dtype=torch.long))
        self.tokens += int(first.sum())
        self.queries += new_tokens.shape[0]
        self.steps += new_tokens.shape[1]
        self.batches += 1

    def means(self) -> tuple[float, float]:
        return self.tokens / max(self.queries, 1), self.steps / max(self.batches, 1)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passages", required=True, help="passages parquet file or folder (title, text)")
    ap.add_argument("--limit", type=int, default=64, help="passages per repeat, the first ones (0: all)")
    ap.add_argument("--generator", default="smollm2", help="alias, folder or hub name (load_generator)")
    ap.add_argument("--queries-per-passage", type=int, default=5,
                    help="C: samples per passage (paper 002 table 3: 5)")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    timing.add_repeat_argument(ap, what="generations for all the passages per system")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    from models import resolve_checkpoint
    from models.generator import load_generator

    device = torch.device(args.device)
    passages = load_passages(args.passages, args.limit)
    gen = load_generator(args.generator)
    if gen.kind != "causal":
        raise SystemExit(f"this benchmark compares causal generators; {args.generator} is {gen.kind}")
    model, tok = gen.model.to(device).eval(), gen.tokenizer
    prompts, prompt_ids = gen.prompts(passages), gen.prompt_ids(passages, MAX_SOURCE_LEN)
    C, B, M = args.queries_per_passage, args.batch_size, args.max_new_tokens

    def peer_encode(batch: list[str]):
        return tok(batch, padding=True, padding_side="left", truncation=True,
                   max_length=MAX_SOURCE_LEN, return_tensors="pt")

    # the same inputs: the peer's ids without padding must be ours
    differ = 0
    for s in range(0, len(prompts), B):
        enc = peer_encode(prompts[s:s + B])
        for row, mask, ours_ids in zip(enc["input_ids"], enc["attention_mask"], prompt_ids[s:s + B]):
            differ += row[mask.bool()].tolist() != ours_ids

    counters = {k: StepCounter(tok.eos_token_id) for k in NAMES}
    raw_generate = model.generate

    def counting_generate(**kw):  # ours calls model.generate: count its outputs the same way
        out = raw_generate(**kw)
        counters["ours"].add(out.sequences[:, kw["input_ids"].shape[1]:])
        return out

    model.generate = counting_generate

    def run_ours(items):
        return gen.generate(items, n=C, top_p=TOP_P, top_k=TOP_K, max_new_tokens=M, batch_size=B,
                            seed=args.seed, max_source_len=MAX_SOURCE_LEN, device=device)

    def run_peer(items):
        texts = []
        torch.manual_seed(args.seed)
        with torch.inference_mode():
            for s in range(0, len(items), B):
                enc = peer_encode(gen.prompts(items[s:s + B])).to(device)
                out = raw_generate(**enc, do_sample=True, top_p=TOP_P, top_k=TOP_K, temperature=1.0,
                                   num_return_sequences=C, max_new_tokens=M, use_cache=True,
                                   pad_token_id=gen.pad_id, eos_token_id=tok.eos_token_id)
                new = out[:, enc["input_ids"].shape[1]:]
                counters["peer"].add(new)
                texts += [t.strip() for t in tok.batch_decode(new, skip_special_tokens=True)]
        return texts

    fns = {"peer": run_peer, "ours": run_ours}
    for k, f in fns.items():  # warm-up, untimed
        f(passages[:4])
        counters[k].reset()
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    seconds, last = timing.alternate({k: (lambda r, f=fns[k]: f(passages)) for k in NAMES},
                                     args.repeat, sync)
    summaries = {k: timing.summarize(timing.rates(len(passages), seconds[k])) for k in NAMES}
    ratio = timing.ratio(summaries["ours"], summaries["peer"])
    means = {k: counters[k].means() for k in NAMES}
    n_ours_questions = sum(len(qs) for qs in last["ours"])

    lengths = [len(x) for x in prompt_ids]
    hw = torch.cuda.get_device_name() if device.type == "cuda" else (platform.processor() or platform.machine())
    print(f"# Generation throughput ({args.passages})\n")
    print(f"generator {args.generator} ({resolve_checkpoint(args.generator)}), causal; {len(passages)} "
          f"passages per repeat (prompt tokens: mean {sum(lengths) / len(lengths):.0f}, min {min(lengths)}, "
          f"max {max(lengths)}; peer ids differing from ours: {differ}); {C} queries per passage, "
          f"top-p {TOP_P}, top-k {TOP_K}, max_new_tokens {M}, batch {B}, seed {args.seed}; "
          f"torch threads {torch.get_num_threads()}; device {device.type} ({hw}); torch {torch.__version__}, "
          f"os.cpu_count() {os.cpu_count()}")
    print(timing.protocol_line(args.repeat, list(NAMES)) + "\n")
    table = []
    for k, (name, rate, cell) in zip(NAMES, timing.comparison_rows(
            {NAMES[k]: summaries[k] for k in NAMES}, reference=NAMES["peer"], spec=".2f")):
        table.append([name, rate, cell, f"{means[k][0]:.1f}", f"{means[k][1]:.1f}"])
    print(timing.markdown_table(["system", "passages/s median (range)", "ratio vs peer (range)",
                                 "generated tokens / query", "decoding steps / batch"], table))
    print("\nper-repeat seconds: " + "; ".join(
        f"{k} " + ", ".join(f"{s:.2f}" for s in seconds[k]) for k in NAMES))
    print(f"tokens and steps: means over all timed repeats. Ours kept {n_ours_questions} distinct "
          f"non-empty questions of {len(passages) * C} samples in its last repeat.")
    print(f"example (passage 0): ours {last['ours'][0][:1]!r}; peer {last['peer'][:1]!r}")
    result = {"args": vars(args), "n_passages": len(passages), "prompt_tokens": lengths,
              "peer_ids_differing": differ, "seconds": seconds,
              "passages_per_s": {k: summaries[k].values for k in NAMES},
              "ratio_ours_vs_peer": {"median": ratio.median, "lo": ratio.lo, "hi": ratio.hi,
                                     "parity": ratio.parity},
              "generated_tokens_per_query": {k: means[k][0] for k in NAMES},
              "steps_per_batch": {k: means[k][1] for k in NAMES}}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
