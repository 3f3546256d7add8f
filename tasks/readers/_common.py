"""Helpers shared by the readers: strict UTF-8, line iteration, JSON lines, id and field checks.

Every problem is raised as `InputError(path, location, message)`, where `location` names the
line, record or byte inside the file.
"""
from __future__ import annotations

import codecs
import hashlib
import json
from pathlib import Path
from typing import IO, Any, Iterator

from tasks.errors import InputError


def content_hash(text: str) -> str:
    """SHA-256 hex digest of the UTF-8 text (documents.content_hash)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def decode_line(raw: bytes, path: str | Path, line_no: int) -> str:
    """Decode one line strictly as UTF-8; an InputError names the line and the byte column."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(path, f"line {line_no}, byte {e.start + 1}",
                         f"not valid UTF-8 ({e.reason}: {raw[e.start:e.end]!r})") from None


def iter_lines(f: IO[bytes], path: str | Path) -> Iterator[tuple[int, str]]:
    """Yield (1-based line number, text) of a binary stream, split on b'\\n' ONLY.

    A trailing '\\r' is removed (CRLF files); other characters that str.splitlines would treat
    as line breaks (U+0085, U+2028, ...) stay inside the line.
    """
    for line_no, raw in enumerate(f, start=1):  # binary iteration splits on b"\n" only
        if raw.endswith(b"\n"):
            raw = raw[:-1]
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        yield line_no, decode_line(raw, path, line_no)


def parse_json_line(text: str, path: str | Path, line_no: int) -> dict:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(path, f"line {line_no}, column {e.colno}",
                         f"malformed JSON: {e.msg}") from None
    if not isinstance(obj, dict):
        raise InputError(path, f"line {line_no}", f"expected a JSON object, got {type(obj).__name__}")
    return obj


def iter_json_lines(f: IO[bytes], path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSONL stream."""
    for line_no, text in iter_lines(f, path):
        if not text.strip():
            continue
        yield line_no, parse_json_line(text, path, line_no)


def require_str(record: dict, field: str, path: str | Path, location: str,
                allow_empty: bool = False, coerce: bool = False) -> str:
    """record[field] as a string; missing, wrong type or (unless allowed) empty -> InputError.

    `coerce` accepts numbers too (ids written as integers) and returns their str().
    """
    if field not in record or record[field] is None:
        raise InputError(path, location, f"missing required field {field!r}")
    value = record[field]
    if coerce and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise InputError(path, location,
                         f"field {field!r} must be a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise InputError(path, location, f"empty {field!r}")
    return value


class SeenIds:
    """Remembers ids of one file to report duplicates (memory grows with the number of ids)."""

    def __init__(self, path: str | Path, kind: str):
        self.path = path
        self.kind = kind
        self._first: dict[str, str] = {}

    def add(self, value: str, location: str) -> None:
        first = self._first.get(value)
        if first is not None:
            raise InputError(self.path, location,
                             f"duplicate {self.kind} {value!r} (first seen at {first})")
        self._first[value] = location


class Utf8CheckedReader:
    """A binary file-like wrapper that validates UTF-8 while passing the bytes through.

    For parsers that read a stream themselves (ijson, ElementTree.iterparse): a bad byte raises
    InputError naming the byte offset and line. `position` tells how far the parser has read.
    """

    def __init__(self, raw: IO[bytes], path: str | Path):
        self._raw = raw
        self._path = path
        self._decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self.bytes_read = 0
        self.lines_read = 1  # line number of the last byte read so far (1-based)

    def read(self, size: int = -1) -> bytes:
        chunk = self._raw.read(size)
        try:
            self._decoder.decode(chunk, final=not chunk)
        except UnicodeDecodeError as e:
            # e.start indexes into the decoder's pending bytes + chunk; pending is at most 3 bytes.
            pending = len(e.object) - len(chunk)
            offset = self.bytes_read - pending + e.start
            line = self.lines_read + e.object[:e.start].count(b"\n")
            raise InputError(self._path, f"line {line}, byte offset {offset}",
                             f"not valid UTF-8 ({e.reason})") from None
        self.bytes_read += len(chunk)
        self.lines_read += chunk.count(b"\n")
        return chunk

    @property
    def position(self) -> str:
        return f"around line {self.lines_read} (byte {self.bytes_read} read)"


def open_maybe_bz2(path: str | Path) -> IO[bytes]:
    """Open a file for binary reading, decompressing bz2 when its magic bytes say so."""
    with open(path, "rb") as probe:
        magic = probe.read(3)
    if magic == b"BZh":
        import bz2
        return bz2.open(path, "rb")
    return open(path, "rb")


def as_str_list(value: Any, field: str, path: str | Path, location: str) -> list[str]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise InputError(path, location, f"field {field!r} must be a list of strings")
    return list(value)
