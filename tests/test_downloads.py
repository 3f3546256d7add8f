"""Absent inputs are fetched from their official source (pinned sha256) into the downloads cache.
The "official sources" here are tiny files served by http.server on 127.0.0.1; the registries are
pointed at them. Seconds."""
from __future__ import annotations

import bz2
import hashlib
import io
import json
import re
import socket
import threading
import zipfile
from collections import Counter
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from storage import ArtifactStore
from tasks.config import PROJECT_ROOT, PipelineConfig, load_config
from tasks.engine import run_stage
from tasks.errors import InputError
from tasks.readers import download, squad as squad_mod
from tasks.readers import stages as ingest
from tasks.readers.download import OFFICIAL_FILES, OfficialFile

WIKI_NAME = OFFICIAL_FILES["wikipedia-sample"].name
WIKI_XML = ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10">\n'
            '<page><title>Foo</title><ns>0</ns><id>1</id><revision><id>9</id>'
            '<text xml:space="preserve">\'\'\'Foo\'\'\' is a [[bar|thing]] in Paris.</text></revision></page>\n'
            '<page><title>Baz</title><ns>0</ns><id>2</id><revision><id>9</id>'
            '<text xml:space="preserve">Baz is a town.</text></revision></page>\n</mediawiki>\n')
SQUAD = {"version": "1.1", "data": [{"title": "T", "paragraphs": [
    {"context": "Tea is made from leaves.", "qas": [
        {"id": "q1", "question": "What is tea made from?", "answers": [{"answer_start": 16, "text": "leaves"}]}]}]}]}


def _beir_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:  # laid out as BEIR's nfcorpus.zip: nfcorpus/...
        zf.writestr("nfcorpus/corpus.jsonl", '{"_id": "d1", "title": "T", "text": "hello"}\n'
                                             '{"_id": "d2", "title": "U", "text": "world"}\n')
        zf.writestr("nfcorpus/queries.jsonl", '{"_id": "q1", "text": "hi?"}\n')
        zf.writestr("nfcorpus/qrels/test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t2\n")
    return buf.getvalue()


