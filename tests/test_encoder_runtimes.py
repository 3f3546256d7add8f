"""ONNX Runtime inference (models/encoder_runtimes.py): exports checked against torch, int8 close by
cosine, the conversion cache, `auto` resolution and the hashed runtime of encode and scoring."""
import numpy as np
import pytest
import torch

from models import BiEncoder
from models.cross_encoder import CrossEncoderModel
from models.encoder_runtimes import (OnnxBiEncoder, OnnxCrossEncoder, export_checked, onnx_available, openvino_available,
                                 resolve_encoder_runtime)
from tasks.compute.bi_encoder import encode_side, for_inference

pytestmark = pytest.mark.skipif(not onnx_available(), reason="onnx / onnxruntime not installed")

QUERIES = ["what is the capital of france", "who", "where does the seine flow through paris the city"]
PASSAGES = [("paris", "the capital of france is paris"), ("seine", "the seine is a river"),
            ("", "the largest city"), ("title", "the river flows through the city of paris where the seine is")]
# float32 rounding over a few layers, relative to the outputs' size
TOLERANCE = 1000 * float(np.finfo(np.float32).eps)


def _encode(model, texts, side):
    return encode_side(model, texts, side, batch_size=2, passage_max_len=32, query_max_len=16)


def _bi_encoder(checkpoint, **kw):
    torch.manual_seed(1)  # the projection's init
    return BiEncoder.from_pretrained(str(checkpoint), **kw).eval()


@pytest.mark.parametrize("kw", [dict(shared=True, pooling="mean", normalize=True),
                                dict(shared=False, pooling="cls", projection_dim=16, normalize=False)],
                         ids=["shared-mean", "two-towers-cls-projection"])
def test_onnx_towers_match_torch_and_int8_stays_close(checkpoint, kw):
    model = _bi_encoder(checkpoint, **kw)
    if not kw["shared"]:  # two towers that differ: a mixed-up graph would show
        with torch.no_grad():
            for p in model.passage_encoder.parameters():
                p.add_(0.05 * torch.randn_like(p))
    onnx = for_inference(model, "cpu", runtime="onnx")
    assert isinstance(onnx, OnnxBiEncoder)
    assert (onnx.paths["query"] == onnx.paths["passage"]) == kw["shared"]
    int8 = for_inference(model, "cpu", int8=True, runtime="onnx")
    for texts, side in ((QUERIES, "query"), (PASSAGES, "passage")):
        want = _encode(model, texts, side)
        got = _encode(onnx, texts, side)
        assert got.shape == want.shape == (len(texts), 16 if "projection_dim" in kw else 32)
        assert np.abs(got - want).max() <= TOLERANCE * max(1.0, np.abs(want).max())
        low = _encode(int8, texts, side)
        cos = (low * want).sum(1) / (np.linalg.norm(low, axis=1) * np.linalg.norm(want, axis=1))
        assert cos.min() > 0.99, cos
    if not kw["shared"]:  # each side ran its own tower
        assert np.abs(_encode(onnx, PASSAGES, "query") - _encode(onnx, PASSAGES, "passage")).max() > 1e-3


def test_cross_encoder_logits_match_torch_and_int8_probabilities_stay_close(checkpoint):
    torch.manual_seed(2)
    model = CrossEncoderModel.from_base(str(checkpoint), max_length=32).eval()
    pairs = [(q, p[1]) for q in QUERIES for p in PASSAGES]
    want = model.logits(pairs, batch_size=4)
    onnx = OnnxCrossEncoder.from_model(model)
    got = onnx.logits(pairs, batch_size=4)
    assert got.shape == want.shape == (len(pairs),)
    assert np.abs(got - want).max() <= TOLERANCE * max(1.0, np.abs(want).max())
    assert np.abs(OnnxCrossEncoder.from_model(model, int8=True).score(pairs) - model.score(pairs)).max() < 0.02
    with pytest.raises(ValueError, match="CPU"):
        onnx.logits(pairs, device="cuda")
    with pytest.raises(ValueError, match="cross-encoder runs on the CPU"):
        onnx.to("cuda")
    assert onnx.to("cpu").eval() is onnx and len(onnx._sessions) == 1
    threads = torch.get_num_threads()
    try:  # a pinned thread count gets a session of its own, and the same numbers
        torch.set_num_threads(1)
        np.testing.assert_allclose(onnx.logits(pairs, batch_size=4), got, atol=TOLERANCE * max(1.0, np.abs(want).max()))
    finally:
        torch.set_num_threads(threads)
    assert len(onnx._sessions) == (1 if threads == 1 else 2)


