"""The libraries' chatter is quiet by default and shown with `pforge --debug`: Lucene's JVM INFO
lines, faiss's "Could not load library with AVX512 support", the ONNX export's TracerWarnings and
Prefect's docs line (tests/test_cli_lifecycle.py checks the quiet half on real runs)."""
from __future__ import annotations

import logging
import warnings

import pytest
import torch
from torch import nn

from flows.cli import TEMPORARY_SERVER_NOTE, _NoFailureReports, main


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """main() on a quick command, with the state it sets put back afterwards; returns what was quieted."""
    quieted = []
    monkeypatch.delenv("PFORGE_DEBUG", raising=False)
    monkeypatch.setattr(logging.getLogger("faiss.loader"), "level", logging.NOTSET)
    monkeypatch.setattr("flows.cli.quiet_prefect_tracebacks", lambda: quieted.append("prefect"))
    monkeypatch.setattr(logging, "raiseExceptions", logging.raiseExceptions)

    def run(*flags: str) -> list[str]:
        assert main([*flags, "--root", str(tmp_path / "none"), "artifacts"]) == 2  # no store: refused, quickly
        if logging.getLogger("faiss.loader").level == logging.WARNING:
            quieted.append("faiss")
        return quieted
    return run


def test_by_default_faiss_and_prefect_are_quieted(cli):
    assert cli() == ["prefect", "faiss"]


def test_debug_quiets_nothing_and_tells_the_subprocesses(cli):
    import os

    assert cli("--debug") == [] and os.environ["PFORGE_DEBUG"] == "1"


def test_prefects_temporary_server_lines_become_one_without_its_docs_link():
    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("prefect.server", logging.INFO, __file__, 1, message, (), None)

    starting = record("Starting temporary server on http://127.0.0.1:8123\nSee https://docs.prefect.io/... for more")
    assert _NoFailureReports().filter(starting)
    assert starting.getMessage() == TEMPORARY_SERVER_NOTE.format(address="http://127.0.0.1:8123")
    assert "docs.prefect.io" not in starting.getMessage()
    assert not _NoFailureReports().filter(record("Stopping temporary server on http://127.0.0.1:8123"))


def test_the_jvm_logs_at_warning_unless_debug(monkeypatch):
    from tasks.bm25.jvm import _java_logging_options

    monkeypatch.delenv("PFORGE_DEBUG", raising=False)
    assert [o for o in _java_logging_options() if o.startswith("-Djava.util.logging.config.file=")]
    monkeypatch.setenv("PFORGE_DEBUG", "1")
    assert _java_logging_options() == []


class _Branchy(nn.Module):
    """A shape-dependent Python branch, as in the models' code: the tracer warns about it."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 4)

    def forward(self, input_ids):
        out = self.embed(input_ids)
        if input_ids.shape[1] > 1:
            out = out * 1.0
        return out.mean(1)


@pytest.mark.parametrize("debug, shown", [(None, False), ("1", True)])
def test_onnx_tracer_warnings_show_only_with_debug(tmp_path, monkeypatch, debug, shown):
    from models.encoder_runtimes import export_checked

    if debug is None:
        monkeypatch.delenv("PFORGE_DEBUG", raising=False)
    else:
        monkeypatch.setenv("PFORGE_DEBUG", debug)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export_checked(_Branchy(), ["input_ids"], "out", 16, tmp_path / "model.onnx")
    assert any(issubclass(w.category, torch.jit.TracerWarning) for w in caught) == shown
