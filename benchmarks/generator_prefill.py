"""The generator's prompt pass on the CPU, where generation spends most of its time (about 60% of
llama.cpp's, benchmarks/results/llamacpp_context_cpu.md): the fastest runtime of the project
(llama.cpp q8_0) against the torch fp32 forward (the peer: what the plain `generate` loop computes
first) and against what an int8 matrix-product runtime would give, same run, alternated.

    HF_HUB_OFFLINE=1 python benchmarks/generator_prefill.py --generator G [--limit 32] \
        [--batch-size 16] [--llamacpp int8,float32] [--onnx fp32,int8,int8-fp32-down] \
        [--threads 2] [--repeat 5] [--out r.json]

Prompts: the generator's own prompts (`QueryGenerator.prompt_ids`) for the first --limit 100-word
chunks of the embedded default's corpus (or --passages), run longest first in batches of
--batch-size, each batch padded on the right where the runtime pads; the output is each prompt's
last-token logits, the distribution its first question token is drawn from.
  torch            the model's forward, fp32, eager attention: the graph the ONNX rows export (the
                   reference of the agreement columns)
  llamacpp-C       models/llamacpp_generator.py's context: every prompt in a KV stream of its own
                   (C: int8 = q8_0, float32 = f32), as its `generate` prefills
  onnx-fp32        the same forward exported to ONNX (models/encoder_runtimes.export_checked), ORT
  onnx-int8        that graph with ORT's dynamic int8 (models/encoder_runtimes.quantize_int8)
  onnx-int8-fp32-down  the same, the feed-forward down projections kept fp32 (their inputs, the
                   gated products, carry the largest activations)
The ONNX rows are not a runtime of the project (generation needs a KV-cache graph too): they
measure what the int8 products would gain and cost before one is built.
Reported: prompt tokens/s median (min-max), ratio of medians vs torch with its range
(benchmarks/timing.py), useful GOP/s (roofline.decoder_prefill_flops over the unpadded lengths)
as a share of this CPU's fp32 sgemm and of ORT's int8 product, measured in the same run; and the
agreement of the last-token distribution with torch fp32: top-1 agreement, mean KL(p_fp32 || q)
in nats, max |logit difference|.
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

import _bootstrap  # noqa: F401,E402  (puts the project on sys.path)
import roofline  # noqa: E402
import reporting  # noqa: E402
import timing  # noqa: E402
from generation_throughput import MAX_SOURCE_LEN, load_passages  # noqa: E402
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

INPUTS = ("input_ids", "attention_mask")
ONNX_VARIANTS = ("fp32", "int8", "int8-fp32-down")


class LastTokenLogits(nn.Module):
    """Right-padded prompts -> the logits of each prompt's last real token (batch, vocab)."""

    def __init__(self, causal_lm: nn.Module) -> None:
        super().__init__()
        self.causal_lm = causal_lm

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.causal_lm.model(input_ids=input_ids, attention_mask=attention_mask,
                                      use_cache=False).last_hidden_state
        last = attention_mask.sum(dim=1) - 1
        return self.causal_lm.lm_head(hidden[torch.arange(hidden.shape[0]), last])


def batches(prompt_ids: list[list[int]], batch_size: int) -> list[list[list[int]]]:
    """The prompts longest first, in batches (the order `generate` runs them in)."""
    ordered = sorted(prompt_ids, key=len, reverse=True)
    return [ordered[i:i + batch_size] for i in range(0, len(ordered), batch_size)]


def right_padded(batch: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    from models.generator import pad_sequences

    return {"input_ids": pad_sequences(batch, pad_id, left=False),
            "attention_mask": pad_sequences([[1] * len(p) for p in batch], 0, left=False)}


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(1, keepdims=True))


