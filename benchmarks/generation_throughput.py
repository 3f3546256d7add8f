"""doc2query generation throughput: ours (models.generator `QueryGenerator.generate`, and the
CTranslate2 runtime of models/ct2_generator.py at int8 and float32) vs a plain `model.generate`
loop over unsorted batches, same model, prompts, settings and hardware, same run; optionally the
quality of each runtime against SQuAD dev gold questions.

    HF_HUB_OFFLINE=1 python benchmarks/generation_throughput.py [--passages P.parquet|FOLDER] \
        [--limit 64] [--generator smollm2] [--queries-per-passage 5] [--max-new-tokens 24] \
        [--batch-size 16] [--threads 2] [--repeat 5] [--seed 0] [--device cpu|cuda] \
        [--ct2 int8,float32] [--llamacpp int8,float32] [--quality 32] [--quality-seeds 6] [--quality-only] [--out r.json]

Without --passages, the passages are the embedded default's SQuAD dev articles (squad-open.yaml)
cut into DPR's 100-word chunks by the project's chunker.

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

- lcpp-int8 / lcpp-float32 (--llamacpp): ``load_llamacpp_generator(gen, G, compute_type).generate(...)``
  with the same arguments: the cached GGUF file (q8_0 or f32, written before timing), one llama.cpp
  context per call holding a batch's prompts once for their C samples, n_threads = --threads.
- ct2-int8 / ct2-float32 (--ct2): ``load_ct2_generator(gen, G, compute_type).generate(...)`` with
  the same arguments: the cached CTranslate2 conversion (converted before timing), a fresh decoder
  per call (that is what makes its seed reproducible; its load is timed), intra_threads = --threads.

Quality (--quality N): the first N SQuAD dev paragraphs that have gold questions, C questions each
from torch seed S, torch seed S+1 and each CTranslate2 precision at seed S: BLEU-4 and ROUGE-L
against the paragraph's gold questions (tasks/qgen/quality.py, as the synthetic_queries stage
scores), and the round trip: the share of generated questions whose own paragraph BM25 (bm25s,
over the N paragraphs) ranks first. The two torch seeds' difference is the noise yardstick; with
--quality-seeds K every system writes at seeds S..S+K-1 and gets its mean, standard deviation and
range (one seed's ROUGE-L moves by 1-2 points); --quality-only skips the timing.

All sample (top-p 0.95, top-k 25, temperature 1), so their outputs differ and may stop at EOS at
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
import os
from pathlib import Path

import pyarrow.parquet as pq

from _bootstrap import DEFAULT_SQUAD  # noqa: E402  (puts the project on sys.path)
import reporting  # noqa: E402
import timing  # noqa: E402
from _shared import squad_articles  # noqa: E402
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

TOP_P, TOP_K = 0.95, 25
MAX_SOURCE_LEN = 256
NAMES = {"peer": "plain `model.generate` loop, corpus order (peer)",
         "ours": "ours (`QueryGenerator.generate`: length-sorted batches, shared prompt cache)"}
CT2_NAMES = {"int8": "ctranslate2 int8 (`load_ct2_generator`)", "float32": "ctranslate2 float32 (`load_ct2_generator`)"}
LCPP_NAMES = {"int8": "llama.cpp q8_0 (`load_llamacpp_generator`)", "float32": "llama.cpp f32 (`load_llamacpp_generator`)",
              "bfloat16": "llama.cpp bf16 (`load_llamacpp_generator`)"}


def load_passages(path: str | None, limit: int) -> list[tuple[str, str]]:
    if path is None:  # the embedded default's corpus: SQuAD dev articles in 100-word chunks
        from tasks.chunking.chunker import chunk_documents
        from tasks.readers.squad import iter_squad_documents

        chunks = chunk_documents(iter_squad_documents(DEFAULT_SQUAD), words=100)
        return [(c["title"], c["text"]) for _, c in zip(range(limit or 10**9), chunks)]
    table = pq.read_table(path, columns=["title", "text"])
    table = table.slice(0, limit or table.num_rows)
    return [(t or "", x or "") for t, x in zip(table.column("title").to_pylist(),
                                               table.column("text").to_pylist())]


def squad_paragraphs(n: int) -> list[tuple[tuple[str, str], list[str]]]:
    """The first n SQuAD dev paragraphs with gold questions: ((title, context), questions)."""
    out = []
    for article in squad_articles(DEFAULT_SQUAD):
        for para in article.paragraphs:
            questions = [q["question"] for q in para.questions]
            if questions and len(out) < n:
                out.append(((article.title, para.context), questions))
    return out


def quality(generated: list[list[tuple[str, float]]], paragraphs) -> dict:
    """BLEU-4 / ROUGE-L against the gold questions, and the BM25 round trip over the paragraphs."""
    import logging

    import bm25s

    from tasks.qgen.quality import bleu_rouge

    logging.getLogger("bm25s").setLevel(logging.WARNING)

    gen = {str(i): [q for q, _ in qs] for i, qs in enumerate(generated)}
    refs = {str(i): qs for i, (_, qs) in enumerate(paragraphs)}
    retriever = bm25s.BM25(k1=0.9, b=0.4)
    retriever.index(bm25s.tokenize([f"{t} {x}" for (t, x), _ in paragraphs], show_progress=False), show_progress=False)
    queries = [(i, q) for i, qs in gen.items() for q in qs]
    top, _ = retriever.retrieve(bm25s.tokenize([q for _, q in queries], show_progress=False), k=1, show_progress=False)
    first = sum(str(int(t[0])) == i for (i, _), t in zip(queries, top))
    return {**bleu_rouge(gen, refs), "bm25_own_paragraph_first": first / max(len(queries), 1),
            "questions": len(queries)}


def quality_table(args, gen, runtime_gens: dict, C: int, M: int, B: int) -> dict:
    """BLEU-4 / ROUGE-L / round trip of torch and each other runtime (name -> generator): torch at
    two seeds and each runtime at one, or every system at --quality-seeds seeds, with each system's
    mean, standard deviation and range over its seeds."""
    import statistics

    paragraphs = squad_paragraphs(args.quality)
    items = [p for p, _ in paragraphs]
    kw = dict(n=C, top_p=TOP_P, top_k=TOP_K, max_new_tokens=M, batch_size=B, max_source_len=MAX_SOURCE_LEN)
    k = args.quality_seeds
    runs = {f"torch seed {s}": (lambda s=s: gen.generate(items, seed=s, device=args.device, **kw))
            for s in range(args.seed, args.seed + (k or 2))}
    for name, g in runtime_gens.items():
        for s in range(args.seed, args.seed + (k or 1)):
            runs[f"{name} seed {s}"] = lambda g=g, s=s: g.generate(items, seed=s, **kw)
    scores = {name: quality(run(), paragraphs) for name, run in runs.items()}
    print(f"\n## Quality: {len(paragraphs)} SQuAD dev paragraphs ({sum(len(q) for _, q in paragraphs)} gold "
          f"questions), {C} questions each, same settings\n")
    rows = [[name, f"{s['bleu4']:.2f}", f"{s['rougeL']:.2f}", f"{s['bm25_own_paragraph_first']:.3f}", s["questions"]]
            for name, s in scores.items()]
    print(reporting.markdown_table(["runtime", "BLEU-4", "ROUGE-L", "BM25 own paragraph first", "questions"], rows))
    if k > 1:  # one seed's questions are noisy: each system's spread over its seeds
        summary = []
        for system in ["torch", *runtime_gens]:
            seeds = [s for name, s in scores.items() if name.rsplit(" seed ", 1)[0] == system]
            summary.append([system] + [f"{statistics.mean(v):.2f} ({statistics.stdev(v):.2f}; {min(v):.2f}-{max(v):.2f})"
                                       for v in ([s[m] for s in seeds] for m in ("bleu4", "rougeL", "bm25_own_paragraph_first"))])
        print(f"\nOver seeds {args.seed}-{args.seed + k - 1}: mean (standard deviation; min-max)\n")
        print(reporting.markdown_table(["runtime", "BLEU-4", "ROUGE-L", "BM25 own paragraph first"], summary))
    return scores


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

    def add_counts(self, lengths: list[int]) -> None:
        """Queries counted from their token counts alone (no batch steps known)."""
        self.tokens += sum(lengths)
        self.queries += len(lengths)

    def means(self) -> tuple[float, float]:
        return self.tokens / max(self.queries, 1), self.steps / max(self.batches, 1)


def count_samples(runtime_gen, counter: "StepCounter") -> None:
    """Wrap a CTranslate2 or llama.cpp generator's `sample_ids` so `counter` sees every sample's
    generated ids (EOS included when reached): tokens per query."""
    raw = runtime_gen.sample_ids

    def counting(*a, **kw):
        out = raw(*a, **kw)
        counter.add_counts([len(ids) for samples in out for ids, _ in samples])
        return out

    runtime_gen.sample_ids = counting


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passages", help="passages parquet file or folder (title, text); default: the "
                    "embedded default's SQuAD dev articles in 100-word chunks")
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
    ap.add_argument("--ct2", default="int8,float32",
                    help="CTranslate2 precisions to time beside torch (comma-separated; empty: none)")
    ap.add_argument("--llamacpp", default="int8",
                    help="llama.cpp precisions to time beside torch (int8: q8_0, float32, bfloat16; comma-separated; empty: none)")
    ap.add_argument("--quality", type=int, default=0,
                    help="also score N SQuAD dev paragraphs' questions per runtime (0: skip)")
    ap.add_argument("--quality-seeds", type=int, default=0, help="score every system at this many seeds (--seed "
                    "on), with each one's mean and spread (0: torch at two seeds, the other runtimes at one)")
    ap.add_argument("--quality-only", action="store_true", help="the quality table only, no timing")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.quality_only and not args.quality:
        ap.error("--quality-only needs --quality N")

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

    precisions = [c for c in args.ct2.split(",") if c]
    lcpp_precisions = [c for c in args.llamacpp.split(",") if c]
    if set(lcpp_precisions) - set(LCPP_NAMES):
        ap.error(f"--llamacpp takes {', '.join(LCPP_NAMES)}; got {args.llamacpp!r}")
    names = {**NAMES, **{f"ct2-{c}": CT2_NAMES[c] for c in precisions},
             **{f"lcpp-{c}": LCPP_NAMES[c] for c in lcpp_precisions}}
    counters = {k: StepCounter(tok.eos_token_id) for k in names}
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
    ct2_gens = {}
    for c in precisions:  # converted (and cached) before any timing
        from models.ct2_generator import load_ct2_generator

        ct2 = ct2_gens[f"ctranslate2 {c}"] = load_ct2_generator(gen, args.generator, c, args.device, args.threads)
        count_samples(ct2, counters[f"ct2-{c}"])
        fns[f"ct2-{c}"] = (lambda items, g=ct2: g.generate(
            items, n=C, top_p=TOP_P, top_k=TOP_K, max_new_tokens=M, batch_size=B, seed=args.seed,
            max_source_len=MAX_SOURCE_LEN))
    for c in lcpp_precisions:  # written (and cached) before any timing
        from models.llamacpp_generator import load_llamacpp_generator

        lcpp = load_llamacpp_generator(gen, args.generator, c, args.threads)
        ct2_gens[f"llama.cpp {c}"] = lcpp
        count_samples(lcpp, counters[f"lcpp-{c}"])
        fns[f"lcpp-{c}"] = (lambda items, g=lcpp: g.generate(
            items, n=C, top_p=TOP_P, top_k=TOP_K, max_new_tokens=M, batch_size=B, seed=args.seed,
            max_source_len=MAX_SOURCE_LEN))
    if args.quality_only:
        result = {"args": vars(args), "quality": quality_table(args, gen, ct2_gens, C, M, B)}
        if args.out:
            reporting.write_json(Path(args.out), result)
        return result
    # the same inputs: the peer's ids without padding must be ours
    differ = 0
    for s in range(0, len(prompts), B):
        enc = peer_encode(prompts[s:s + B])
        for row, mask, ours_ids in zip(enc["input_ids"], enc["attention_mask"], prompt_ids[s:s + B]):
            differ += row[mask.bool()].tolist() != ours_ids

    for k, f in fns.items():  # warm-up, untimed
        f(passages[:4])
        counters[k].reset()
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    seconds, last = timing.alternate({k: (lambda r, f=fns[k]: f(passages)) for k in names},
                                     args.repeat, sync)
    summaries = {k: timing.summarize(timing.rates(len(passages), seconds[k])) for k in names}
    ratio = timing.ratio(summaries["ours"], summaries["peer"])
    ratios = {k: timing.ratio(summaries[k], summaries["peer"]) for k in names}
    means = {k: counters[k].means() for k in names}
    n_ours_questions = sum(len(qs) for qs in last["ours"])

    lengths = [len(x) for x in prompt_ids]
    hw = reporting.device_name(device.type)
    print(reporting.header(f"Generation throughput ({args.passages or 'SQuAD dev articles, 100-word chunks'})",
                           __file__, argv))
    print(f"generator {args.generator} ({resolve_checkpoint(args.generator)}), causal; {len(passages)} "
          f"passages per repeat (prompt tokens: mean {sum(lengths) / len(lengths):.0f}, min {min(lengths)}, "
          f"max {max(lengths)}; peer ids differing from ours: {differ}); {C} queries per passage, "
          f"top-p {TOP_P}, top-k {TOP_K}, max_new_tokens {M}, batch {B}, seed {args.seed}; "
          f"torch threads {torch.get_num_threads()}; device {device.type} ({hw}); torch {torch.__version__}, "
          f"os.cpu_count() {os.cpu_count()}")
    print(timing.protocol_line(args.repeat, list(names)) + "\n")
    table = []
    for k, (name, rate, cell) in zip(names, timing.comparison_rows(
            {names[k]: summaries[k] for k in names}, reference=NAMES["peer"], spec=".2f")):
        steps = f"{means[k][1]:.1f}" if counters[k].batches else "-"
        table.append([name, rate, cell, f"{means[k][0]:.1f}", steps])
    print(reporting.markdown_table(["system", "passages/s median (range)", "ratio vs peer (range)",
                                 "generated tokens / query", "decoding steps / batch"], table))
    print("\nper-repeat seconds: " + "; ".join(
        f"{k} " + ", ".join(f"{s:.2f}" for s in seconds[k]) for k in names))
    print(f"tokens and steps: means over all timed repeats. Ours kept {n_ours_questions} distinct "
          f"non-empty questions of {len(passages) * C} samples in its last repeat.")
    print(f"example (passage 0): ours {last['ours'][0][:1]!r}; peer {last['peer'][:1]!r}"
          + "".join(f"; {k} {last[k][0][:1]!r}" for k in names if k.startswith(("ct2-", "lcpp-"))))
    result = {"args": vars(args), "n_passages": len(passages), "prompt_tokens": lengths,
              "peer_ids_differing": differ, "seconds": seconds,
              "passages_per_s": {k: summaries[k].values for k in names},
              "ratio_ours_vs_peer": {"median": ratio.median, "lo": ratio.lo, "hi": ratio.hi,
                                     "parity": ratio.parity},
              "ratio_vs_peer": {k: {"median": r.median, "lo": r.lo, "hi": r.hi, "parity": r.parity}
                                for k, r in ratios.items()},
              "generated_tokens_per_query": {k: means[k][0] for k in names},
              "steps_per_batch": {k: means[k][1] for k in names}}
    if args.quality:
        result["quality"] = quality_table(args, gen, ct2_gens, C, M, B)
    if args.out:
        reporting.write_json(Path(args.out), result)
    return result


if __name__ == "__main__":
    main()