def test_conversions_are_cached_per_weights(checkpoint, monkeypatch):
    import models.encoder_runtimes as ort_module

    calls = []
    real = ort_module.export_checked
    monkeypatch.setattr(ort_module, "export_checked", lambda *a, **k: (calls.append(1), real(*a, **k)))
    model = _bi_encoder(checkpoint, pooling="mean", projection_dim=8)
    first = OnnxBiEncoder.from_model(model)
    again = OnnxBiEncoder.from_model(_bi_encoder(checkpoint, pooling="mean", projection_dim=8))  # same weights
    assert len(calls) == 1 and again.paths == first.paths
    OnnxBiEncoder.from_model(model, int8=True)  # quantised from the cached fp32 export: no new export
    assert len(calls) == 1
    with torch.no_grad():
        model.query_projection.bias.add_(1.0)
    changed = OnnxBiEncoder.from_model(model)
    assert len(calls) == 2 and changed.paths["query"] != first.paths["query"]


def test_an_export_that_only_holds_at_the_traced_shape_is_refused(tmp_path):
    class ShapeBaked(torch.nn.Module):  # python control flow on the length: traced as a constant
        def forward(self, input_ids, attention_mask):
            scale = 2.0 if input_ids.shape[1] > 12 else 1.0
            return (input_ids.float() * scale * attention_mask).sum(1, keepdim=True)

    with pytest.raises(AssertionError, match="differs from torch"):
        export_checked(ShapeBaked(), ("input_ids", "attention_mask"), "out", 50, tmp_path / "m.onnx")


@pytest.fixture
def bf16_units(monkeypatch):
    """Pins whether the CPU has bf16 units (models/cpu_features.py), whatever this machine has."""
    import models.cpu_features as cpu_features

    def pin(present: bool, openvino: bool = True):
        import models.encoder_runtimes as ort_module

        monkeypatch.setattr(cpu_features, "has_bf16_units", lambda: present)
        monkeypatch.setattr(ort_module, "openvino_available", lambda: openvino)
    return pin


def test_auto_resolves_per_device_and_precision(monkeypatch, bf16_units):
    import models.encoder_runtimes as ort_module

    bf16_units(False)
    assert resolve_encoder_runtime("auto", "cpu") == "torch"  # ORT at parity on the CPUs measured: no export to pay for
    assert resolve_encoder_runtime("onnx", "cpu") == "onnx"
    assert resolve_encoder_runtime("auto", "cuda") == "torch"
    assert resolve_encoder_runtime("auto", "cpu", bf16=True) == "torch"
    assert resolve_encoder_runtime("torch", "cpu") == "torch"
    with pytest.raises(ValueError, match="CPU"):
        resolve_encoder_runtime("onnx", "cuda")
    with pytest.raises(ValueError, match="bf16"):
        resolve_encoder_runtime("onnx", "cpu", bf16=True)
    bf16_units(True)  # bf16 units (AMX, avx512_bf16): OpenVINO at bf16, torch bf16 without OpenVINO, fp32 stays torch
    assert resolve_encoder_runtime("auto", "cpu", bf16=True) == "openvino"
    assert resolve_encoder_runtime("auto", "cpu", bf16=False) == "torch" and resolve_encoder_runtime("auto", "cuda", bf16=True) == "torch"
    assert resolve_encoder_runtime("torch", "cpu", bf16=True) == "torch" and resolve_encoder_runtime("openvino", "cpu") == "openvino"
    with pytest.raises(ValueError, match="CPU"):
        resolve_encoder_runtime("openvino", "cuda")
    bf16_units(True, openvino=False)
    assert resolve_encoder_runtime("auto", "cpu", bf16=True) == "torch"
    with pytest.raises(ValueError, match="openvino"):
        resolve_encoder_runtime("openvino", "cpu")
    monkeypatch.setattr(ort_module, "onnx_available", lambda: False)
    with pytest.raises(ValueError, match="onnxruntime"):
        resolve_encoder_runtime("onnx", "cpu")