def agreement(reference: np.ndarray, other: np.ndarray) -> dict[str, float]:
    """top-1 agreement, mean KL(p_ref || q) in nats, max |logit difference| of two (rows, vocab)."""
    ref, got = reference.astype(np.float64), other.astype(np.float64)
    log_p, log_q = _log_softmax(ref), _log_softmax(got)
    kl = (np.exp(log_p) * (log_p - log_q)).sum(1)
    return {"top1": float((ref.argmax(1) == got.argmax(1)).mean()), "kl": float(kl.mean()),
            "max_abs_dlogit": float(np.abs(ref - got).max())}


def down_projections(path: Path) -> list[str]:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return [n.name for n in graph.node if n.op_type == "MatMul" and "down_proj" in n.name]


def onnx_systems(graph: nn.Module, vocab: int, variants: list[str], folder: Path, threads: int, pad_id: int):
    """name -> callable(batches) -> logits, for each ONNX variant (exported and quantised here)."""
    from models.encoder_runtimes import export_checked, new_session, quantize_int8

    fp32 = folder / "prefill.onnx"
    export_checked(graph, INPUTS, "logits", vocab, fp32)
    paths = {"fp32": fp32}
    for variant in variants:
        if variant == "fp32":
            continue
        target = folder / f"prefill-{variant}.onnx"
        exclude = down_projections(fp32) if variant == "int8-fp32-down" else []
        quantize_int8(fp32, target, nodes_to_exclude=exclude)
        paths[variant] = target
    out = {}
    for variant in variants:
        session = new_session(paths[variant], threads)
        out[f"onnx-{variant}"] = (lambda groups, s=session: np.concatenate(
            [s.run(None, {k: v.numpy() for k, v in right_padded(g, pad_id).items()})[0] for g in groups]))
    return out


