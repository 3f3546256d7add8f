"""Corpus refresh (`pforge refresh`, tasks/refresh): a pipeline over a tiny Wikipedia dump (four real
articles of the sample dump, plus three SQuAD articles) with a tiny random encoder, promoted; then
a newer dump with one article edited, one added and one deleted. The refresh re-chunks and
re-encodes only what changed (unchanged passages keep their vectors byte for byte), updates the
FAISS and BM25 indexes, and searches reflect the change. Also: locating dumps (paths, globs, URLs
with {date} against a local HTTP server), FAISS updates of each index kind, and bad input (a clear
error, nothing registered). About a minute on 2 CPU cores."""
import bz2
import http.server
import os
import re
import threading
from datetime import date
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from flows.cli import main
from flows.promotion import promote
from flows.search import search
from storage import ArtifactStore
from tasks.errors import InputError
from tasks.refresh.locate import expand_date, locate_dump

SAMPLE = "wikipedia/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
OLD_TITLES = ["Academy Award for Best Production Design", "Actrius", "Animalia (book)", "Alain Connes"]
EDIT = ("nominated for 'Best Screenplay'", "nominated for 'Best Screenplay' (a zebracorn award)")
ADDED, DELETED, EDITED = "Aa River", "Alain Connes", "Actrius"


# ------------------------------------------------------------------------------- fixtures
def _sample_pages(shared_data: Path) -> tuple[str, dict[str, str]]:
    raw = bz2.decompress((shared_data / SAMPLE).read_bytes()).decode("utf-8")
    header = raw[:raw.index("  <page>")]
    pages = {re.search(r"<title>(.*?)</title>", p).group(1): p for p in re.findall(r"  <page>.*?</page>\n", raw, re.S)}
    return header, pages


def _write_dump(path: Path, header: str, pages: list[str]) -> Path:
    path.write_bytes(bz2.compress((header + "".join(pages) + "</mediawiki>\n").encode("utf-8")))
    return path


def _save_tiny_encoder(checkpoint: Path, out: Path):
    from models import BiEncoder

    BiEncoder.from_pretrained(str(checkpoint), shared=True, pooling="mean", normalize=True,
                              scale=20.0).save_pretrained(out / "model")
    return {"stats": {"steps": 0}}


@pytest.fixture(scope="module")
def built(prefect_harness, shared_data, tiny_checkpoint, tmp_path_factory, flush_denormals):
    """The pipeline over the old dump, with the tiny encoder promoted."""
    from flows.pipeline import pipeline
    from tasks.config import PROJECT_ROOT, load_config

    folder = tmp_path_factory.mktemp("refresh")
    header, pages = _sample_pages(shared_data)
    assert EDIT[0] in pages[EDITED]
    old = _write_dump(folder / "enwiki-20240101-pages-articles.xml.bz2", header, [pages[t] for t in OLD_TITLES])
    new_pages = [pages[t].replace(*EDIT) for t in OLD_TITLES if t != DELETED] + [pages[ADDED]]
    new = _write_dump(folder / "enwiki-20240201-pages-articles.xml.bz2", header, new_pages)
    root = folder / "store"
    store = ArtifactStore(root)
    encoder = store.materialize("dense_model", "1", {"system": "tiny", "note": "random tiny BERT"}, {},
                                partial(_save_tiny_encoder, tiny_checkpoint))
    config = folder / "refresh.yaml"
    config.write_text(f"""extends: {PROJECT_ROOT / 'configs' / 'tiny.yaml'}
name: refresh-test
data: {{wikipedia: ["{old}"]}}
dense:
  encode: {{batch_size: 16, passage_max_len: 128, query_max_len: 32, device: cpu}}
  systems:
    - name: tiny
      model: {{base: "{tiny_checkpoint}", shared: true, pooling: mean, normalize: true, scale: 20.0}}
      init_from: "dense_model:{encoder.version}"
refresh: {{cron: "0 4 1,21 * *", examples: 3}}
""")
    cfg = load_config(config)
    versions = pipeline(config=cfg, root=str(root))
    promote(encoder.version, root=root)
    return {"root": root, "config": config, "cfg": cfg, "versions": versions, "encoder": encoder.version,
            "old": old, "new": new, "folder": folder}


def _rows(store: ArtifactStore) -> set[tuple[str, str]]:
    return {(r["stage"], r["version"]) for r in store.list_artifacts()}


