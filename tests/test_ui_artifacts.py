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
    listener = StageProgress("tiny-encode-progress", "encode", every_s=2.0, clock=lambda: next(clock))
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


def test_a_refused_connection_is_tried_again_at_doubling_intervals_then_given_up(monkeypatch, caplog):
    import httpx

    answers = iter([httpx.ConnectError("refused"), "id-1", httpx.ConnectError("refused"),
                    httpx.ConnectError("refused"), httpx.ConnectError("refused")])
    tried = []

    def create(percent, key, description):
        tried.append(percent)
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer
    monkeypatch.setattr(ui_artifacts, "create_progress_artifact", create)
    monkeypatch.setattr(ui_artifacts, "update_progress_artifact", lambda i, p, description: create(p, None, description))
    clock = iter([0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 14.0, 21.0, 31.0, 50.0])
    listener = StageProgress("k", "encode", every_s=2.0, clock=lambda: next(clock))
    for done in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10):
        listener("passages", done, 100)
    # refused at 0 s: tried again 4 s later (ok), then every 2 s; refused at 6, 10 (4 s on), 21 s (8 s on): given up
    assert tried == [1.0, 3.0, 4.0, 6.0, 8.0]
    assert listener.failed
    assert [r.getMessage() for r in caplog.records if "progress artifact" in r.getMessage()] == \
        ["encode: progress artifact not updated (refused)"]


def test_the_summary_is_published_again_after_a_refused_connection_boundedly(monkeypatch, caplog, tmp_path):
    import httpx

    calls, waits = [], []

    def refused_once(**kwargs):
        calls.append(kwargs["key"])
        if len(calls) == 1:
            raise httpx.ConnectError("refused")
    monkeypatch.setattr(ui_artifacts, "create_markdown_artifact", refused_once)
    artifact = Artifact("passages", "v1", tmp_path, {})
    ui_artifacts.publish_summary("k-summary", "chunk", artifact, sleep=waits.append)
    assert calls == ["k-summary", "k-summary"] and waits == [1.0]
    assert not [r for r in caplog.records if "summary artifact" in r.getMessage()]

    def always_refused(**kwargs):
        calls.append(kwargs["key"])
        raise httpx.ConnectError("refused")
    monkeypatch.setattr(ui_artifacts, "create_markdown_artifact", always_refused)
    calls.clear(), waits.clear()
    ui_artifacts.publish_summary("k-summary", "chunk", artifact, sleep=waits.append)
    assert len(calls) == ui_artifacts.TRIES and waits == [1.0, 2.0]
    assert [r.getMessage() for r in caplog.records if "summary artifact" in r.getMessage()] == \
        ["chunk: summary artifact not published (refused)"]


def test_prefects_client_retries_a_busy_server_boundedly(monkeypatch):
    """The publishers' calls go through Prefect's client, which must retry a 503 (the server's
    database busy) and a dropped connection, a bounded number of times: pinned here, since no loop
    of ours covers them."""
    import anyio
    import httpx
    from prefect.client import base
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    waits = []

    async def no_wait(seconds):
        waits.append(seconds)
    monkeypatch.setattr(base.anyio, "sleep", no_wait)

    def post(answers):
        def handler(request):
            answer = next(answers)
            if isinstance(answer, Exception):
                raise answer
            return httpx.Response(answer, json={})

        async def call():
            async with base.PrefectHttpxAsyncClient(transport=httpx.MockTransport(handler), base_url="http://x/api") as c:
                return await c.post("/artifacts/", json={})
        return anyio.run(call)

    assert post(iter([503, httpx.ReadError("reset"), 503, 201])).status_code == 201
    assert len(waits) == 3
    with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 2}):
        with pytest.raises(httpx.HTTPStatusError):
            post(iter([503] * 3 + [201]))  # 1 try + 2 retries, then the 503 is the answer
