"""How close an encoder's throughput is to what this CPU's matrix kernels can do.

A runtime comparison says how much faster one path is than another; it does not say how much
faster any path could be. This module gives the two numbers that bound it: the useful FLOPs of a
BERT-style encoder over the actual (unpadded) token counts, and the measured throughput of the
CPU's large matrix products in fp32 (torch's sgemm) and int8 (ONNX Runtime's u8 x s8
MatMulInteger, the kernel its dynamic int8 models use). An encoder at a fraction f of fp32 sgemm
can be at most (int8 peak / sgemm peak) / f times faster with int8 matrix products alone.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence


def encoder_flops(hidden: int, intermediate: int, layers: int, lengths: Sequence[int]) -> float:
    """Forward FLOPs (2 per multiply-add) of a BERT-style encoder's matrix products over sequences
    of these token counts, each attending only to itself: per layer and token, the four
    hidden x hidden projections and the two feed-forward products, 2 (4h^2 + 2hi); per layer
    and sequence of t tokens, the scores and the weighted sum, 2 * 2 t^2 h. Element-wise work
    (softmax, layer norm, GELU) is left out: it is not what int8 speeds up."""
    dense = 2 * (4 * hidden * hidden + 2 * hidden * intermediate)
    return float(sum(layers * (dense * t + 4 * t * t * hidden) for t in lengths))


def decoder_prefill_flops(hidden: int, intermediate: int, layers: int, kv_dim: int, vocab: int,
                          lengths: Sequence[int]) -> float:
    """Forward FLOPs (2 per multiply-add) of a Llama-style decoder's prompt pass over prompts of
    these token counts, each alone, with the logits of its last token only: per layer and token,
    the query and output projections 2 * 2h^2, the key and value ones 2 * 2h * kv_dim (grouped-query
    attention), the gated feed-forward 2 * 3hi; per layer and prompt of t tokens, the causal
    scores and weighted sum 2 * 2 t^2 h as computed (full t x t, masked); per prompt, the
    vocabulary projection 2hV. Element-wise work (norms, rotary, SiLU, softmax) is left out."""
    dense = 2 * (2 * hidden * hidden + 2 * hidden * kv_dim + 3 * hidden * intermediate)
    return float(sum(layers * (dense * t + 4 * t * t * hidden) + 2 * hidden * vocab for t in lengths))


def _best_seconds(run: Callable[[], object], repeat: int) -> float:
    run()  # warm-up: first-call allocation and kernel selection
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def sgemm_gflops(threads: int, n: int = 2048, repeat: int = 5) -> float:
    """torch fp32 n x n x n matrix product with `threads` threads (the caller's count is kept),
    best of `repeat`, in GFLOP/s."""
    import torch

    from models.threads import pinned_threads

    a, b = torch.randn(n, n), torch.randn(n, n)
    with pinned_threads(threads):
        return 2 * n ** 3 / _best_seconds(lambda: a @ b, repeat) / 1e9


def int8_gemm_gops(threads: int, n: int = 2048, repeat: int = 5) -> float:
    """ONNX Runtime's MatMulInteger (uint8 x int8 -> int32), n x n x n, best of `repeat`, in GOP/s."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["A", "B"], ["C"])], "int8_gemm",
        [helper.make_tensor_value_info("A", TensorProto.UINT8, [n, n]),
         helper.make_tensor_value_info("B", TensorProto.INT8, [n, n])],
        [helper.make_tensor_value_info("C", TensorProto.INT32, [n, n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {"A": rng.integers(0, 256, (n, n), dtype=np.uint8), "B": rng.integers(-128, 128, (n, n), dtype=np.int8)}
    return 2 * n ** 3 / _best_seconds(lambda: session.run(None, feeds), repeat) / 1e9