def llamacpp_systems(gen, source: str, precisions: list[str], groups, threads: int):
    """(name -> callable(batches) -> logits, each through a llama.cpp context made once; the
    contexts, to close after the timing)."""
    from models.llamacpp_generator import _Context, load_llamacpp_generator

    out, contexts = {}, []
    longest, widest = max(len(g[0]) for g in groups), max(len(g) for g in groups)
    for c in precisions:
        lcpp = load_llamacpp_generator(gen, source, c, threads)
        context = _Context(lcpp._model, cells=longest + 1, sequences=widest, batch_tokens=widest * longest,
                           threads=threads, f32_cache=c == "float32")
        contexts.append((context, lcpp))  # the generator keeps the model the context reads alive

        def run(batch_groups, context=context):
            rows = []
            for g in batch_groups:
                context.clear()
                rows.append(context.prefill(g, 1))
            return np.concatenate(rows)

        out[f"llamacpp-{c}"] = run
    return out, contexts


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--generator", default="smollm2", help="a causal generator: alias, folder or hub name")
    ap.add_argument("--passages", help="passages parquet file or folder (title, text); default: the embedded "
                    "default's SQuAD dev articles in 100-word chunks")
    ap.add_argument("--limit", type=int, default=32, help="prompts per repeat, the first passages'")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--llamacpp", default="int8,float32", help="llama.cpp precisions (comma-separated; empty: none)")
    ap.add_argument("--onnx", default=",".join(ONNX_VARIANTS), help="ONNX variants (comma-separated; empty: none)")
    ap.add_argument("--threads", type=int, default=2)
    timing.add_repeat_argument(ap, what="prompt passes over all the prompts per system")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)

    from models import resolve_checkpoint
    from models.generator import load_generator
    from models.encoder_runtimes import _eager

    torch.set_num_threads(args.threads)
    gen = load_generator(args.generator)
    if gen.kind != "causal":
        raise SystemExit(f"{args.generator} is a {gen.kind} generator; this benchmark measures causal prompt passes")
    config = gen.model.config
    prompt_ids = gen.prompt_ids(load_passages(args.passages, args.limit), MAX_SOURCE_LEN)
    groups = batches(prompt_ids, args.batch_size)
    lengths = [len(p) for g in groups for p in g]
    graph = LastTokenLogits(_eager(gen.model)).eval()

    def run_torch(batch_groups):
        with torch.inference_mode():
            return np.concatenate([graph(**right_padded(g, gen.pad_id)).numpy() for g in batch_groups])

    systems = {"torch": run_torch}
    onnx_variants = [v for v in args.onnx.split(",") if v]
    for v in onnx_variants:
        if v not in ONNX_VARIANTS:
            raise SystemExit(f"--onnx: unknown variant {v!r} (known: {', '.join(ONNX_VARIANTS)})")
    with tempfile.TemporaryDirectory(prefix="pforge-prefill-") as tmp:
        lcpp, contexts = llamacpp_systems(gen, args.generator, [c for c in args.llamacpp.split(",") if c], groups,
                                          args.threads)
        systems.update(lcpp)
        if onnx_variants:
            systems.update(onnx_systems(graph, int(config.vocab_size), onnx_variants, Path(tmp), args.threads,
                                        gen.pad_id))
        logits = {name: run(groups) for name, run in systems.items()}  # warm-up, untimed; the agreement
        seconds, _ = timing.alternate({k: (lambda r, f=f: f(groups)) for k, f in systems.items()}, args.repeat)
        for context, _ in contexts:
            context.close()
    sgemm = roofline.sgemm_gflops(args.threads)
    int8_peak = roofline.int8_gemm_gops(args.threads)

    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_dim = head_dim * getattr(config, "num_key_value_heads", config.num_attention_heads)
    flops = roofline.decoder_prefill_flops(config.hidden_size, config.intermediate_size, config.num_hidden_layers,
                                           kv_dim, config.vocab_size, lengths)
    tokens = sum(lengths)
    summaries = {k: timing.summarize(timing.rates(tokens, seconds[k])) for k in systems}
    rows = {k: {"useful_gops": flops / tokens * summaries[k].median / 1e9, **agreement(logits["torch"], logits[k])}
                for k in systems}

    print(reporting.header(f"Generator prompt pass ({args.passages or 'SQuAD dev articles, 100-word chunks'})",
                           __file__, argv))
    print(f"generator {args.generator} ({resolve_checkpoint(args.generator)}); {len(lengths)} prompts per repeat "
          f"(tokens: {tokens}, mean {tokens / len(lengths):.0f}, min {min(lengths)}, max {max(lengths)}), batches of "
          f"{args.batch_size} longest first; {args.threads} threads; torch {torch.__version__}")
    print(f"ceiling, same run: fp32 sgemm {sgemm:.0f} GFLOP/s, ONNX Runtime int8 product {int8_peak:.0f} GOP/s; "
          f"useful work {flops / tokens / 1e6:.0f} MFLOP per prompt token")
    print(timing.protocol_line(args.repeat, list(systems)) + "\n")
    table = [base + [f"{r['useful_gops']:.0f}", f"{100 * r['useful_gops'] / sgemm:.0f}%",
                     f"{100 * r['useful_gops'] / int8_peak:.0f}%", f"{r['top1']:.3f}", f"{r['kl']:.2g}",
                     f"{r['max_abs_dlogit']:.3g}"]
             for base, r in zip(timing.comparison_rows(summaries, "torch", ".0f"), rows.values())]
    print(reporting.markdown_table(["system", "prompt tokens/s", "ratio vs torch fp32", "useful GOP/s", "% of sgemm",
                                 "% of int8 peak", "top-1 agreement", "KL(fp32 || q), nats", "max abs dlogit"], table))
    for k in systems:
        rows[k].update({"tokens_per_s": list(summaries[k].values), "median": summaries[k].median,
                        "ratio_vs_torch": timing.ratio(summaries[k], summaries["torch"]).median})
    result = {"cpu": reporting.cpu_name(), "generator": args.generator, "prompts": len(lengths), "tokens": tokens,
              "threads": args.threads, "repeat": args.repeat, "sgemm_gflops": sgemm, "int8_gops": int8_peak,
              "protocol": timing.protocol_line(args.repeat, list(systems)), "systems": rows}
    if args.out:
        reporting.write_json(Path(args.out), result)
    return result


if __name__ == "__main__":
    main()
