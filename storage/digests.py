"""SHA-256 sidecars: `<name>.sha256` beside a file that no other record of the store describes: a
version's manifest.json (it records the digests of the version's other files, and cannot hold
its own) and the catalog. Written as `sha256sum` writes them, so `sha256sum -c` checks a
manifest's by hand too.

A sidecar may record several digests, any of which the file may have: the catalog's records the
file in place and its replacement while the replacement is renamed in, so a crash between the
two leaves no false alarm.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

from .atomic import atomic_write_text
from .hashing import file_sha256

SUFFIX = ".sha256"
_LINE = re.compile(r"([0-9a-f]{64})  (.+)")


def sidecar_of(path: Path) -> Path:
    return path.with_name(path.name + SUFFIX)


def write_sidecar(path: Path, digests: Iterable[str], *, tmp: Path | None = None) -> None:
    """Record `digests` (hex SHA-256) as those `path` may have; the sidecar appears whole or not
    at all (`tmp`: its temporary's name, where a clean-up knows it)."""
    atomic_write_text(sidecar_of(path), "".join(f"{digest}  {path.name}\n" for digest in digests), tmp=tmp)


def recorded_digests(path: Path) -> list[str] | None:
    """The digests `path`'s sidecar records; None when there is none (written before sidecars
    were). ValueError when the sidecar is not one (damaged)."""
    try:
        raw = sidecar_of(path).read_bytes()
    except FileNotFoundError:
        return None
    try:
        lines = [_LINE.fullmatch(line) for line in raw.decode("ascii").split("\n")[:-1]]
    except UnicodeDecodeError:
        lines = []
    if not raw.endswith(b"\n") or not lines or any(m is None or m.group(2) != path.name for m in lines):
        raise ValueError(f"not a record of the SHA-256 of {path.name}")
    return [m.group(1) for m in lines]


def digest_damage(path: Path) -> tuple[str, str] | None:
    """(the file's name, what is wrong) when `path` has none of the digests its sidecar records, or
    the sidecar is unreadable ((the sidecar's name, what)); None when it matches or has no sidecar."""
    try:
        digests = recorded_digests(path)
    except ValueError as exc:
        return sidecar_of(path).name, str(exc)
    if digests is None:
        return None
    if not path.is_file():
        return path.name, "missing"
    if file_sha256(path) not in digests:
        return path.name, f"SHA-256 differs from the one {sidecar_of(path).name} records"
    return None
