"""Loading a bi-encoder for a dense system, and encoding one side (questions or passages) with
the pipeline's settings. Plain functions: every stage that encodes shares them (train, encode,
search, mining, silver), so the dev metric encodes exactly as the encode stage does."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Sequence

logger = logging.getLogger("passage_forge")


def load_bi_encoder(model: dict, folder: Path | None = None):
    """A saved bi-encoder (`folder`, written by `BiEncoder.save_pretrained`: its own config wins),
    else a fresh one on `model['base']` with the configured towers, pooling and projection."""
    from models import BiEncoder
    from models.checkpoints import resolve_checkpoint

    if folder is not None:
        return BiEncoder.from_pretrained(folder)
    return BiEncoder.from_pretrained(resolve_checkpoint(model["base"]), shared=model["shared"], pooling=model["pooling"],
                                     projection_dim=model["projection_dim"], normalize=model["normalize"], scale=model["scale"])


def for_inference(model, device: str, int8: bool = False, runtime: str = "torch", bf16: bool = False):
    """The model on `device`, in eval mode, int8-quantised when asked (CPU only); with runtime
    'onnx' or 'openvino', its towers exported to ONNX (cached per weights) and run by ONNX Runtime
    (fp32 or int8) or OpenVINO (fp32, or bf16 with `bf16`), CPU only, with encode_query /
    encode_passage / tokenizer as the torch model has them. torch's bf16 is autocast at call time."""
    if int8 and device != "cpu":
        raise ValueError(f"dense.encode.int8 quantises for the CPU; the device is {device!r}")
    if runtime in ("onnx", "openvino"):
        if device != "cpu":
            raise ValueError(f"dense.encode.runtime {runtime} runs on the CPU; the device is {device!r}")
        from models.encoder_runtimes import OnnxBiEncoder

        return OnnxBiEncoder.from_model(model.cpu().eval(), int8=int8, runtime=runtime,
                                        bf16=bf16 and runtime == "openvino")
    if runtime != "torch":
        raise ValueError(f"runtime must be torch, onnx or openvino, got {runtime!r}")
    model.to(device).eval()
    if int8:
        from models.quantization import quantize_dynamic_int8

        return quantize_dynamic_int8(model)
    return model


def encode_side(model, texts: Sequence, side: str, *, batch_size: int, passage_max_len: int, query_max_len: int,
                dtype: str = "float32", bf16: bool = False, device: str = "cpu",
                done: int = 0, total: int | None = None, log: Callable[[str], None] | None = None):
    """Vectors of `texts` (questions, or (title, text) passages) with `model.encode_query` or
    `encode_passage`; with `log`, a line about every 10% of `total` (`done` encoded before)."""
    import torch

    from tasks.compute.batch_encode import encode_texts

    encode_fn = model.encode_passage if side == "passage" else model.encode_query
    total = total or len(texts)
    step = max(total // 10, 1)

    def progress(finished, _n):
        overall = done + finished
        if log is not None and (overall % step < batch_size or overall == total):
            log(f"encode {'queries' if side == 'query' else side + 's'}: {overall:,}/{total:,}")

    with torch.inference_mode():
        return encode_texts(texts, model.tokenizer, encode_fn, batch_size=batch_size,
                            max_length=passage_max_len if side == "passage" else query_max_len,
                            device=device, dtype=dtype, autocast_bf16=bf16, progress=progress)
