"""Inference runtimes on the CPU (models/encoder_runtimes.py): encoding and cross-encoder scoring,
ours through torch and ONNX Runtime (fp32, int8) vs sentence-transformers, same run, interleaved.

    HF_HUB_OFFLINE=1 python benchmarks/runtime_encoding.py [--job encode|score|both] [--limit 24] \
        [--pairs 24] [--batch-size 32] [--max-length 256] [--threads 2] [--repeat 5] [--out r.json]

Encoding (all-MiniLM-L6-v2 as `BiEncoder(pooling='mean', normalize=True)`, which is what its
sentence-transformers folder computes), passages = the first --limit SQuAD dev paragraphs of the
embedded default's data ((title, text) pairs, as the encode stage feeds them), or with --passages
--limit passages drawn (seeded) from a passages artifact: the 100-word chunks a run encodes:
  st        `SentenceTransformer(folder).encode`, torch fp32 (the named peer)
  torch     ours, torch fp32 (the reference of the agreement columns)
  onnx      ours, ONNX Runtime fp32 (runtime: onnx)
  onnx-int8 ours, ONNX Runtime, dynamic int8 weights (runtime: onnx, int8: true)
  torch-bf16 ours, torch under bf16 autocast (dense.encode.bf16), with --bf16 on, or by default
            where the CPU has bf16 units (AMX or avx512_bf16); emulated elsewhere, and slow
  st-onnx   `SentenceTransformer(folder, backend="onnx")`, when it loads: it needs optimum-onnx,
            which cannot be installed beside sentence-transformers 6.2 (the row says so).
  st-BACKEND  with --st-python PYTHON --st-backends openvino[,onnx]: sentence-transformers' own
            backend run by benchmarks/st_backend_peer.py under that environment's Python (its
            optimum packages conflict with the project's transformers), timed from here with the
            rest; the same for `CrossEncoder` in the scoring table.
  openvino  ours, OpenVINO at fp32 (runtime: openvino; precision hint f32); openvino-bf16: at bf16
            (bf16: true; the hint bf16, what `auto` runs where the CPU has bf16 units), with
            torch-bf16; openvino-int8: our ONNX export quantised by NNCF (static int8,
            transformer preset, calibrated on the 64 paragraphs after the timed ones), when `nncf`
            imports. Neither is a project dependency: they show what the next runtime would give.
Scoring (the cross-encoder: MiniLM with a seeded one-logit head, saved as the cross_encoder
stage saves it, or a trained one with --cross-encoder ROOT/cross_encoder/VERSION/model), pairs =
the first 4 questions, each with the first --pairs/4 paragraphs:
  st        `CrossEncoder(folder).predict`, torch fp32 (the peer)
  torch     ours, `CrossEncoderModel.score`, torch fp32
  onnx      ours, ONNX Runtime fp32;  onnx-int8: ONNX Runtime int8;  torch-bf16, openvino and
            openvino-bf16 as above
With --auc-questions N (untimed, after the timing): the first N SQuAD questions, each with its own
paragraph (label 1) and up to 7 other paragraphs of its article (label 0), scored by every system
but the external peers; each one's AUC and its difference to ours torch fp32 (the issue's bar:
within 0.005). Meaningful with a trained --cross-encoder; --auc-held-out leaves out the articles
it trained on.
Timing (benchmarks/timing.py): one untimed warm-up call each (the ONNX export and int8
quantisation happen before it, cached as in the pipeline), then --repeat rounds, every system
once per round, alternated; end to end (strings in, numpy out, tokenisation included).
Reported: items/s median (min-max), ratio of medians vs `st` with its range; agreement with our
torch fp32: mean / min cosine of vectors (encode), max / mean |p - p_fp32| (score); and the
ceiling (benchmarks/roofline.py): the encoder's useful GFLOP/s at each median (matrix products over
the unpadded token counts of our tokenisation) as a share of this CPU's fp32 sgemm, measured in
the same run beside ONNX Runtime's int8 matrix product. A system at share f of sgemm can gain at
most (int8 peak / sgemm) / f from int8 matrix products, which bounds any runtime's speed-up here.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from _bootstrap import DEFAULT_SQUAD  # noqa: E402  (puts the project on sys.path)
import reporting  # noqa: E402
import timing  # noqa: E402
import roofline  # noqa: E402
from _shared import squad_articles, st_peer  # noqa: E402
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from models.cpu_features import has_bf16_units  # noqa: E402


def squad(path: Path, limit: int):
    """((title, text) pairs, questions) of the first `limit` paragraphs."""
    passages, questions = [], []
    for article in squad_articles(path):
        for para in article.paragraphs:
            if len(passages) == limit:
                return passages, questions
            passages.append((article.title, para.context))
            questions += [q["question"] for q in para.questions[:1]]
    return passages, questions


ONNX_PEER_NOTE = ("needs optimum-onnx, whose one release (0.1.0) wants transformers < 4.58 while sentence-transformers "
                  "6.2 wants >= 5: not installable beside it, skipped")


def corpus_passages(path: str, limit: int, seed: int = 0) -> list[tuple[str, str]]:
    """(title, text) of `limit` passages drawn at random (seeded) from a passages artifact's Parquet
    files (a file, or a folder searched recursively): the chunked corpus the encode stage reads."""
    import pyarrow.parquet as pq

    root = Path(path)
    if not root.exists():
        raise SystemExit(f"{path}: no such file or folder")
    files = sorted(root.rglob("*.parquet")) if root.is_dir() else [root]
    if not files:
        raise SystemExit(f"{path}: no Parquet files")
    table = pq.ParquetDataset(files).read(columns=["title", "text"])
    if table.num_rows < limit:
        raise SystemExit(f"{path}: {table.num_rows} passages, fewer than --limit {limit}")
    rows = np.random.default_rng(seed).choice(table.num_rows, size=limit, replace=False)
    titles, texts = table.column("title").to_pylist(), table.column("text").to_pylist()
    return [(titles[i], texts[i]) for i in sorted(rows)]


def benchmark_passages(args, extra: int = 0) -> list[tuple[str, str]]:
    """The timed passages (then `extra` more): --passages' corpus when given, else SQuAD paragraphs."""
    if args.passages:
        return corpus_passages(args.passages, args.limit + extra)
    return squad(Path(args.squad), args.limit + extra)[0]


