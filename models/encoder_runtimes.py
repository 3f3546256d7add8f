"""ONNX Runtime or OpenVINO inference for a bi-encoder tower and the cross-encoder: ORT at fp32 or
int8, OpenVINO at fp32 or bf16.

A tower (transformer, pooling, projection, normalisation: exactly `encode_query` /
`encode_passage`) or the cross-encoder's logit is exported with `torch.onnx.export` (dynamic
batch and sequence axes), checked against torch at a batch size and length other than the traced
example, optionally quantised with `onnxruntime.quantization.quantize_dynamic`, and cached per
weights (models/runtime_cache.py). Sessions run on the CPU with torch's intra-op thread count, so
the project's one-thread-count rule (models/threads.py) holds for ORT too.

int8: QInt8 weights, per-channel scales, reduce_range (7-bit weights). ORT's dynamic int8 MatMul
multiplies u8 activations by s8 weights; on CPUs without VNNI (AVX2 only) the u8 x s8 pair sums
saturate int16 with 8-bit weights, and 7-bit weights avoid it. Per-channel scales keep the rows
with small weights from losing their precision to a few large ones.

OpenVINO compiles the same cached ONNX file for the CPU with an explicit precision hint (f32, or
bf16 where the CPU has bf16 units: its default there, made explicit so a version hashes what ran).
OpenVINO at bf16 is what `auto` runs for encoding and scoring on CPUs with bf16 units
(`resolve_encoder_runtime`; measured in docs/benchmarks.md, "CPU runtimes", by benchmarks/runtime_encoding.py).
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Literal, Mapping, Sequence, get_args

import numpy as np
import torch
from torch import nn

from .runtime_cache import cached_conversion

OPSET = 17
MODEL_FILE = "model.onnx"
#: what a config may name for encoding and scoring; planning resolves 'auto' (resolve_encoder_runtime)
EncoderRuntime = Literal["auto", "torch", "onnx", "openvino"]
_RUNTIMES = get_args(EncoderRuntime)[1:]


def onnx_available() -> bool:
    """True when onnxruntime (to run) and onnx (to export) import."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def import_openvino():
    """`import openvino` without the usage event its import sends: openvino.tools.ovc reports every
    import through a forked process unless the user opted out or CI is set, and a fork of a threaded
    `pforge run` can deadlock there on OpenSSL's locks and keep the run from exiting (seen once: an
    hour after its last stage). The project never sends it: consent is declined for this process
    (a consent file in ~/intel stays the user's own to write)."""
    try:
        from openvino_telemetry.utils.opt_in_checker import ConsentCheckResult, OptInChecker

        OptInChecker.check = lambda self, *args, **kwargs: ConsentCheckResult.DECLINED
    except ImportError:  # another telemetry layout (or none): nothing to decline
        pass
    import openvino

    return openvino


def openvino_available() -> bool:
    """True when OpenVINO (to run) and the ONNX exporter's packages import."""
    try:
        import_openvino()
    except ImportError:
        return False
    return onnx_available()


def resolve_encoder_runtime(runtime: str, device: str, bf16: bool = False) -> str:
    """`auto` made concrete at planning, so the resolved runtime is what a version hashes. Without
    bf16 units auto is torch: ONNX Runtime's fp32 gains little over it, its dynamic int8 scales a
    batch's activations by one value (a passage's vector then depends on its batch neighbours, and
    the ranking moves), and every model version would pay a one-off export and check. onnx runs when
    named. Where the CPU has bf16 units and bf16 was resolved on, auto is openvino at bf16 (faster
    than torch's bf16 autocast at the same cosine to fp32), torch bf16 where OpenVINO does not
    import. Measured in docs/benchmarks.md, "CPU runtimes" (benchmarks/runtime_encoding.py). A named
    runtime is checked, not changed."""
    from .cpu_features import has_bf16_units

    if runtime not in (*_RUNTIMES, "auto"):
        raise ValueError(f"runtime must be auto, torch, onnx or openvino, got {runtime!r}")
    on_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if runtime == "openvino":
        if on_cuda:
            raise ValueError(f"runtime openvino runs on the CPU; the device is {device!r}")
        if not openvino_available():
            raise ValueError("runtime openvino needs the openvino, onnx and onnxruntime packages "
                             "(pip install openvino onnx onnxruntime)")
        return "openvino"
    if runtime == "onnx":
        if on_cuda:
            raise ValueError(f"runtime onnx runs on the CPU; the device is {device!r}")
        if bf16:
            raise ValueError("bf16 autocast is a torch path; runtime onnx takes fp32 or int8")
        if not onnx_available():
            raise ValueError("runtime onnx needs the onnx and onnxruntime packages (pip install onnx onnxruntime)")
        return "onnx"
    if runtime == "torch":
        return "torch"
    return "openvino" if bf16 and not on_cuda and has_bf16_units() and openvino_available() else "torch"


