"""models/runtime_cache.py: one conversion per model version and settings, never half a folder."""
from __future__ import annotations

import threading

import pytest

from models.runtime_cache import DONE, cache_root, cached_conversion


def _model(folder, weights: bytes):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "weights.bin").write_bytes(weights)
    (folder / "config.json").write_text("{}")
    return folder


def test_a_conversion_is_built_once_per_content_and_settings(tmp_path):
    calls = []

    def build(target):
        calls.append(target)
        (target / "model.onnx").write_bytes(b"converted")

    a = _model(tmp_path / "a", b"123")
    first = cached_conversion(a, "onnx", {"precision": "int8"}, build)
    assert first.parent.parent == cache_root() and (first / DONE).is_file() and (first / "model.onnx").read_bytes() == b"converted"
    same_bytes_elsewhere = _model(tmp_path / "copy", b"123")
    assert cached_conversion(same_bytes_elsewhere, "onnx", {"precision": "int8"}, build) == first
    assert len(calls) == 1
    assert cached_conversion(a, "onnx", {"precision": "fp32"}, build) != first  # other settings: another conversion
    (a / "weights.bin").write_bytes(b"retrained")
    assert cached_conversion(a, "onnx", {"precision": "int8"}, build) != first  # other weights: another conversion
    assert len(calls) == 3


def test_a_failed_conversion_leaves_nothing_and_the_next_call_builds_again(tmp_path):
    a = _model(tmp_path / "a", b"x")

    def broken(target):
        (target / "half.onnx").write_bytes(b"half")
        raise RuntimeError("converter died")

    with pytest.raises(RuntimeError, match="converter died"):
        cached_conversion(a, "ct2", {}, broken)
    assert not any(p.name.startswith(".tmp-") or p.is_dir() for p in (cache_root() / "ct2").iterdir())
    built = cached_conversion(a, "ct2", {}, lambda t: (t / "model.bin").write_bytes(b"ok"))
    assert (built / "model.bin").read_bytes() == b"ok"


def test_concurrent_callers_share_one_conversion(tmp_path):
    a = _model(tmp_path / "a", b"y")
    calls, results = [], []

    def build(target):
        calls.append(1)
        (target / "m").write_bytes(b"m")

    threads = [threading.Thread(target=lambda: results.append(cached_conversion(a, "onnx-race", {}, build))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(set(results)) == 1