class Server:
    """A folder served on 127.0.0.1 (a free port, a thread), counting GET requests per path."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.requests: Counter[str] = Counter()
        requests = self.requests

        class Handler(SimpleHTTPRequestHandler):
            def do_GET(self):
                requests[self.path] += 1
                super().do_GET()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(folder)))
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def publish(self, name: str, data: bytes) -> OfficialFile:
        (self.folder / name).write_bytes(data)
        return OfficialFile(name, self.url(name), hashlib.sha256(data).hexdigest(), len(data))

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def server(tmp_path, monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):  # 127.0.0.1 directly
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "served").mkdir()
    srv = Server(tmp_path / "served")
    yield srv
    srv.close()


@pytest.fixture
def official(server, monkeypatch, tmp_path):
    """The registries pointed at the served files; the cache in tmp_path/downloads."""
    monkeypatch.delenv("PFORGE_DATA", raising=False)
    monkeypatch.setenv("PFORGE_DOWNLOADS", str(tmp_path / "downloads"))
    files = {"wikipedia-sample": server.publish(WIKI_NAME, bz2.compress(WIKI_XML.encode())),
             "beir-nfcorpus": server.publish("nfcorpus.zip", _beir_zip())}
    for name, f in files.items():
        monkeypatch.setitem(OFFICIAL_FILES, name, f)
    squad = server.publish("dev-v1.1.json", json.dumps(SQUAD).encode())
    monkeypatch.setitem(squad_mod.SQUAD_URLS, "dev-v1.1", (squad.url, squad.sha256))
    return files


def beir_config(data_root: Path) -> PipelineConfig:
    return PipelineConfig.model_validate({"name": "dl", "data": {
        "data_root": str(data_root),
        "beir": {"path": "beir/nfcorpus.zip", "download": "beir-nfcorpus"},
        "wikipedia": [{"path": f"wikipedia/{WIKI_NAME}", "download": "wikipedia-sample"}]}})


def ingest_all(cfg: PipelineConfig, store: ArtifactStore) -> dict:
    documents, questions = ingest.stages(cfg, [])  # planning hashes (and so fetches) the inputs
    docs = run_stage(store, documents, {})
    return {"documents": docs, "questions": run_stage(store, questions, {"ingest_documents": docs})}


def cached(tmp_path) -> list[str]:
    folder = tmp_path / "downloads"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_absent_inputs_are_fetched_verified_read_and_then_cached(server, official, tmp_path):
    (tmp_path / "empty").mkdir()
    store = ArtifactStore(tmp_path / "store")
    first = ingest_all(beir_config(tmp_path / "empty"), store)
    assert server.requests == {f"/{WIKI_NAME}": 1, "/nfcorpus.zip": 1}
    assert cached(tmp_path) == sorted([WIKI_NAME, "nfcorpus.zip"])  # no temporary files left
    for f in official.values():
        assert (tmp_path / "downloads" / f.name).read_bytes() == (server.folder / f.name).read_bytes()
    docs = first["documents"].read_table(columns=["doc_id", "source"]).to_pylist()
    assert sorted(d["doc_id"] for d in docs) == ["d1", "d2", "wiki:1", "wiki:2"]
    assert first["questions"].read_table("questions").column("qid").to_pylist() == ["q1"]

    # Second run: planned and read from the cache, no request, same versions (cache hits).
    again = ingest_all(beir_config(tmp_path / "empty"), store)
    assert server.requests == {f"/{WIKI_NAME}": 1, "/nfcorpus.zip": 1}
    assert {k: a.version for k, a in again.items()} == {k: a.version for k, a in first.items()}
    assert all(a.cache_hit for a in again.values())

    # The same bytes under data_root give the same ingest versions: identity is name + content.
    for sub, f in (("wikipedia", official["wikipedia-sample"]), ("beir", official["beir-nfcorpus"])):
        (tmp_path / "data" / sub).mkdir(parents=True)
        (tmp_path / "data" / sub / f.name).write_bytes((server.folder / f.name).read_bytes())
    local = ingest.stages(beir_config(tmp_path / "data"), [])
    downloaded = ingest.stages(beir_config(tmp_path / "empty"), [])
    assert [s.params.hashed()["files"] for s in local] == [s.params.hashed()["files"] for s in downloaded]
    assert ({k: a.version for k, a in ingest_all(beir_config(tmp_path / "data"), store).items()}
            == {k: a.version for k, a in first.items()})
    assert sum(server.requests.values()) == 2

    # A damaged cached copy is not trusted: it is fetched again.
    (tmp_path / "downloads" / "nfcorpus.zip").write_bytes(b"damaged")
    ingest.stages(beir_config(tmp_path / "empty"), [])
    assert server.requests["/nfcorpus.zip"] == 2


def test_embedded_default_without_the_data_folder_fetches_each_input(server, official, tmp_path, monkeypatch):
    # configs/squad-open.yaml (`make demo`) with no data folder: SQuAD falls back to the official
    # dev-v1.1.json (the partial file is a derivative), the Wikipedia sample to gensim's copy.
    monkeypatch.setenv("PFORGE_DATA", str(tmp_path / "no-such-data"))
    cfg = load_config(PROJECT_ROOT / "configs" / "squad-open.yaml")
    params = ingest.data_params(cfg.data)
    assert params.files == {"dev-v1.1.json": official_sha(server, "dev-v1.1.json"),
                            WIKI_NAME: official["wikipedia-sample"].sha256}
    assert server.requests == {"/dev-v1.1.json": 1, f"/{WIKI_NAME}": 1}
    assert sorted(d["doc_id"] for d in ingest.iter_documents(cfg.data)) == ["squad:T", "wiki:1", "wiki:2"]
    assert sum(server.requests.values()) == 2  # reading used the cache
    nf = load_config(PROJECT_ROOT / "configs" / "nfcorpus.yaml")
    assert nf.data.beir.download == "beir-nfcorpus" and OFFICIAL_FILES["beir-nfcorpus"].name == Path(nf.data.beir.path).name


def official_sha(server, name: str) -> str:
    return hashlib.sha256((server.folder / name).read_bytes()).hexdigest()


def test_checksum_mismatch_is_refused_and_leaves_nothing_in_the_cache(server, official, tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    wiki = official["wikipedia-sample"]
    monkeypatch.setitem(OFFICIAL_FILES, "wikipedia-sample", OfficialFile(wiki.name, wiki.url, "0" * 64, wiki.size))
    with pytest.raises(InputError) as info:
        ingest.stages(beir_config(tmp_path / "empty"), [])
    msg = str(info.value)
    assert wiki.url in msg and "0" * 64 in msg and wiki.sha256 in msg and "checksum mismatch" in msg
    assert cached(tmp_path) == ["nfcorpus.zip"]  # the BEIR zip was fine; nothing of the dump, no .part

    # A server sending more than the pinned size is cut off, and nothing is kept either.
    monkeypatch.setitem(OFFICIAL_FILES, "wikipedia-sample", OfficialFile(wiki.name, wiki.url, wiki.sha256, 10))
    with pytest.raises(InputError, match=r"checksum mismatch.*\(10 bytes\), got more than 10 bytes"):
        download.fetch(OFFICIAL_FILES["wikipedia-sample"], tmp_path / "downloads")
    assert cached(tmp_path) == ["nfcorpus.zip"]


def test_unreachable_source_names_the_url_and_where_to_put_the_file(server, official, tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    beir = official["beir-nfcorpus"]
    dead = f"http://127.0.0.1:{port}/nfcorpus.zip"
    monkeypatch.setitem(OFFICIAL_FILES, "beir-nfcorpus", OfficialFile(beir.name, dead, beir.sha256, beir.size))
    with pytest.raises(InputError) as info:
        ingest.stages(beir_config(tmp_path / "empty"), [])
    msg = str(info.value)
    assert info.value.path == str(tmp_path / "empty" / "beir" / "nfcorpus.zip")
    assert f"downloading {dead} failed" in msg and "BEIR dataset not found" in msg
    assert f"at {tmp_path / 'empty' / 'beir' / 'nfcorpus.zip'} or at {tmp_path / 'downloads' / 'nfcorpus.zip'}" in msg
    assert beir.sha256 in msg

    # An HTTP error (the file is not on the server) reads the same, with the status.
    missing = server.url("gone.zip")
    monkeypatch.setitem(OFFICIAL_FILES, "beir-nfcorpus", OfficialFile(beir.name, missing, beir.sha256, beir.size))
    with pytest.raises(InputError, match=rf"downloading {missing} failed: HTTP Error 404"):
        ingest.stages(beir_config(tmp_path / "empty"), [])
    assert "nfcorpus.zip" not in cached(tmp_path)


def test_naming_a_download_leaves_the_versions_as_they_were(official, tmp_path):
    # `download` says where an absent file would come from; `files` pins the bytes. So a config
    # that gains `download:` keeps the versions its artifacts already have.
    for sub, f in (("wikipedia", official["wikipedia-sample"]), ("beir", official["beir-nfcorpus"])):
        (tmp_path / "data" / sub).mkdir(parents=True)
        (tmp_path / "data" / sub / f.name).write_text("local bytes")
    plain = PipelineConfig.model_validate({"name": "dl", "data": {
        "data_root": str(tmp_path / "data"), "beir": {"path": "beir/nfcorpus.zip"},
        "wikipedia": [f"wikipedia/{WIKI_NAME}"]}})
    named = beir_config(tmp_path / "data")
    assert named.data.beir.download and named.data.wikipedia_dumps()[0].download
    assert [s.params.hashed() for s in ingest.stages(named, [])] == [s.params.hashed() for s in ingest.stages(plain, [])]
    assert cached(tmp_path) == []  # present under data_root: nothing fetched


def test_absent_file_without_download_is_not_fetched(server, official, tmp_path):
    (tmp_path / "empty").mkdir()
    cfg = PipelineConfig.model_validate({"name": "dl", "data": {
        "data_root": str(tmp_path / "empty"), "beir": {"path": "beir/nfcorpus.zip"}, "wikipedia": ["w.xml.bz2"]}})
    with pytest.raises(InputError, match=r"nfcorpus\.zip: file: BEIR dataset not found \(and no download configured\)"):
        ingest.data_params(cfg.data)
    assert sum(server.requests.values()) == 0 and cached(tmp_path) == []


def test_pinned_hashes_are_those_of_the_shared_copies(shared_data):
    for name, sub in (("wikipedia-sample", "wikipedia"), ("beir-nfcorpus", "beir")):
        f = OFFICIAL_FILES[name]
        local = shared_data / sub / f.name
        assert hashlib.sha256(local.read_bytes()).hexdigest() == f.sha256 and local.stat().st_size == f.size
    # The shared SQuAD file is the official dev set with questions held out, so its bytes cannot
    # check the pin; the hash of the official file it was made from is recorded beside it.
    sources = (shared_data / "SOURCES.md").read_text()
    official = re.search(r"`dev-v1\.1\.json` \(([\d,]+) bytes, sha256\s+`([0-9a-f]{64})`", sources)
    assert official, "SOURCES.md no longer records the official dev-v1.1.json hash"
    assert squad_mod.SQUAD_URLS["dev-v1.1"][1] == official.group(2)
    partial_file = shared_data / "squad" / "dev-v1.1-partial.json"
    recorded = re.search(r"`squad/dev-v1\.1-partial\.json` \| ([\d,]+) \| `([0-9a-f]{64})`", sources)
    assert recorded and hashlib.sha256(partial_file.read_bytes()).hexdigest() == recorded.group(2)
    assert partial_file.stat().st_size == int(recorded.group(1).replace(",", ""))
