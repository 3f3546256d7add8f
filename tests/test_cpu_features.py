"""`bf16: auto` (models/cpu_features.py): bf16 autocast where the CPU has bf16 units (AMX, avx512_bf16)
or the GPU bf16, fp32 elsewhere; resolved when a run is planned, so a version hashes the precision it ran."""
import pytest

from models import cpu_features
from tasks.compute.encode import EncodeConfig, EncodeSettings
from tasks.compute.origin import Origin
from tasks.compute.score import ScoringSettings
from tasks.dense.stages import EncodeParams
from tasks.silver.config import CrossEncoderConfig
from tasks.silver.stages import CrossEncoderParams

EPYC = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma\n"
XEON = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
ZEN5 = "processor\t: 0\nflags\t\t: fpu avx2 fma avx512f avx512_vnni avx512_bf16\n"   # AVX-512 bf16, no AMX
SKYLAKE = "processor\t: 0\nflags\t\t: fpu avx2 fma avx512f avx512bw\n"               # AVX-512 without bf16


def _hash(settings):
    return EncodeParams(system="s", origin=Origin(model={}), settings=settings, device="cpu", shard_size=10).hashed()


def test_flags_are_read_from_cpuinfo(cpuinfo, tmp_path, monkeypatch):
    cpuinfo(XEON)
    assert cpu_features.has_bf16_units() and "amx_bf16" in cpu_features.cpu_flags()
    cpuinfo(EPYC)
    assert not cpu_features.has_bf16_units() and cpu_features.cpu_flags() == {"fpu", "sse2", "avx", "avx2", "fma"}
    monkeypatch.setenv(cpu_features.CPUINFO_ENV, str(tmp_path / "absent"))
    cpu_features.cpu_flags.cache_clear()
    assert cpu_features.cpu_flags() == frozenset() and not cpu_features.auto_bf16("cpu")


def test_auto_is_bf16_on_amx_and_fp32_without_and_hashed_as_resolved(cpuinfo, monkeypatch):
    import models.encoder_runtimes as ort_module

    monkeypatch.setattr(ort_module, "openvino_available", lambda: False)  # torch's bf16 (OpenVINO's: below)
    cpuinfo(EPYC)
    epyc = EncodeSettings.of(EncodeConfig(device="cpu"))
    assert epyc.bf16 is False and epyc.precision == "fp32"
    assert _hash(epyc) == _hash(EncodeSettings.of(EncodeConfig(device="cpu", bf16=False)))  # versions as before
    cpuinfo(XEON)
    xeon = EncodeSettings.of(EncodeConfig(device="cpu"))
    assert xeon.bf16 is True and xeon.precision == "bf16" and xeon.runtime == "torch"
    assert _hash(xeon) == _hash(EncodeSettings.of(EncodeConfig(device="cpu", bf16=True))) != _hash(epyc)
    # a named choice wins: explicit fp32, int8 weights and ONNX Runtime keep auto off
    assert EncodeSettings.of(EncodeConfig(device="cpu", bf16=False)).bf16 is False
    assert EncodeSettings.of(EncodeConfig(device="cpu", int8=True)).precision == "int8"
    assert EncodeSettings.of(EncodeConfig(device="cpu", runtime="onnx")).bf16 is False


@pytest.mark.parametrize("text, units", [(XEON, True), (ZEN5, True), (SKYLAKE, False), (EPYC, False)])
def test_bf16_units_are_amx_or_avx512_bf16_and_auto_follows_them(cpuinfo, monkeypatch, text, units):
    import models.encoder_runtimes as ort_module

    monkeypatch.setattr(ort_module, "openvino_available", lambda: True)
    cpuinfo(text)
    assert cpu_features.has_bf16_units() is units
    assert cpu_features.auto_bf16("cpu") is units
    # the one reading of a setting: auto follows the units, a named choice is kept either way
    assert [cpu_features.bf16_wanted(flag, "cpu") for flag in ("auto", "on", "off", True, False)] == \
        [units, True, False, True, False]
    settings = EncodeSettings.of(EncodeConfig(device="cpu"))
    assert (settings.precision, settings.runtime) == (("bf16", "openvino") if units else ("fp32", "torch"))
    assert settings.device("cpu") == "cpu"