def _count_encoded(monkeypatch) -> list[int]:
    import tasks.compute.batch_encode as encode

    calls, real = [], encode.encode_texts

    def counting(texts, *args, **kwargs):
        calls.append(len(texts))
        return real(texts, *args, **kwargs)

    monkeypatch.setattr(encode, "encode_texts", counting)
    return calls


@pytest.fixture(scope="module")
def refreshed(built):
    """The refresh to the newer dump, found as the newest match of a glob, through `pforge refresh`."""
    store = ArtifactStore(built["root"])
    before = _rows(store)
    searches = {q: search(q, system="bm25", k=5, store=store) for q in ("zebracorn award", "Alain Connes mathematician")}
    monkeypatch = pytest.MonkeyPatch()
    calls = _count_encoded(monkeypatch)
    try:
        code = main(["--root", str(built["root"]), "refresh", str(built["config"]),
                     "--dump", str(built["folder"] / "enwiki-*-pages-articles.xml.bz2")])
    finally:
        monkeypatch.undo()
    assert code == 0
    store = ArtifactStore(built["root"])
    report = store.latest("corpus_refresh")
    return {**built, "store": store, "before": before, "report": report, "calls": calls, "searches_before": searches}


def _expected_passages(dump: Path) -> dict[str, dict]:
    from tasks.chunking.chunker import chunk_document
    from tasks.readers.wikipedia import iter_wikipedia_documents

    return {p["pid"]: p for doc in iter_wikipedia_documents(dump) for p in chunk_document(doc)}


