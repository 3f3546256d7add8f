"""How the cross-attention classifier scores (question, passage) pairs, shared by every stage that
scores with it (silver labelling, rerank, the negatives' false-negative judge): the settings a
version hashes, the classifier loaded once per process for them, the job a scoring shard
carries, and the check of a faster path against torch fp32."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Mapping

from pydantic import BaseModel, ConfigDict

from models.encoder_runtimes import resolve_encoder_runtime
from tasks.compute.device import resolve_device
from tasks.runners import worker_cached


class ScoringSettings(BaseModel):
    """How the classifier scores (hashed by every stage that scores with it): the runtime,
    resolved at planning, and the precision."""
    model_config = ConfigDict(frozen=True, extra="forbid")
    runtime: Literal["torch", "onnx", "openvino"] = "torch"
    int8: bool = False
    bf16: bool = False   # bf16 on the CPU: torch's autocast or OpenVINO's hint (CUDA autocasts regardless, as before)
    ADDED: ClassVar[Mapping[str, Any]] = {"bf16": False}   # tasks.engine.without_added

    @classmethod
    def of(cls, config) -> "ScoringSettings":
        """The settings of the `cross_encoder` config section `config` (its device, runtime,
        int8 and bf16), resolved for this machine."""
        from models.cpu_features import bf16_wanted

        on_cuda = resolve_device(config.device).startswith("cuda")
        if config.int8 and on_cuda:
            raise ValueError(f"cross_encoder.int8 quantises for the CPU; the device is {config.device!r} (CUDA here)")
        if config.bf16 is True and (config.int8 or config.runtime == "onnx"):
            raise ValueError(f"cross_encoder.bf16 cannot go with {'int8' if config.int8 else 'runtime onnx'}")
        # resolved at planning, like the runtime: a version hashes the precision it was scored at
        bf16 = bf16_wanted(config.bf16, "cpu") \
            and not on_cuda and not config.int8 and config.runtime != "onnx"
        return cls(runtime=resolve_encoder_runtime(config.runtime, config.device, bf16), int8=config.int8, bf16=bf16)

    @property
    def precision(self) -> str:
        return "int8" if self.int8 else "bf16" if self.bf16 else "fp32"

    def device(self, configured: str) -> str:
        """Where pairs are scored: the CPU for every path but torch fp32 (onnx, int8, CPU bf16; a
        worker of a planned-on-CPU version may see a GPU), else the configured device resolved."""
        return "cpu" if self != ScoringSettings() else resolve_device(configured)

    def autocast_bf16(self, device: str) -> bool:
        """torch's bf16 autocast while scoring on `device`: on CUDA always (as before), on the CPU when
        resolved so (OpenVINO's bf16 is compiled in)."""
        return device == "cuda" or (self.bf16 and self.runtime == "torch")


def cross_encoder_on(folder: str, device: str, scoring: ScoringSettings | None = None):
    """The classifier of `folder` on `device` as `scoring` says (torch fp32 by default; int8; or
    ONNX Runtime or OpenVINO, CPU only), loaded once per process (shards of the silver and rerank stages
    share it). In eval mode: threads may score with it at once."""
    scoring = scoring or ScoringSettings()
    return worker_cached(("cross_encoder", folder, device, scoring.runtime, scoring.int8, scoring.bf16),
                         lambda: load_scorer(folder, device, scoring))


def load_scorer(folder: str, device: str, scoring: ScoringSettings):
    """A model with `logits` / `score` (CrossEncoderModel's signature) for `scoring`."""
    from models.cross_encoder import CrossEncoderModel

    model = CrossEncoderModel.from_pretrained(folder).eval()
    if scoring.runtime != "torch" or scoring.int8:
        if device != "cpu":
            raise ValueError(f"cross_encoder runtime {scoring.runtime} {scoring.precision} scores on the CPU; "
                             f"the device is {device!r}")
    if scoring.runtime != "torch":
        from models.encoder_runtimes import OnnxCrossEncoder

        return OnnxCrossEncoder.from_model(model, int8=scoring.int8, runtime=scoring.runtime, bf16=scoring.bf16)
    if scoring.int8:
        from models.quantization import quantize_dynamic_int8

        return quantize_dynamic_int8(model)
    return model.to(device)


SCORING_SAMPLE = 32  # pairs re-scored by torch fp32 to check a faster path (seconds)


def scoring_agreement(folder: str, scoring: ScoringSettings, pairs, p) -> dict:
    """For a scoring path other than torch fp32: max and mean |p - p_torch_fp32| over the first
    pairs scored ({} for torch fp32 itself)."""
    import numpy as np

    if scoring == ScoringSettings():
        return {}
    pairs, p = list(pairs)[:SCORING_SAMPLE], np.asarray(p, dtype=np.float64)[:SCORING_SAMPLE]
    if not pairs:
        return {}
    want = cross_encoder_on(folder, "cpu").score(pairs, batch_size=SCORING_SAMPLE, device="cpu").astype(np.float64)
    diff = np.abs(p - want)
    return {"reference": {"against": "torch fp32", "pairs": len(pairs), "max_abs_p_diff": round(float(diff.max()), 6),
                          "mean_abs_p_diff": round(float(diff.mean()), 6)}}


@dataclass(frozen=True)
class ScoreJob:
    """What every cross-encoder scoring shard shares (small and picklable: it travels to the
    runner's workers): silver labelling's and the judging of mined negatives'."""
    model: str          # the cross_encoder artifact's model folder
    device: str         # as configured: 'auto' resolves on the worker
    batch_size: int
    n_shards: int
    label: str = "silver"
    scoring: ScoringSettings = ScoringSettings()
