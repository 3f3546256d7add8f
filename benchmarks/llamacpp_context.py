"""llama.cpp context layouts for doc2query batches: one KV cache shared by every sequence (the
layout before 2026-11-29: a prompt's cells tagged with its n sample ids) vs a KV stream per
sequence (models/llamacpp_generator.py: the prompt run into its first sample's stream, then copied
to the others with llama_memory_seq_cp), each with llama.cpp's CPU flash attention on ("auto")
and off (ours: streams, flash auto, as the q8_0 runtime runs; its f32 runtime turns flash
attention off, which rounds through f16). Same GGUF file, token ids, thread count and run.

    python benchmarks/llamacpp_context.py --gguf MODEL.gguf [--prompts 16] [--samples 2] \
        [--prompt-tokens 165] [--steps 24] [--threads 2] [--layouts NAME,NAME] [--repeat 5]

MODEL.gguf: any Llama-family GGUF file, e.g. the runtime cache's conversion of the demo's
generator (~/.cache/passage-forge/runtimes/llamacpp/*/model.gguf, written by
models/llamacpp_generator.convert). Timings only: token ids are seeded random draws (prompts of
--prompt-tokens minus 0, 10, ..., 40 tokens, as the demo's prompts spread), every sample runs
all --steps decoding steps (no EOS), and the step's tokens are random too, so the per-step cost
is what it is for real text. Each repeat times one batch per layout: the prefill (every prompt's
tokens in one llama_decode call, logits of each prompt's last token) and --steps calls of one
token per sample, logits read back as the runtime reads them. Layouts alternated, order swapped
each repeat (benchmarks/timing.py); the ratio is layout over the shared-cache peer, in batches/s.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import _bootstrap  # noqa: F401  (puts the project root on sys.path)
from models.llamacpp_generator import _Context
from reporting import header, markdown_table
from timing import add_repeat_argument, alternate, comparison_rows, fmt_summary, protocol_line, rates, summarize

LAYOUTS = {  # name: (one cache shared by all sequences, flash attention type: -1 auto, 0 off)
    # shared: a prompt's cells tagged with its n sample ids; streams: a KV stream per sequence
    "shared-flash-auto (peer)": (True, -1),
    "shared-flash-off": (True, 0),
    "streams-flash-auto (ours)": (False, -1),
    "streams-flash-off": (False, 0),
}


class Layout(_Context):
    """The runtime's context (its parameters, prefill and decode) with a layout's settings."""

    def __init__(self, L, model, shared: bool, flash: int, prompts: list[list[int]], samples: int, steps: int,
                 threads: int):
        self.shared, self.prompts, self.n, self.steps = shared, prompts, samples, steps
        longest, sequences = max(map(len, prompts)), len(prompts) * samples
        params = self.params(L, cells=longest + steps, sequences=sequences,
                             batch_tokens=max(sum(map(len, prompts)), sequences), threads=threads, f32_cache=False)
        if shared:  # the earlier layout: one cache, a prompt's cells tagged with its n sample ids
            params.kv_unified = True
            params.n_ctx = len(prompts) * (longest + samples * steps)
        params.flash_attn_type = flash
        self.open(L, model, params)
        self.split: list[tuple[float, float]] = []

    def __call__(self, repeat: int) -> None:
        n = self.n
        rng = np.random.default_rng(repeat + 1)  # the warm-up is repeat -1
        self.clear()
        start = time.perf_counter()
        if self.shared:
            self.decode([(t, pos, range(p * n, (p + 1) * n), pos == len(prompt) - 1)
                         for p, prompt in enumerate(self.prompts) for pos, t in enumerate(prompt)])
        else:
            self.prefill(self.prompts, n)
        prefilled = time.perf_counter()
        sequences = len(self.prompts) * n
        for step in range(self.steps):
            tokens = rng.integers(min(100, self.vocab - 1), self.vocab, size=sequences).tolist()
            self.decode([(tokens[s], len(self.prompts[s // n]) + step, (s,), True) for s in range(sequences)])
        self.split.append((prefilled - start, time.perf_counter() - prefilled))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=165)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layouts", default=",".join(LAYOUTS),
                        help="comma-separated layout names to run (default: all; the peer is always run)")
    add_repeat_argument(parser)
    args = parser.parse_args(argv)
    peer = next(iter(LAYOUTS))
    chosen = [name for name in LAYOUTS if name == peer or name in args.layouts.split(",")]

    import llama_cpp as L
    import llama_cpp._logger

    llama_cpp._logger.set_verbose(False)
    L.llama_backend_init()
    model = L.llama_model_load_from_file(args.gguf.encode(), L.llama_model_default_params())
    if not model:
        raise SystemExit(f"{args.gguf}: llama.cpp could not load the model")
    vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(min(100, vocab - 1), vocab, size=max(1, args.prompt_tokens - (i % 5) * 10)).tolist()
               for i in range(args.prompts)]
    layouts = {name: Layout(L, model, shared, flash, prompts, args.samples, args.steps, args.threads)
               for name, (shared, flash) in LAYOUTS.items() if name in chosen}
    for layout in layouts.values():  # warm-up, untimed
        layout(-1)
        layout.split.clear()
    seconds, _ = alternate(layouts, args.repeat)
    summaries = {name: summarize(rates(1.0, s)) for name, s in seconds.items()}
    print(header("llama.cpp KV layouts: a stream per sequence vs one shared cache", __file__, argv))
    print(f"{args.gguf}; {args.prompts} prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
          f"{args.samples} samples each, {args.steps} decoding steps; {args.threads} threads; "
          f"llama-cpp-python {L.__version__}")
    print(protocol_line(args.repeat, list(layouts)))
    rows = [row + [fmt_summary(summarize([p for p, _ in layouts[row[0]].split]), ".2f"),
                   fmt_summary(summarize([d for _, d in layouts[row[0]].split]), ".2f")]
            for row in comparison_rows(summaries, peer, spec=".3f")]
    print(markdown_table(["layout", "batches/s", "ratio vs peer", "prefill s", f"{args.steps} steps s"], rows))


if __name__ == "__main__":
    main()
