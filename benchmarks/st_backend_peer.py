"""sentence-transformers' own non-torch backends as a peer, run in another Python environment.

Its ONNX and OpenVINO backends need `optimum-onnx` or `optimum-intel`, which pin transformers
versions the project's environment does not have (sentence-transformers 6.2's `[onnx]` extra
cannot be installed at all: optimum-onnx 0.1.0 wants transformers < 4.58, it wants >= 5). So the
benchmark starts this file under the Python of a separate environment that has them
(`--st-python`) and times it from the parent, interleaved with the other systems:

    parent -> one JSON line {"items": [...]}      (passages as [title, text], or [question, text])
    child  -> one JSON line {"out": [...]}        (vectors, or probabilities) or {"error": "..."}

The child loads the model once at start (export included) and answers {"ready": true}. Only the
standard library and sentence-transformers are imported here: this file runs outside the project.
"""
from __future__ import annotations

import argparse
import json
import sys


def load(args):
    import torch

    torch.set_num_threads(args.threads)
    kwargs = {"backend": args.backend, "device": "cpu"}
    if args.backend == "openvino":  # the same threads and latency hint as our OpenVINO rows
        kwargs["model_kwargs"] = {"ov_config": {"INFERENCE_NUM_THREADS": args.threads, "PERFORMANCE_HINT": "LATENCY"}}
    if args.job == "encode":
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(args.folder, **kwargs)
        model.max_seq_length = args.max_length
        return lambda items: model.encode([tuple(x) for x in items], batch_size=args.batch_size,
                                          convert_to_numpy=True, show_progress_bar=False).tolist()
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(args.folder, max_length=args.max_length, **kwargs)
    return lambda items: model.predict([tuple(x) for x in items], batch_size=args.batch_size,
                                       show_progress_bar=False).tolist()


def serve(args, stdin=sys.stdin, stdout=sys.stdout) -> None:
    run = load(args)
    print(json.dumps({"ready": True}), file=stdout, flush=True)
    for line in stdin:
        try:
            reply = {"out": run(json.loads(line)["items"])}
        except Exception as exc:  # noqa: BLE001  (the parent reports it and drops the row)
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(reply), file=stdout, flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", choices=["encode", "score"], required=True)
    ap.add_argument("--folder", required=True)
    ap.add_argument("--backend", choices=["torch", "onnx", "openvino"], required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=256)
    serve(ap.parse_args(argv))


if __name__ == "__main__":
    main()