def test_the_resolved_runtime_is_hashed_where_it_changes_outputs(bf16_units):
    from tasks.compute.encode import EncodeConfig, EncodeSettings
    from tasks.compute.origin import Origin
    from tasks.compute.score import ScoringSettings
    from tasks.dense.stages import EncodeParams
    from tasks.silver.config import CrossEncoderConfig
    from tasks.silver.stages import CrossEncoderParams

    def encode_hash(**kw):
        settings = EncodeSettings.of(EncodeConfig(**kw))
        return settings, EncodeParams(system="s", origin=Origin(model={}), settings=settings, device="cpu",
                                      shard_size=10).hashed()

    bf16_units(False)
    auto, auto_hash = encode_hash(device="cpu")
    assert auto.runtime == "torch" and auto_hash["settings"]["runtime"] == "torch"
    assert encode_hash(device="cpu", runtime="torch")[1] == auto_hash
    onnx, onnx_hash = encode_hash(device="cpu", runtime="onnx")
    assert onnx_hash != auto_hash
    assert encode_hash(device="cpu", int8=True)[1] != auto_hash
    assert EncodeSettings.of(EncodeConfig(device="cpu", bf16=True)).runtime == "torch"
    assert onnx.device("cuda") == "cpu"  # a worker with a GPU still computes an onnx version on the CPU
    assert EncodeSettings.of(EncodeConfig(device="cpu", runtime="torch")).device("cpu") == "cpu"
    assert ScoringSettings.of(CrossEncoderConfig(device="cpu")) == ScoringSettings(runtime="torch")
    assert ScoringSettings.of(CrossEncoderConfig(device="cpu", runtime="onnx")) == ScoringSettings(runtime="onnx")
    assert ScoringSettings.of(CrossEncoderConfig(device="cpu", runtime="torch", int8=True)).precision == "int8"
    with pytest.raises(ValueError, match="int8"):
        ScoringSettings.of(CrossEncoderConfig(device="cuda", int8=True))
    # the classifier trains and reports with torch: how later stages score leaves its version alone
    trained = [CrossEncoderParams(config=CrossEncoderConfig(runtime=r, int8=i), match_type="string", device="cpu",
                                  batch_size=8).hashed() for r, i in (("torch", False), ("onnx", True))]
    assert trained[0] == trained[1]


def test_scorer_paths_and_their_agreement_with_torch(checkpoint, tmp_path):
    from tasks.compute.score import ScoringSettings, cross_encoder_on, scoring_agreement

    torch.manual_seed(3)
    folder = CrossEncoderModel.from_base(str(checkpoint), max_length=32).save_pretrained(tmp_path / "ce")
    pairs = [(q, p[1]) for q in QUERIES for p in PASSAGES]
    reference = cross_encoder_on(str(folder), "cpu").score(pairs)
    for scoring in (ScoringSettings(runtime="onnx"), ScoringSettings(runtime="onnx", int8=True),
                    ScoringSettings(runtime="torch", int8=True)):
        p = cross_encoder_on(str(folder), "cpu", scoring).score(pairs)
        report = scoring_agreement(str(folder), scoring, pairs, p)["reference"]
        assert report["pairs"] == len(pairs) and report["max_abs_p_diff"] == pytest.approx(np.abs(p - reference).max(),
                                                                                            abs=1e-6)
        assert report["max_abs_p_diff"] < (1e-5 if not scoring.int8 else 0.02)
    assert scoring_agreement(str(folder), ScoringSettings(), pairs, reference) == {}
    with pytest.raises(ValueError, match="CPU"):
        cross_encoder_on(str(folder), "cuda", ScoringSettings(runtime="onnx"))