def st_onnx_peer(folder: str):
    """sentence-transformers' own ONNX backend, or the reason it cannot run here."""
    try:
        import optimum  # noqa: F401
    except ImportError:
        return None, ONNX_PEER_NOTE
    try:
        return st_peer(folder, backend="onnx"), None
    except Exception as exc:  # noqa: BLE001  (an optional peer: say why, keep the run)
        return None, f"did not load: {exc}"


class ExternalPeer:
    """benchmarks/st_backend_peer.py under another Python: items in, a numpy array out."""

    def __init__(self, python: str, job: str, folder, backend: str, args) -> None:
        script = Path(__file__).with_name("st_backend_peer.py")
        self.name = f"st-{backend}"
        self.proc = subprocess.Popen(
            [python, str(script), "--job", job, "--folder", str(folder), "--backend", backend,
             "--threads", str(torch.get_num_threads()), "--batch-size", str(args.batch_size),
             "--max-length", str(args.max_length)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline()
        if not ready.strip():
            raise RuntimeError(f"{self.name} under {python} exited before it was ready (its stderr is above)")

    def __call__(self, items):
        self.proc.stdin.write(json.dumps({"items": [list(x) for x in items]}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} exited mid-run (its stderr is above)")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"{self.name}: {reply['error']}")
        return np.asarray(reply["out"], dtype=np.float32)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def external_peers(args, job: str, folder) -> dict:
    """{name: ExternalPeer} for --st-backends under --st-python; a backend that fails to load is reported and skipped."""
    peers = {}
    for backend in filter(None, (args.st_backends or "").split(",")):
        try:
            peer = ExternalPeer(args.st_python, job, folder, backend, args)
        except (OSError, RuntimeError) as exc:
            print(f"{job}: st-{backend} skipped: {exc}", file=sys.stderr)
            continue
        peers[peer.name] = peer
    return peers


class _CompiledTower:
    """An OpenVINO compiled tower in the shape tasks/compute/batch_encode.py drives (torch in and out)."""

    def __init__(self, compiled, input_names, tokenizer):
        self.request, self.input_names, self.tokenizer = compiled.create_infer_request(), input_names, tokenizer

    def _run(self, batch):
        feeds = {k: batch[k].numpy().astype(np.int64) for k in self.input_names if k in batch}
        return torch.from_numpy(np.array(self.request.infer(feeds)[0]))

    encode_query = encode_passage = _run

    def eval(self):
        return self

    def to(self, device):
        return self


def openvino_encoders(model, onnx_encoder, calibration, max_length: int, bf16: bool) -> dict:
    """{'openvino': ours at fp32[, 'openvino-bf16'][, 'openvino-int8': NNCF static int8 of the ONNX
    export]}, where they import."""
    from models.encoder_runtimes import openvino_available
    from tasks.compute.bi_encoder import for_inference

    if not openvino_available():
        return {}
    out = {"openvino": for_inference(model, "cpu", runtime="openvino")}
    if bf16:
        out["openvino-bf16"] = for_inference(model, "cpu", runtime="openvino", bf16=True)
    try:
        import nncf
        import openvino as ov
    except ImportError:
        return out
    core, path = ov.Core(), onnx_encoder.paths["passage"]
    config = {"INFERENCE_NUM_THREADS": torch.get_num_threads(), "PERFORMANCE_HINT": "LATENCY",
              "INFERENCE_PRECISION_HINT": "f32"}  # NNCF's int8 products; the rest f32, as labelled
    graph = core.read_model(str(path))
    names, tok = onnx_encoder.input_names, onnx_encoder.tokenizer
    batches = []
    for start in range(0, len(calibration), 8):
        chunk = calibration[start:start + 8]
        enc = tok([t for t, _ in chunk], [x for _, x in chunk], truncation="only_second", max_length=max_length,
                  padding=True, return_tensors="np")
        batches.append({k: enc[k].astype(np.int64) for k in names if k in enc})
    quantised = nncf.quantize(graph, nncf.Dataset(batches), model_type=nncf.ModelType.TRANSFORMER,
                              subset_size=len(batches))
    out["openvino-int8"] = _CompiledTower(core.compile_model(quantised, "CPU", config), names, tok)
    return out


def flops_per_item(folder, firsts, seconds, max_length: int, truncation: str) -> float:
    """Mean useful FLOPs of one (first, second) input through the encoder saved in `folder`."""
    from transformers import AutoConfig, AutoTokenizer

    config, tok = AutoConfig.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    lengths = [len(ids) for ids in tok(list(firsts), list(seconds), truncation=truncation,
                                          max_length=max_length)["input_ids"]]
    total = roofline.encoder_flops(config.hidden_size, config.intermediate_size, config.num_hidden_layers, lengths)
    return total / len(lengths)


def with_ceiling(rows: list[list[str]], rates: dict, flops: float, sgemm: float) -> list[list[str]]:
    """The rows with each system's useful GFLOP/s and its share of the CPU's fp32 sgemm."""
    return [row + [f"{rates[row[0]] * flops / 1e9:.1f}", f"{100 * rates[row[0]] * flops / 1e9 / sgemm:.0f}%"]
            for row in rows]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)


def bench_encode(args) -> dict:
    from models.checkpoints import resolve_checkpoint
    from tasks.compute.bi_encoder import encode_side, for_inference, load_bi_encoder

    folder = resolve_checkpoint("minilm")
    passages = benchmark_passages(args)
    model = load_bi_encoder({"base": "minilm", "shared": True, "pooling": "mean", "projection_dim": None,
                             "normalize": True, "scale": 1.0})
    torch_model = for_inference(model, "cpu")
    onnx_fp32 = for_inference(model, "cpu", runtime="onnx")
    onnx_int8 = for_inference(model, "cpu", int8=True, runtime="onnx")
    st = st_peer(folder, max_length=args.max_length)
    st_onnx, st_onnx_note = st_onnx_peer(folder)

    def ours(m, bf16=False):
        return lambda items: encode_side(m, items, "passage", batch_size=args.batch_size,
                                         passage_max_len=args.max_length, query_max_len=64, bf16=bf16)

    def peer(m):
        return lambda items: m.encode(items, batch_size=args.batch_size, convert_to_numpy=True,
                                      show_progress_bar=False, normalize_embeddings=False)

    systems = {"st": peer(st), "torch": ours(torch_model), "onnx": ours(onnx_fp32), "onnx-int8": ours(onnx_int8)}
    if args.bf16:
        systems["torch-bf16"] = ours(torch_model, bf16=True)
    if st_onnx is not None:
        systems["st-onnx"] = peer(st_onnx)
    peers = external_peers(args, "encode", folder)
    systems.update(peers)
    calibration = benchmark_passages(args, extra=64)
    for name, encoder in openvino_encoders(model, onnx_fp32, calibration[args.limit:], args.max_length,
                                           args.bf16).items():
        systems[name] = ours(encoder)
    for run in systems.values():
        run(passages[:8])
    seconds, last = timing.alternate({n: (lambda r, f=f: f(passages)) for n, f in systems.items()}, args.repeat)
    for peer in peers.values():
        peer.close()
    summaries = {n: timing.summarize(timing.rates(len(passages), s)) for n, s in seconds.items()}
    reference = np.asarray(last["torch"], dtype=np.float32)
    agreement = {}
    for name, vectors in last.items():
        cos = cosines(np.asarray(vectors, dtype=np.float32), reference)
        agreement[name] = {"mean_cosine": float(cos.mean()), "min_cosine": float(cos.min())}
    rows = [row + [f"{agreement[row[0]]['mean_cosine']:.6f}", f"{agreement[row[0]]['min_cosine']:.6f}"]
            for row in timing.comparison_rows(summaries, "st")]
    rates = {n: s.median for n, s in summaries.items()}
    flops = flops_per_item(folder, [t for t, _ in passages], [x for _, x in passages], args.max_length, "only_second")
    rows = with_ceiling(rows, rates, flops, args.sgemm)
    table = reporting.markdown_table(["system", "passages/s", "vs st torch fp32", "mean cos vs fp32", "min cos",
                                   "GFLOP/s", "of sgemm"], rows)
    return {"passages": len(passages), "table": table, "protocol": timing.protocol_line(args.repeat, list(systems)), "st_onnx": st_onnx_note or "ran", "rates": rates,
            "agreement": agreement, "gflop_per_item": flops / 1e9}


def auc_pairs(path: Path, questions: int, negatives: int = 7,
              skip_articles: frozenset[str] = frozenset()) -> tuple[list[tuple[str, str]], list[int]]:
    """(question, paragraph) pairs and labels: each of the first `questions` questions (one per
    paragraph) with its own paragraph and up to `negatives` other paragraphs of its article, the
    nearest ones after it first (same-article paragraphs: the hard negatives at hand). Articles
    whose title is in `skip_articles` are left out."""
    pairs, labels = [], []
    for article in squad_articles(path):
        if article.doc_id.partition(":")[2] in skip_articles:  # the title as the file spells it
            continue
        contexts = [para.context for para in article.paragraphs]
        for i, para in enumerate(article.paragraphs):
            if len(labels) and sum(labels) == questions:
                return pairs, labels
            if not para.questions:
                continue
            question = para.questions[0]["question"]
            others = [contexts[(i + k) % len(contexts)] for k in range(1, len(contexts))][:negatives]
            pairs += [(question, para.context)] + [(question, c) for c in others]
            labels += [1] + [0] * len(others)
    return pairs, labels


def trained_articles(questions: str | None) -> frozenset[str]:
    """The SQuAD article titles of a questions artifact's train split (doc_id 'squad:TITLE')."""
    if not questions:
        return frozenset()
    import pyarrow.dataset as ds

    table = ds.dataset(questions, format="parquet").to_table(columns=["doc_id", "split"])
    return frozenset(d.partition(":")[2] for d, split in zip(table.column("doc_id").to_pylist(),
                                                             table.column("split").to_pylist())
                     if split == "train" and d.startswith("squad:"))


def bench_score(args) -> dict:
    from sentence_transformers import CrossEncoder

    from models.cross_encoder import CrossEncoderModel
    from models.encoder_runtimes import OnnxCrossEncoder, openvino_available

    passages, questions = squad(Path(args.squad), max(args.pairs, 4))  # one question per paragraph
    if args.passages:  # the corpus's chunks instead, with the same questions
        passages = corpus_passages(args.passages, -(-args.pairs // 4))
    pairs = [(q, text) for q in questions[:4] for _, text in passages[:-(-args.pairs // 4)]][:args.pairs]
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="runtime-bench-ce-") as tmp:  # both load it into memory
        folder = Path(args.cross_encoder) if args.cross_encoder else \
            CrossEncoderModel.from_base("minilm", max_length=args.max_length).save_pretrained(Path(tmp))
        ours = CrossEncoderModel.from_pretrained(folder).eval()
        st = CrossEncoder(str(folder), device="cpu", max_length=args.max_length)
        flops = flops_per_item(folder, [q for q, _ in pairs], [x for _, x in pairs], args.max_length, "longest_first")
        peers = external_peers(args, "score", folder)  # they load the folder before it goes
    onnx_fp32 = OnnxCrossEncoder.from_model(ours)
    onnx_int8 = OnnxCrossEncoder.from_model(ours, int8=True)
    exported = {}
    if openvino_available():
        exported["openvino"] = OnnxCrossEncoder.from_model(ours, runtime="openvino")
        if args.bf16:
            exported["openvino-bf16"] = OnnxCrossEncoder.from_model(ours, runtime="openvino", bf16=True)

    def mine(m, bf16=False):
        return lambda items: m.score(items, batch_size=args.batch_size, bf16=bf16)

    systems = {"st": lambda items: np.asarray(st.predict(items, batch_size=args.batch_size, show_progress_bar=False)),
               "torch": mine(ours), "onnx": mine(onnx_fp32), "onnx-int8": mine(onnx_int8), **peers}
    if args.bf16:
        systems["torch-bf16"] = mine(ours, bf16=True)
    systems.update({name: mine(scorer) for name, scorer in exported.items()})
    for run in systems.values():
        run(pairs[:8])
    seconds, last = timing.alternate({n: (lambda r, f=f: f(pairs)) for n, f in systems.items()}, args.repeat)
    for peer in peers.values():
        peer.close()
    summaries = {n: timing.summarize(timing.rates(len(pairs), s)) for n, s in seconds.items()}
    reference = np.asarray(last["torch"], dtype=np.float64)
    agreement = {n: {"max_abs_p_diff": float(np.abs(np.asarray(p, np.float64) - reference).max()),
                     "mean_abs_p_diff": float(np.abs(np.asarray(p, np.float64) - reference).mean())}
                 for n, p in last.items()}
    rows = [row + [f"{agreement[row[0]]['max_abs_p_diff']:.2e}", f"{agreement[row[0]]['mean_abs_p_diff']:.2e}"]
            for row in timing.comparison_rows(summaries, "st")]
    rates = {n: s.median for n, s in summaries.items()}
    rows = with_ceiling(rows, rates, flops, args.sgemm)
    header = ["system", "pairs/s", "vs CrossEncoder.predict fp32", "max |dp| vs fp32", "mean |dp|", "GFLOP/s", "of sgemm"]
    aucs = {}
    if args.auc_questions:
        from tasks.silver.classifier import auc

        auc_items, labels = auc_pairs(Path(args.squad), args.auc_questions, skip_articles=trained_articles(args.auc_held_out))
        aucs = {n: auc(labels, f(auc_items)) for n, f in systems.items() if n not in peers}
        rows = [row + ([f"{aucs[row[0]]:.4f}", f"{aucs[row[0]] - aucs['torch']:+.4f}"] if row[0] in aucs else ["", ""])
                for row in rows]
        header += [f"AUC ({sum(labels)} q, {len(labels)} pairs)", "vs fp32"]
    table = reporting.markdown_table(header, rows)
    return {"pairs": len(pairs), "table": table, "auc": aucs, "cross_encoder": str(args.cross_encoder or "seeded head"), "protocol": timing.protocol_line(args.repeat, list(systems)), "rates": rates, "gflop_per_item": flops / 1e9,
            "agreement": agreement, "st_onnx": ONNX_PEER_NOTE}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", choices=["encode", "score", "both"], default="both")
    ap.add_argument("--squad", default=str(DEFAULT_SQUAD))
    ap.add_argument("--limit", type=int, default=24, help="passages encoded per repeat")
    ap.add_argument("--passages", default=None, help="a passages artifact's Parquet file or folder (e.g. "
                    "ROOT/passages/VERSION/data): draw the passages from that chunked corpus instead of SQuAD paragraphs")
    ap.add_argument("--pairs", type=int, default=24, help="pairs scored per repeat")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: torch's)")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--st-python", default=None, help="Python of an environment with sentence-transformers' "
                    "optimum backends (for --st-backends)")
    ap.add_argument("--st-backends", default=None, help="comma-separated: openvino, onnx (needs --st-python)")
    ap.add_argument("--cross-encoder", default=None, help="a trained one-logit cross-encoder folder (default: "
                    "MiniLM with a seeded head)")
    ap.add_argument("--auc-questions", type=int, default=0, help="AUC of every system on this many questions' "
                    "pairs (own paragraph vs 7 of its article), untimed")
    ap.add_argument("--auc-held-out", default=None, metavar="QUESTIONS", help="a questions artifact's table "
                    "(ROOT/questions/VERSION/data/questions): the AUC leaves out the SQuAD articles of its train "
                    "split, which the classifier trained on")
    ap.add_argument("--bf16", choices=["auto", "on", "off"], default="auto", help="add ours under torch's bf16 "
                    "autocast (torch-bf16); auto: where the CPU has bf16 units (models/cpu_features.py)")
    timing.add_repeat_argument(ap, what="rounds of every system")
    args = ap.parse_args(argv)
    args.bf16 = args.bf16 == "on" or (args.bf16 == "auto" and has_bf16_units())
    if args.st_backends and not args.st_python:
        ap.error("--st-backends needs --st-python (the Python of the environment that has them)")
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    args.sgemm, int8_peak = roofline.sgemm_gflops(threads), roofline.int8_gemm_gops(threads)
    cpu = reporting.cpu_name()
    header = (reporting.header("CPU runtimes: encoding and cross-encoder scoring", __file__, argv)
              + f"\n{threads} intra-op threads; batch {args.batch_size}, "
              f"max length {args.max_length}\nCeiling: torch fp32 sgemm {args.sgemm:.0f} GFLOP/s, ONNX Runtime int8 "
              f"MatMulInteger {int8_peak:.0f} GOP/s ({int8_peak / args.sgemm:.2f}x), 2048^3, best of 5")
    print(header)
    result = {"cpu": cpu, "threads": threads, "batch_size": args.batch_size,
              "max_length": args.max_length, "repeat": args.repeat, "passages": args.passages or "squad", "sgemm_gflops": args.sgemm,
              "int8_gemm_gops": int8_peak}
    if args.job in ("encode", "both"):
        result["encode"] = bench_encode(args)
        source = f"passages of {args.passages}" if args.passages else "SQuAD paragraphs"
        print(f"\nEncoding, {result['encode']['passages']} {source} (sentence-transformers onnx backend: "
              f"{result['encode']['st_onnx']})\n{result['encode']['protocol']}\n{result['encode']['table']}")
    if args.job in ("score", "both"):
        result["score"] = bench_score(args)
        source = f"passages of {args.passages}" if args.passages else "SQuAD paragraphs"
        print(f"\nCross-encoder scoring, {result['score']['pairs']} pairs, SQuAD questions x {source} "
              f"({result['score']['st_onnx']})\n"
              f"{result['score']['protocol']}\n{result['score']['table']}")
    if args.out:
        reporting.write_json(Path(args.out), result)
    return result


if __name__ == "__main__":
    main()