def converter_versions() -> dict:
    import onnx
    import onnxruntime

    return {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__, "torch": torch.__version__.split("+")[0],
            "opset": OPSET}


def weights_digest(module: nn.Module, extra: dict) -> str:
    """sha256 of a module's state (names, dtypes, shapes, bytes) and `extra` (its configuration):
    what a conversion is keyed on when the module lives only in memory."""
    digest = hashlib.sha256(json.dumps(extra, sort_keys=True, default=str).encode())
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\n".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def cached_export(module: nn.Module, extra: dict, kind: str, int8: bool, export: Callable[[Path], None]) -> Path:
    """The cached ONNX file of `module` (fp32, or int8 quantised from the cached fp32 one)."""
    settings = {**converter_versions(), "precision": "fp32"}
    with tempfile.TemporaryDirectory(prefix="pforge-weights-") as tmp:
        # cached_conversion keys on a folder: one file naming the in-memory weights stands for it
        source = Path(tmp)
        (source / "weights.sha256").write_text(weights_digest(module, extra) + "\n")
        fp32 = cached_conversion(source, kind, settings, export)
        if not int8:
            return fp32 / MODEL_FILE
        int8_settings = {**settings, "precision": "int8", **INT8_SETTINGS}
        return cached_conversion(source, kind, int8_settings,
                                 lambda out: quantize_int8(fp32 / MODEL_FILE, out / MODEL_FILE)) / MODEL_FILE


INT8_SETTINGS = {"weight_type": "QInt8", "per_channel": True, "reduce_range": True}