def test_scoring_auto_is_bf16_on_bf16_units_and_hashes_as_before_without(cpuinfo, monkeypatch):
    import models.encoder_runtimes as ort_module

    cpuinfo(ZEN5)
    monkeypatch.setattr(ort_module, "openvino_available", lambda: True)
    zen5 = ScoringSettings.of(CrossEncoderConfig(device="cpu"))
    assert zen5 == ScoringSettings(runtime="openvino", bf16=True) and zen5.precision == "bf16"
    assert zen5.device("cpu") == "cpu" and not zen5.autocast_bf16("cpu")  # OpenVINO's bf16 is compiled in
    torch_bf16 = ScoringSettings.of(CrossEncoderConfig(device="cpu", runtime="torch"))
    assert torch_bf16 == ScoringSettings(runtime="torch", bf16=True) and torch_bf16.autocast_bf16("cpu")
    monkeypatch.setattr(ort_module, "openvino_available", lambda: False)
    assert ScoringSettings.of(CrossEncoderConfig(device="cpu")) == torch_bf16
    # named choices win: fp32, int8 weights and ONNX Runtime keep auto off; bf16 with either is an error
    assert ScoringSettings.of(CrossEncoderConfig(device="cpu", bf16=False)) == ScoringSettings()
    assert ScoringSettings.of(CrossEncoderConfig(device="cpu", int8=True)).precision == "int8"
    assert ScoringSettings.of(CrossEncoderConfig(device="cpu", runtime="onnx")).bf16 is False
    with pytest.raises(ValueError, match="bf16"):
        ScoringSettings.of(CrossEncoderConfig(device="cpu", bf16=True, int8=True))
    cpuinfo(EPYC)
    epyc = ScoringSettings.of(CrossEncoderConfig(device="cpu"))
    assert epyc == ScoringSettings() and not epyc.autocast_bf16("cpu")
    assert ScoringSettings.of(CrossEncoderConfig(device="cpu", bf16=True)).bf16 is True  # named: on, emulated
    # fp32 dumps as before bf16 existed (versions scored then still match); bf16 is hashed
    from tasks.engine import without_added

    hashed = lambda settings: without_added(settings, settings.model_dump(mode="json"))  # as a version sees it
    assert hashed(ScoringSettings()) == {"runtime": "torch", "int8": False}
    assert hashed(ScoringSettings(bf16=True))["bf16"] is True
    # the classifier trains and reports in fp32 torch: how later stages score leaves its version alone
    trained = [CrossEncoderParams(config=CrossEncoderConfig(bf16=b), match_type="string", device="cpu",
                                  batch_size=8).hashed() for b in (True, False, "auto")]
    assert trained[0] == trained[1] == trained[2]


@pytest.mark.parametrize("config", ["demo.yaml", "silver.yaml", "query-as-context.yaml"])
def test_training_stages_plan_bf16_per_cpu_and_keep_their_versions_without_bf16_units(cpuinfo, config):
    """Every trainer's bf16 'auto' (dense systems, the generator, the classifier, pre-training) is
    planned 'on' on a CPU with bf16 units, a version of its own; without them it stays 'auto',
    the versions planned before CPU bf16 training."""
    from flows.registry import plan_for
    from tasks.config import PROJECT_ROOT, load_config
    from tasks.training.arguments import ScheduleArgs

    def trainers(plan) -> dict[str, tuple[str, str]]:
        out = {}
        for name in plan.names():
            params = plan[name].params
            for schedule in (getattr(params, "train", None), getattr(getattr(params, "train", None), "schedule", None),
                             getattr(params, "pretrain", None), getattr(getattr(params, "config", None), "train", None)):
                if isinstance(schedule, ScheduleArgs):
                    out[name] = (schedule.bf16, plan.planned_version(name))
        return out

    cpuinfo(EPYC)
    epyc = trainers(plan_for(load_config(PROJECT_ROOT / "configs" / config)))
    cpuinfo(ZEN5)
    zen5 = trainers(plan_for(load_config(PROJECT_ROOT / "configs" / config)))
    assert epyc and epyc.keys() == zen5.keys()
    assert config != "demo.yaml" or any(name.startswith("train:") for name in epyc)   # the dense systems' schedules
    assert {bf16 for bf16, _ in epyc.values()} == {"auto"} and {bf16 for bf16, _ in zen5.values()} == {"on"}
    assert all(zen5[name][1] != epyc[name][1] for name in epyc)