# ------------------------------------------------------------------------------- the refresh
def test_a_refresh_from_the_dump_the_corpus_was_built_from_writes_nothing(built, capsys, monkeypatch):
    # Before any refresh (tests run in file order): the corpus is the pipeline's own ingest of the
    # old dump, which the config names, so `pforge refresh CONFIG` reads that very dump.
    store = ArtifactStore(built["root"])
    assert store.latest("corpus_refresh") is None, "must run before the refresh of the fixture `refreshed`"
    before, folders = store.list_artifacts(), sorted(built["root"].glob("*/*/manifest.json"))
    calls = _count_encoded(monkeypatch)
    assert main(["--root", str(built["root"]), "refresh", str(built["config"])]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"up to date: the corpus was built from {built['old']}; nothing written" in out, out
    after = ArtifactStore(built["root"]).list_artifacts()
    assert len(after) == len(before) and _rows(ArtifactStore(built["root"])) == {(r["stage"], r["version"]) for r in before}
    assert sorted(built["root"].glob("*/*/manifest.json")) == folders and calls == []  # no new version, nothing encoded


def test_the_change_report_counts_documents_and_passages(refreshed):
    store, report = refreshed["store"], refreshed["report"]
    old, new = _expected_passages(refreshed["old"]), _expected_passages(refreshed["new"])
    added = [pid for pid in new if pid not in old]
    deleted = [pid for pid in old if pid not in new]
    changed = [pid for pid in new if pid in old and new[pid]["text"] != old[pid]["text"]]
    assert len(changed) == 1 and new[changed[0]]["title"] == EDITED and "zebracorn" in new[changed[0]]["text"]
    assert sum(p["title"] == EDITED for p in new.values()) > 1  # the edited article's other passages are unchanged
    counts = {(r["level"], r["change"]): r["count"] for r in store.sql("SELECT * FROM refresh_counts").to_pylist()}
    squad = store.sql("SELECT count(*) FROM passages WHERE NOT starts_with(doc_id, 'wiki:')").column(0)[0].as_py()
    assert counts == {
        ("document", "new"): 1, ("document", "changed"): 1, ("document", "deleted"): 1, ("document", "unchanged"): 2 + 3,
        ("passage", "new"): len(added), ("passage", "changed"): 1, ("passage", "deleted"): len(deleted),
        ("passage", "unchanged"): len(new) - len(added) - 1 + squad,
        ("passage", "reencoded"): len(added) + 1}
    changes = store.sql("SELECT level, change, title FROM refresh_changes WHERE level = 'document' ORDER BY change").to_pylist()
    assert [(r["change"], r["title"]) for r in changes] == [("changed", EDITED), ("deleted", DELETED), ("new", ADDED)]
    markdown = (report.path / "report.md").read_text()
    assert "# Corpus refresh" in markdown and ADDED in markdown and DELETED in markdown and "enwiki-20240201" in markdown
    # Lineage: every refreshed artifact names the version it updated.
    refreshed_versions = report.manifest["stats"]["refreshed"]
    assert set(refreshed_versions) == {"documents", "passages", "bm25_index", "embeddings", "faiss_index"}
    for stage, change in refreshed_versions.items():
        assert change["from"] != change["to"]
        assert store.get(stage, change["to"]).manifest["inputs"]["previous"]["version"] == change["from"]
    assert refreshed_versions["passages"]["from"] == refreshed["versions"]["chunk"]


def test_unchanged_passages_were_not_reencoded_and_keep_their_vectors(refreshed):
    store, report = refreshed["store"], refreshed["report"]
    counts = report.manifest["stats"]
    assert sum(refreshed["calls"]) == counts["reencoded"] == counts["passages"]["new"] + counts["passages"]["changed"]
    old = store.get("embeddings", counts["refreshed"]["embeddings"]["from"]).read_table()
    new = store.get("embeddings", counts["refreshed"]["embeddings"]["to"]).read_table()
    old_by_pid = dict(zip(old.column("pid").to_pylist(), old.column("vector").to_pylist()))
    new_by_pid = dict(zip(new.column("pid").to_pylist(), new.column("vector").to_pylist()))
    unchanged = store.sql("SELECT id FROM refresh_changes WHERE level = 'passage'").column(0).to_pylist()
    kept = [pid for pid in new_by_pid if pid not in unchanged]
    assert len(kept) == counts["passages"]["unchanged"] > 0
    assert all(np.array(new_by_pid[pid], np.float32).tobytes() == np.array(old_by_pid[pid], np.float32).tobytes()
               for pid in kept)
    # The edited passage got a new vector; the catalog's embeddings view shows the refreshed table.
    edited = store.sql("SELECT id FROM refresh_changes WHERE level = 'passage' AND change = 'changed'").column(0)[0].as_py()
    assert new_by_pid[edited] != old_by_pid[edited]
    assert store.sql("SELECT count(*) FROM embeddings WHERE system = 'tiny'").column(0)[0].as_py() == new.num_rows


def test_the_faiss_index_drops_deleted_passages_and_finds_new_ones(refreshed):
    from tasks.compute import faiss_index
    from tasks.compute.embeddings import vectors_from_table
    from tasks.refresh.faiss_update import IDS_TABLE, pids_by_id

    store, stats = refreshed["store"], refreshed["report"].manifest["stats"]
    index_artifact = store.get("faiss_index", stats["refreshed"]["faiss_index"]["to"])
    index = faiss_index.load_index(index_artifact.subdir("index"))
    pids = pids_by_id(index_artifact.read_table(IDS_TABLE))
    passages = set(store.sql("SELECT pid FROM passages").column(0).to_pylist())
    deleted = set(store.sql("SELECT id FROM refresh_changes WHERE change = 'deleted' AND level = 'passage'").column(0).to_pylist())
    added = store.sql("SELECT id FROM refresh_changes WHERE change = 'new' AND level = 'passage'").column(0).to_pylist()
    assert index.ntotal == len(passages) and deleted and not deleted & passages
    embedded, vectors = vectors_from_table(store.get("embeddings", stats["refreshed"]["embeddings"]["to"]).read_table())
    everything = faiss_index.search(index, vectors.astype("float32"), index.ntotal, pids, embedded, by_id=True)
    assert set(everything.column("pid").to_pylist()) == passages  # every passage reachable, no deleted one
    own = faiss_index.search(index, vectors[[embedded.index(pid) for pid in added]].astype("float32"), 1, pids, added, by_id=True)
    assert own.column("pid").to_pylist() == added  # each new passage is its own nearest neighbour


def test_searches_serve_the_refreshed_indexes(refreshed):
    store, report = refreshed["store"], refreshed["report"]
    before = refreshed["searches_before"]
    assert not any("zebracorn" in h.text for h in before["zebracorn award"].hits)
    assert before["Alain Connes mathematician"].hits[0].title == DELETED

    edited = search("zebracorn award", system="bm25", k=5, store=store)
    assert edited.refresh == report.version and edited.hits[0].title == EDITED and "zebracorn" in edited.hits[0].text
    assert search("Aa River", system="bm25", k=3, store=store).hits[0].title == ADDED
    assert DELETED not in {h.title for h in search("Alain Connes mathematician", system="bm25", k=20, store=store).hits}

    dense = search("Aa River", k=100, store=store)  # the promoted encoder serves by default
    assert (dense.system, dense.encoder, dense.refresh) == ("tiny", refreshed["encoder"], report.version)
    titles = {h.title for h in dense.hits}
    assert ADDED in titles and DELETED not in titles and all(h.text for h in dense.hits)
    assert any("zebracorn" in h.text for h in dense.hits if h.title == EDITED)


def test_the_updated_bm25_index_ranks_as_one_built_from_scratch(refreshed, tmp_path):
    from tasks.bm25.index import build_bm25_index
    from tasks.bm25.search import bm25_search

    store, stats = refreshed["store"], refreshed["report"].manifest["stats"]
    passages = store.get("passages", stats["refreshed"]["passages"]["to"]).read_table(columns=["pid", "title", "text"])
    build_bm25_index(passages, tmp_path / "fresh", threads=1)
    updated = store.get("bm25_index", stats["refreshed"]["bm25_index"]["to"]).subdir("index")
    queries = [("1", "zebracorn award film"), ("2", "river in Switzerland"), ("3", "Super Bowl"), ("4", "the")]
    ours, fresh = (bm25_search(index, queries, k=50).to_pylist() for index in (updated, tmp_path / "fresh"))
    assert len(ours) == len(fresh) > 0
    score = lambda rows: sorted((r["qid"], r["pid"], round(r["score"], 4)) for r in rows)  # noqa: E731 (ties may swap)
    assert score(ours) == score(fresh)


def test_a_second_refresh_from_the_same_dump_writes_nothing(refreshed, capsys):
    before = _rows(ArtifactStore(refreshed["root"]))
    assert main(["--root", str(refreshed["root"]), "refresh", str(refreshed["config"]), "--dump", str(refreshed["new"])]) == 0
    assert "up to date" in capsys.readouterr().out
    assert _rows(ArtifactStore(refreshed["root"])) == before


# ------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("dump,message", [
    ("nothing-here-*.xml.bz2", "no file matches"),
    ("broken.xml.bz2", "cannot decompress"),
])
def test_bad_dumps_are_one_clear_line_and_register_nothing(built, capsys, dump, message):
    (built["folder"] / "broken.xml.bz2").write_bytes(b"BZh91AY&SY" + os.urandom(64))
    store = ArtifactStore(built["root"])
    before = _rows(store)
    code = main(["--root", str(built["root"]), "refresh", str(built["config"]), "--dump", str(built["folder"] / dump)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0] and dump in err[0], err  # names the file
    assert _rows(ArtifactStore(built["root"])) == before


def test_without_a_promoted_encoder_the_refresh_says_so(tmp_path):
    from tasks.refresh.state import promoted_model

    with pytest.raises(RuntimeError, match="no encoder has been promoted.*refresh.dense: false"):
        promoted_model(ArtifactStore(tmp_path))


# ------------------------------------------------------------------------------- deployments
def test_serve_registers_the_refresh_on_the_configs_cron(built):
    from prefect.utilities.callables import parameter_schema

    from flows.refresh import corpus_refresh
    from flows.serve import build_deployments

    deployments = {d.name: d for d in build_deployments([built["config"]], root=str(built["root"]))}
    refresh = deployments["refresh-test--corpus-refresh"]
    assert refresh.schedules[0].schedule.cron == "0 4 1,21 * *"
    assert refresh.parameters["config"]["refresh"]["examples"] == 3 and refresh.parameters["dump"] is None
    schema = parameter_schema(corpus_refresh).model_dump()
    assert {"config", "dump", "root"} <= set(schema["properties"])
    refresh_schema = schema["definitions"]["RefreshConfig"]["properties"]
    assert refresh_schema["lookback_days"]["default"] == 60 and "description" in refresh_schema["dump"]


# ------------------------------------------------------------------------------- locating dumps
class _Dumps(http.server.SimpleHTTPRequestHandler):
    requests: list[str] = []

    def do_GET(self):
        type(self).requests.append(self.path)
        if self.path.startswith("/error"):
            self.send_error(500, "broken")
            return
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture()
def http_dumps(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), partial(_Dumps, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Dumps.requests = []
    yield served, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_dated_url_is_tried_from_today_backwards_and_cached(http_dumps, tmp_path):
    served, base = http_dumps
    (served / "enwiki-20240601-pages.xml.bz2").write_bytes(b"june dump")
    (served / "enwiki-20240520-pages.xml.bz2").write_bytes(b"older dump")
    template = base + "/enwiki-{date}-pages.xml.bz2"
    found = locate_dump(template, tmp_path, tmp_path / "downloads", today=date(2024, 6, 3), lookback_days=30)
    assert found.path.read_bytes() == b"june dump" and found.date == "20240601" and found.url.endswith("20240601-pages.xml.bz2")
    assert _Dumps.requests == [f"/enwiki-2024060{d}-pages.xml.bz2" for d in (3, 2, 1)]
    again = locate_dump(template, tmp_path, tmp_path / "downloads", today=date(2024, 6, 3), lookback_days=30)
    assert again.path == found.path and len(_Dumps.requests) == 5  # 3 and 2 asked again, 1 from the cache
    assert expand_date(base + "/{date:%Y-%m-%d}/x", date(2024, 6, 1)).endswith("/2024-06-01/x")
    with pytest.raises(InputError, match=r"dates 20240530 to 20240531: no dump found"):
        locate_dump(template, tmp_path, tmp_path / "downloads", today=date(2024, 5, 31), lookback_days=1)
    with pytest.raises(InputError, match=r"/error/x.bz2: HTTP 500"):
        locate_dump(base + "/error/x.bz2", tmp_path, tmp_path / "downloads")
    assert not list((tmp_path / "downloads" / "refresh").glob(".*part"))  # no partial file left behind


def test_a_glob_takes_the_newest_dump_and_a_path_must_exist(tmp_path):
    for name in ("enwiki-20231101-a.xml.bz2", "enwiki-20240301-a.xml.bz2", "enwiki-20240101-a.xml.bz2"):
        (tmp_path / name).write_bytes(b"x")
    os.utime(tmp_path / "enwiki-20231101-a.xml.bz2", (2e9, 2e9))  # the newest file is not the newest dump
    assert locate_dump("enwiki-*-a.xml.bz2", tmp_path, tmp_path).path.name == "enwiki-20240301-a.xml.bz2"
    (tmp_path / "undated-1.xml").write_bytes(b"x")
    (tmp_path / "undated-2.xml").write_bytes(b"x")
    os.utime(tmp_path / "undated-1.xml", (2e9, 2e9))
    assert locate_dump(str(tmp_path / "undated-*.xml"), Path("/elsewhere"), tmp_path).path.name == "undated-1.xml"
    with pytest.raises(InputError, match="no file matches"):
        locate_dump("nothing-*.bz2", tmp_path, tmp_path)
    with pytest.raises(InputError, match="missing.xml.bz2: file: Wikipedia dump not found"):
        locate_dump("missing.xml.bz2", tmp_path, tmp_path)


# ------------------------------------------------------------------------------- FAISS updates
@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivfpq"])
def test_faiss_updates_remove_and_add_by_id_for_every_index_kind(kind):
    from tasks.compute import faiss_index
    from tasks.compute.embeddings import embeddings_table
    from tasks.refresh.faiss_update import pids_by_id, previous_ids, update_index

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((300, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    pids = [f"p{i}" for i in range(300)]
    previous = embeddings_table(pids, vectors)
    index = faiss_index.build_index(vectors, kind=kind, nlist=4, pq_m=16, nbits=4, nprobe=4)
    changed = vectors[:10][::-1].copy()  # p0..p9 get other vectors; p290..p299 go; q0..q4 come
    fresh = rng.standard_normal((5, 16)).astype(np.float32)
    current = embeddings_table(pids[:290] + [f"q{i}" for i in range(5)],
                               np.concatenate([changed, vectors[10:290], fresh]))
    updated, ids, stats = update_index(index, previous_ids(None, previous), previous, current)
    assert (stats["removed"], stats["added"], stats["kept"], updated.ntotal) == (20, 15, 280, 295)
    assert dict(zip(ids.column("pid").to_pylist(), ids.column("id").to_pylist()))["p3"] == 3  # a changed passage keeps its id
    assert ids.column("id").to_pylist()[-5:] == list(range(300, 305))                        # new ones take the next ids
    hits = faiss_index.search(updated, fresh, 1 if kind != "ivfpq" else 3, pids_by_id(ids), [f"q{i}" for i in range(5)],
                              by_id=True, nprobe=4)
    assert {f"q{i}" for i in range(5)} <= set(hits.column("pid").to_pylist())
    everything = faiss_index.search(updated, vectors, 295, pids_by_id(ids), pids, by_id=True, nprobe=4)
    assert not {f"p{i}" for i in range(290, 300)} & set(everything.column("pid").to_pylist())
    assert pa.compute.all(pa.compute.is_valid(everything.column("pid"))).as_py()
