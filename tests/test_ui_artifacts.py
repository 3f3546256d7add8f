"""The Prefect UI reports of a stage: the progress listener and the summary markdown."""
import json

import pytest

from flows import ui_artifacts
from flows.ui_artifacts import StageProgress, artifact_key, summary_markdown
from storage import Artifact
from tasks import progress


def test_artifact_keys_are_what_prefect_accepts():
    assert artifact_key("Squad_open", "train:minilm-dpr", "progress") == "squad-open-train-minilm-dpr-progress"


def test_reports_reach_only_the_listeners_inside_the_block():
    heard = []
    progress.report("before", 1, 2)
    with progress.listening(lambda *a: heard.append(a)):
        list(progress.with_progress(range(5), "items", every=2, total=5))
        progress.progress_logger("gen")(3, 9)
        progress.report("no total", 3, None)
    progress.report("after", 1, 2)
    assert heard == [("items", 2, 5), ("items", 4, 5), ("items", 5, 5), ("gen", 3, 9)]


def test_stage_progress_creates_once_then_updates_throttled_and_always_at_the_end(monkeypatch):
    calls = []
    monkeypatch.setattr(ui_artifacts, "create_progress_artifact",
                        lambda p, key, description: calls.append(("create", p, key, description)) or "id-1")
    monkeypatch.setattr(ui_artifacts, "update_progress_artifact",
                        lambda i, p, description: calls.append(("update", i, p, description)))
    clock = iter([0.0, 0.5, 1.0, 5.0, 5.1])
    monkeypatch.setattr(ui_artifacts.time, "monotonic", lambda: next(clock))
    listener = StageProgress("tiny-encode-progress", "encode", every_s=2.0)
    for done in (10, 20, 30, 40, 100):
        listener("passages", done, 100)
    assert calls == [("create", 10.0, "tiny-encode-progress", "encode: passages: 10/100"),
                     ("update", "id-1", 40.0, "encode: passages: 40/100"),
                     ("update", "id-1", 100.0, "encode: passages: 100/100")]


def test_a_failing_ui_call_never_fails_the_stage(monkeypatch, caplog):
    def down(*a, **k):
        raise ConnectionError("server gone")
    monkeypatch.setattr(ui_artifacts, "create_progress_artifact", down)
    listener = StageProgress("k", "chunk")
    listener("documents", 1, 2)
    listener("documents", 2, 2)  # no second try once it failed
    assert [r.getMessage() for r in caplog.records if "progress artifact" in r.getMessage()] == \
        ["chunk: progress artifact not updated (server gone)"]


def test_summary_names_version_tables_stats_and_embeds_plots(tmp_path):
    (tmp_path / "training").mkdir()
    png = tmp_path / "training" / "loss_curve.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\nfake")
    manifest = {"rows": 1200, "bytes": 34567, "inputs": {"chunk": {"stage": "passages", "version": "abc"}},
                "tables": {"passages": {"rows": 1200, "bytes": 34567, "default": True}},
                "stats": {"documents": 12, "loss": 0.123456, "per_split": {"train": 3}}}
    text = summary_markdown("chunk", Artifact("passages", "v123", tmp_path, manifest))
    assert text.startswith("# chunk: passages `v123`")
    assert "1,200 rows" in text and "chunk = passages `abc`" in text
    assert "| passages | 1,200 | 34,567 |" in text
    assert "| documents | 12 |" in text and "| loss | 0.1235 |" in text
    assert json.dumps({"per_split": {"train": 3}}, indent=1) in text
    assert "![loss_curve.png](data:image/png;base64," in text
    assert "where version = 'v123'" in text


@pytest.mark.parametrize("size,embedded", [(100, True), (ui_artifacts.MAX_IMAGE_BYTES + 1, False)])
def test_large_plots_are_not_embedded(tmp_path, size, embedded):
    (tmp_path / "plot.png").write_bytes(b"x" * size)
    text = summary_markdown("s", Artifact("a", "v", tmp_path, {}))
    assert ("data:image/png" in text) is embedded


def test_sharded_stages_report_their_shards(tmp_path):
    import pyarrow as pa

    from tasks.runners import run_shards

    heard = []
    with progress.listening(lambda *a: heard.append(a)):
        run_shards(None, tmp_path, 3, lambda i: pa.table({"x": [i]}), label="encode:zs")
    assert heard == [("encode:zs: shards", 1, 3), ("encode:zs: shards", 2, 3), ("encode:zs: shards", 3, 3)]
