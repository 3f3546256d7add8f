"""`bf16: auto` (models/cpu_features.py): bf16 autocast where the CPU has AMX or the GPU bf16,
fp32 elsewhere; resolved when a run is planned, so a version hashes the precision it ran."""
import pytest

from models import cpu_features
from tasks.dense.stages import EncodeConfig, EncodeParams, EncodeSettings, Origin

EPYC = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu sse2 avx avx2 fma\n"
XEON = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"


@pytest.fixture
def cpuinfo(tmp_path, monkeypatch):
    def use(text):
        path = tmp_path / "cpuinfo"
        path.write_text(text)
        monkeypatch.setattr(cpu_features, "CPUINFO", path)
        cpu_features.cpu_flags.cache_clear()
    yield use
    cpu_features.cpu_flags.cache_clear()


def _hash(settings):
    return EncodeParams(system="s", origin=Origin(model={}), settings=settings, device="cpu", shard_size=10).hashed()


def test_flags_are_read_from_cpuinfo(cpuinfo, tmp_path, monkeypatch):
    cpuinfo(XEON)
    assert cpu_features.has_amx_bf16() and "avx512_bf16" in cpu_features.cpu_flags()
    cpuinfo(EPYC)
    assert not cpu_features.has_amx_bf16() and cpu_features.cpu_flags() == {"fpu", "sse2", "avx", "avx2", "fma"}
    monkeypatch.setattr(cpu_features, "CPUINFO", tmp_path / "absent")
    cpu_features.cpu_flags.cache_clear()
    assert cpu_features.cpu_flags() == frozenset() and not cpu_features.auto_bf16("cpu")


def test_auto_is_bf16_on_amx_and_fp32_without_and_hashed_as_resolved(cpuinfo):
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