def quantize_int8(source: Path, target: Path, nodes_to_exclude: Sequence[str] = ()) -> None:
    """ORT's dynamic int8 with INT8_SETTINGS; the nodes named in `nodes_to_exclude` stay fp32
    (benchmarks/generator_prefill.py keeps a decoder's down projections so)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8,
                     per_channel=INT8_SETTINGS["per_channel"], reduce_range=INT8_SETTINGS["reduce_range"],
                     nodes_to_exclude=list(nodes_to_exclude))


def new_session(path: Path, threads: int | None = None):
    """An ORT CPU session with every graph optimisation and torch's intra-op thread count."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # ORT's warnings about unused initializers are noise here
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class _OpenVinoSession:
    """An ONNX file compiled by OpenVINO for the CPU, behind the two calls the models below make of
    an ORT session (`get_inputs`, `run`). A request per call: threads may score with it at once."""

    def __init__(self, path: Path, threads: int, bf16: bool) -> None:
        ov = import_openvino()
        config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
                  "INFERENCE_PRECISION_HINT": "bf16" if bf16 else "f32"}
        self.compiled = ov.Core().compile_model(str(path), "CPU", config)
        self._inputs = [SimpleNamespace(name=port.get_any_name()) for port in self.compiled.inputs]

    def get_inputs(self) -> list:
        return self._inputs

    def run(self, _output_names, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        result = self.compiled.create_infer_request().infer(dict(feeds))
        return [np.array(result[self.compiled.output(0)], dtype=np.float32)]


def _eager(module: nn.Module) -> nn.Module:
    """A float32 eval-mode copy of `module` whose transformers use eager attention: the plainest
    attention graph to trace (sdpa traced correctly here too once in eval mode; every export is
    checked at another shape either way)."""
    module = copy.deepcopy(module).cpu().float().eval()
    for sub in module.modules():
        if hasattr(sub, "set_attn_implementation") and hasattr(sub, "config"):
            sub.set_attn_implementation("eager")
    return module


def _example(input_names: Sequence[str], batch: int, length: int, vocab: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, max(vocab, 6), (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[0, length // 2:] = 0  # a padded row: the mask path must be traced generically
    out = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros(batch, length, dtype=torch.long)}
    out["token_type_ids"][:, length // 3:] = 1
    return {k: out[k] for k in input_names}


def export_checked(graph: nn.Module, input_names: Sequence[str], output_name: str, vocab: int, target: Path) -> None:
    """`graph(*inputs)` exported to `target` with dynamic batch/sequence axes, then run by ORT at
    another shape than the traced one and compared with torch (AssertionError when off)."""
    # eval() on the wrapper itself: export restores the wrapper's mode on every submodule after
    # tracing, and a fresh wrapper is in training mode, so the torch side of the check would run
    # with dropout on (a "1.8 difference" that is not the export's fault)
    graph = graph.eval()
    example = _example(input_names, 2, 11, vocab, 0)
    axes = {name: {0: "batch", 1: "sequence"} for name in input_names}
    axes[output_name] = {0: "batch"}
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        if os.environ.get("PFORGE_DEBUG") != "1":
            # shape-dependent Python branches in the model's code; the check below runs another shape
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(graph, tuple(example[k] for k in input_names), str(target), input_names=list(input_names),
                          output_names=[output_name], dynamic_axes=axes, opset_version=OPSET, dynamo=False)
        check = _example(input_names, 3, 17, vocab, 1)
        expected = graph(*(check[k] for k in input_names)).numpy()
    session = new_session(target)
    got = session.run(None, {i.name: check[i.name].numpy() for i in session.get_inputs()})[0]
    # float32 rounding, accumulated over a few layers: relative to the outputs' size
    tolerance = 1e-4 * max(1.0, float(np.abs(expected).max()))
    diff = float(np.abs(got - expected).max())
    if not diff <= tolerance:
        raise AssertionError(f"ONNX export differs from torch by {diff:.3g} (> {tolerance:.3g}) at shape {check['input_ids'].shape}")


def _feeds(session, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inputs the graph kept (the exporter drops unused ones); token types the batch lacks are
    zeros, as the torch model defaults them."""
    feeds = {}
    for node in session.get_inputs():
        if node.name in arrays:
            feeds[node.name] = arrays[node.name]
        elif node.name == "token_type_ids":
            feeds[node.name] = np.zeros_like(arrays["input_ids"])
        else:
            raise ValueError(f"the ONNX graph needs {node.name!r}, which the batch lacks")
    return feeds


def _check_precision(runtime: str, int8: bool) -> None:
    if int8 and runtime != "onnx":
        raise ValueError(f"int8 weights are ONNX Runtime's dynamic int8 here; runtime {runtime} runs fp32 or bf16")


# ------------------------------------------------------------------ bi-encoder towers
class _Tower(nn.Module):
    """One side of a BiEncoder as positional inputs -> (batch, dim) embeddings."""

    def __init__(self, model, side: str, input_names: Sequence[str]) -> None:
        super().__init__()
        self.model, self.side, self.input_names = model, side, tuple(input_names)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        batch = dict(zip(self.input_names, inputs))
        return self.model.encode_passage(batch) if self.side == "passage" else self.model.encode_query(batch)


def _input_names(encoder: nn.Module) -> tuple[str, ...]:
    """The graph's inputs: token types too where the backbone has them (BERT; missing ones are fed
    as zeros, as the torch model defaults them)."""
    with_types = getattr(encoder.config, "type_vocab_size", 0) >= 1
    return ("input_ids", "attention_mask", "token_type_ids") if with_types else ("input_ids", "attention_mask")


class _CpuSessions:
    """What the ORT and OpenVINO models share: one session per (graph, torch thread count), so a
    pinned thread count gets a session of its own, and the torch model's `eval()` / `to(device)`,
    CPU only. `runtime` is onnx (ONNX Runtime) or openvino, `bf16` OpenVINO's precision hint."""
    KIND = "ONNX Runtime model"

    def __init__(self, runtime: str = "onnx", bf16: bool = False) -> None:
        if runtime not in ("onnx", "openvino"):
            raise ValueError(f"an exported model runs on onnx or openvino, not {runtime!r}")
        if bf16 and runtime != "openvino":
            raise ValueError("bf16 is OpenVINO's precision here; ONNX Runtime runs fp32 or int8")
        self.runtime, self.bf16 = runtime, bf16
        self._sessions: dict[tuple[Path, int], object] = {}

    def _session_for(self, path: Path):
        key = (Path(path), torch.get_num_threads())
        if key not in self._sessions:
            self._sessions[key] = (_OpenVinoSession(path, key[1], self.bf16) if self.runtime == "openvino"
                                   else new_session(path, key[1]))
        return self._sessions[key]

    def eval(self):
        return self

    def to(self, device):
        if str(device) != "cpu":
            raise ValueError(f"an {self.KIND} runs on the CPU, not {device!r}")
        return self


class OnnxBiEncoder(_CpuSessions):
    """`encode_query` / `encode_passage` of a BiEncoder through ORT (one graph per tower: the
    same file for both sides of a shared tower). Takes and returns torch tensors, so
    tasks/compute/batch_encode.py's batching drives it as it drives the torch model."""
    KIND = "ONNX Runtime encoder"

    def __init__(self, paths: dict[str, Path], input_names: Sequence[str], tokenizer, int8: bool,
                 runtime: str = "onnx", bf16: bool = False) -> None:
        super().__init__(runtime, bf16)
        self.paths, self.input_names, self.tokenizer, self.int8 = paths, tuple(input_names), tokenizer, int8

    @classmethod
    def from_model(cls, model, int8: bool = False, runtime: str = "onnx", bf16: bool = False) -> "OnnxBiEncoder":
        from dataclasses import asdict

        _check_precision(runtime, int8)
        names = _input_names(model.query_encoder)
        vocab = int(model.query_encoder.config.vocab_size)
        sides = ("query",) if model.config.shared else ("query", "passage")
        paths = {}
        for side in sides:
            extra = {"bi_encoder": asdict(model.config), "side": side, "inputs": names,
                     "backbone": model.query_encoder.config.to_dict()}

            def export(out: Path, side=side) -> None:
                export_checked(_Tower(_eager(model), side, names), names, "embedding", vocab, out / MODEL_FILE)

            paths[side] = cached_export(model, extra, "onnx_bi_encoder", int8, export)
        paths.setdefault("passage", paths["query"])
        return cls(paths, names, model.tokenizer, int8, runtime, bf16)

    def _run(self, side: str, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        session = self._session_for(self.paths[side])
        feeds = {k: batch[k].cpu().numpy().astype(np.int64, copy=False) for k in self.input_names if k in batch}
        return torch.from_numpy(session.run(None, _feeds(session, feeds))[0])

    def encode_query(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self._run("query", batch)

    def encode_passage(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self._run("passage", batch)


# ------------------------------------------------------------------ cross-encoder
class _Logit(nn.Module):
    def __init__(self, model, input_names: Sequence[str]) -> None:
        super().__init__()
        self.model, self.input_names = model, tuple(input_names)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(dict(zip(self.input_names, inputs)))


class OnnxCrossEncoder(_CpuSessions):
    """`logits` / `score` of a CrossEncoderModel through ORT, with its batching (one
    tokenisation, batches longest first) and its call signature."""
    KIND = "ONNX Runtime cross-encoder"

    def __init__(self, path: Path, input_names: Sequence[str], tokenizer, max_length: int, int8: bool,
                 runtime: str = "onnx", bf16: bool = False) -> None:
        super().__init__(runtime, bf16)
        self.path, self.input_names, self.tokenizer, self.max_length, self.int8 = \
            path, tuple(input_names), tokenizer, max_length, int8

    @classmethod
    def from_model(cls, model, int8: bool = False, runtime: str = "onnx", bf16: bool = False) -> "OnnxCrossEncoder":
        _check_precision(runtime, int8)
        names = _input_names(model.backbone)
        vocab = int(model.backbone.config.vocab_size)
        extra = {"cross_encoder": model.backbone.config.to_dict(), "inputs": names}

        def export(out: Path) -> None:
            export_checked(_Logit(_eager(model), names), names, "logit", vocab, out / MODEL_FILE)

        path = cached_export(model, extra, "onnx_cross_encoder", int8, export)
        return cls(path, names, model.tokenizer, model.max_length, int8, runtime, bf16)

    def tokenize(self, pairs):
        return self.tokenizer([q for q, _ in pairs], [p for _, p in pairs], truncation="longest_first",
                              max_length=self.max_length, padding=False)

    def logits(self, pairs: Sequence[tuple[str, str]], batch_size: int = 64, device=None, bf16: bool = False,
               progress: Callable[[int, int], None] | None = None) -> np.ndarray:
        if device is not None:
            self.to(device)  # refuses anything but the CPU
        if bf16:  # OpenVINO's bf16 is its precision hint (self.bf16), set when it was loaded
            raise ValueError("bf16 autocast is a torch path; an exported cross-encoder takes its precision when loaded")
        if not len(pairs):
            return np.zeros(0, dtype=np.float32)
        session = self._session_for(self.path)
        encoded = self.tokenize(pairs)
        order = np.argsort(-np.array([len(ids) for ids in encoded["input_ids"]]), kind="stable")
        keys = [k for k in encoded.keys() if k in self.input_names]
        out = np.empty(len(pairs), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            rows = order[start:start + batch_size]
            batch = self.tokenizer.pad({k: [encoded[k][i] for i in rows] for k in keys}, padding="longest",
                                       return_tensors="np")
            feeds = {k: np.asarray(batch[k], dtype=np.int64) for k in keys}
            out[rows] = session.run(None, _feeds(session, feeds))[0].reshape(-1)
            if progress is not None:
                progress(min(start + batch_size, len(order)), len(order))
        return out

    def score(self, pairs, batch_size: int = 64, device=None, bf16: bool = False, progress=None) -> np.ndarray:
        from .cross_encoder import sigmoid

        return sigmoid(self.logits(pairs, batch_size, device, bf16, progress))