def test_a_judge_shard_scores_under_cpu_bf16_when_its_settings_say_so(checkpoint, tmp_path):
    from tasks.compute.score import ScoreJob, ScoringSettings, cross_encoder_on
    from tasks.negatives.stages import _judge_shard

    torch.manual_seed(3)
    folder = str(CrossEncoderModel.from_base(str(checkpoint), max_length=32).save_pretrained(tmp_path / "ce"))
    pairs = [(q, p[1]) for q in QUERIES for p in PASSAGES]
    reference = cross_encoder_on(folder, "cpu").score(pairs)
    dtypes = []
    for scoring in (ScoringSettings(), ScoringSettings(bf16=True)):
        model = cross_encoder_on(folder, "cpu", scoring)
        linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        hook = linear.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
        try:
            p = _judge_shard(ScoreJob(folder, "cpu", 4, 1, scoring=scoring), (0, pairs)).column("p").to_numpy()
        finally:
            hook.remove()
        np.testing.assert_allclose(p, reference, atol=0.02 if scoring.bf16 else 1e-6)
    assert set(dtypes[:len(dtypes) // 2]) == {torch.float32} and set(dtypes[len(dtypes) // 2:]) == {torch.bfloat16}


@pytest.mark.skipif(not openvino_available(), reason="openvino not installed")
def test_openvino_runs_the_export_at_fp32_and_bf16_near_torch(checkpoint):
    model = _bi_encoder(checkpoint, shared=True, pooling="mean", normalize=True)
    fp32 = for_inference(model, "cpu", runtime="openvino")
    bf16 = for_inference(model, "cpu", runtime="openvino", bf16=True)
    assert isinstance(fp32, OnnxBiEncoder) and (fp32.runtime, fp32.bf16, bf16.bf16) == ("openvino", False, True)
    for texts, side in ((QUERIES, "query"), (PASSAGES, "passage")):
        want = _encode(model, texts, side)
        assert np.abs(_encode(fp32, texts, side) - want).max() <= TOLERANCE * max(1.0, np.abs(want).max())
        low = _encode(bf16, texts, side)  # bf16 where the CPU has bf16 units (f32 elsewhere: closer still)
        cos = (low * want).sum(1) / (np.linalg.norm(low, axis=1) * np.linalg.norm(want, axis=1))
        assert cos.min() > 0.99, cos
    torch.manual_seed(2)
    scorer = CrossEncoderModel.from_base(str(checkpoint), max_length=32).eval()
    pairs = [(q, p[1]) for q in QUERIES for p in PASSAGES]
    want = scorer.logits(pairs, batch_size=4)
    got = OnnxCrossEncoder.from_model(scorer, runtime="openvino").logits(pairs, batch_size=4)
    assert np.abs(got - want).max() <= TOLERANCE * max(1.0, np.abs(want).max())
    low = OnnxCrossEncoder.from_model(scorer, runtime="openvino", bf16=True).score(pairs, batch_size=4)
    assert np.abs(low - scorer.score(pairs)).max() < 0.02
    with pytest.raises(ValueError, match="int8"):
        for_inference(model, "cpu", int8=True, runtime="openvino")
    with pytest.raises(ValueError, match="ONNX Runtime runs fp32 or int8"):
        OnnxCrossEncoder.from_model(scorer, bf16=True)


@pytest.mark.skipif(not openvino_available(), reason="openvino not installed")
def test_openvino_bf16_settings_compile_bf16_and_autocast_the_training_dev_metric(checkpoint):
    from tasks.compute.encode import EncodeSettings

    model = _bi_encoder(checkpoint, shared=True, pooling="mean", normalize=True)
    settings = EncodeSettings(batch_size=2, passage_max_len=32, query_max_len=16, dtype="float32", bf16=True,
                              runtime="openvino")
    compiled = settings.for_inference(model, settings.device("cuda"))  # a worker's GPU: still the CPU
    assert (compiled.runtime, compiled.bf16) == ("openvino", True)
    dtypes = []
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    hook = linear.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    try:  # the dev metric encodes the torch model being trained: bf16 as torch's autocast
        settings.encode(model, QUERIES, "query", "cpu")
    finally:
        hook.remove()
    assert dtypes and set(dtypes) == {torch.bfloat16}
    vectors = settings.encode(compiled, QUERIES, "query", "cpu")
    assert vectors.shape == (len(QUERIES), 32) and np.isfinite(vectors).all()


def test_openvino_imports_without_sending_its_usage_event(tmp_path):
    """`import openvino` reports the import through a forked process unless the user opted out or
    CI is set; a fork of a threaded run can deadlock there and keep `pforge run` from exiting. Ours
    declines: no process starts (a fresh HOME, no CI variable: openvino's own import would send)."""
    import os
    import subprocess
    import sys

    from tasks.config import PROJECT_ROOT

    pytest.importorskip("openvino")
    code = ("import multiprocessing\n"
            "started = []\n"
            "multiprocessing.Process.start = lambda self: started.append(self)\n"
            "from models.encoder_runtimes import import_openvino\n"
            "import_openvino()\n"
            "print(len(started))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TF_BUILD", "JENKINS_URL")}
    env["HOME"] = str(tmp_path)  # no consent file there
    out = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "0"
