"""Pinned downloads of official input files: a known name -> (URL, sha256, size, file name), fetched
into a cache folder. The bytes are streamed to a temporary file beside the target and checked
against the pinned sha256 (and size) before an atomic rename, so the cache never holds a partial
or wrong file. Network failures surface as OSError; the caller knows which input was wanted."""
from __future__ import annotations

import hashlib
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

from storage.atomic import atomic_write
from tasks.errors import InputError
from storage.file_identity import file_sha256

CHUNK = 1 << 20


@dataclass(frozen=True)
class OfficialFile:
    name: str                 # the file name in the cache: the official one, which the configs use too
    url: str
    sha256: str
    size: int | None = None   # bytes; also stops a server that sends more than the pinned file


# Official sources of the inputs the example configs read (../shared/data/SOURCES.md).
# Cached under the same file names as in ../shared/data, so the ingest version (which hashes
# file name and content) is the same wherever the identical bytes come from.
OFFICIAL_FILES: dict[str, OfficialFile] = {
    # gensim's test sample of an English Wikipedia pages-articles dump, at the only commit touching it.
    "wikipedia-sample": OfficialFile(
        "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
        "https://raw.githubusercontent.com/piskvorky/gensim/a3e8a3fafc48554f03d21831d7b5bbf782e7c4ec/"
        "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
        "a53f4648dec40467ebdcbc7a1307eddb51fe6e28e9309f6ebde81ba0d04bea2d", 1_695_871),
    # BEIR's own download (its published md5 a89dba18a62ef92f7d323ec890a0d38d matches these bytes).
    "beir-nfcorpus": OfficialFile(
        "nfcorpus.zip", "https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets/nfcorpus.zip",
        "efe5be03f8c5b86a5870102d0599d227c8c6e2484328e68c6522560385671b0b", 2_448_432),
}


def official(name: str) -> OfficialFile:
    if name not in OFFICIAL_FILES:
        raise KeyError(f"unknown official file {name!r}; known: {sorted(OFFICIAL_FILES)}")
    return OFFICIAL_FILES[name]


def fetch(file: OfficialFile, dest_dir: str | Path, timeout: float = 60) -> Path:
    """dest_dir/file.name, downloaded from file.url unless a verified copy is already there.

    A checksum or size mismatch raises InputError naming the URL and both hashes, and leaves
    nothing in dest_dir; network failures raise OSError (urllib's URLError/HTTPError included)."""
    dest = Path(dest_dir) / file.name
    if dest.is_file() and file_sha256(dest) == file.sha256:
        return dest

    def pinned(actual: str | None, size: int) -> None:
        if actual != file.sha256 or (file.size is not None and size != file.size):
            expected_size = f" ({file.size:,} bytes)" if file.size is not None else ""
            got = f"{actual} ({size:,} bytes)" if actual is not None else f"more than {file.size:,} bytes"
            raise InputError(file.url, "sha256", f"checksum mismatch: expected {file.sha256}{expected_size}, got {got}")
    return download(file.url, dest, timeout, max_bytes=file.size, check=pinned)


def download(url: str, dest: Path, timeout: float = 60, max_bytes: int | None = None,
             check: Callable[[str | None, int], None] | None = None) -> Path:
    """`url` into `dest`, whole or not at all: streamed to a temporary file beside it, checked by
    `check(sha256, size)` (which raises to refuse it; sha256 is None when more than `max_bytes`
    came), then renamed into place. Network failures raise OSError (urllib's errors included)."""
    with atomic_write(dest) as out:
        actual, size = _stream(url, out, timeout, max_bytes)
        if check is not None:
            check(actual, size)
        elif actual is None:
            raise InputError(url, "size", f"more than {max_bytes:,} bytes")
        os.fchmod(out.fileno(), 0o644)  # a cache may be shared: readable by all, whatever the umask
    return dest


def _stream(url: str, out: BinaryIO, timeout: float, max_bytes: int | None) -> tuple[str | None, int]:
    """(sha256, bytes) of what `url` sends, written to `out`; sha256 None when it sent too much."""
    digest, size = hashlib.sha256(), 0
    # urlopen is looked up at call time: tests replace it to simulate being offline.
    with urllib.request.urlopen(url, timeout=timeout) as response:
        while chunk := response.read(CHUNK):
            size += len(chunk)
            if max_bytes is not None and size > max_bytes:
                return None, size
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest(), size
