"""The record of promotions (`pforge promote`): which artifact serves searches and refreshes.

`<root>/promotions.jsonl` is the record: append-only, one JSON object a line (stage, version,
promoted_at, note), each append fsynced and made under the catalog's rebuild lock; the last
record is the one in force. Like the manifests, the record is the truth and the catalog's
`promotions` table its index, filled on every rebuild (seq numbers the records from 1); a catalog
built before the record last changed counts as stale, so the next open rebuilds it.

Each line also carries `sha256`, the SHA-256 of its other fields as canonical JSON, so a damaged
line is found on its own and the lines around it stay trusted (`check_ledger`, run by `pforge
verify`); a line written before lines carried one is read as before and counted as unchecked.
Readers take every line that parses as a record and skip the others (a line torn by a crash
mid-append, or garbled): they do not check digests, `pforge verify` does. `repair_ledger` (its
`--repair`) keeps every line that is a record, in order, and moves the damaged file aside, kept for
inspection. (Whole lines cut off the end of the file leave a shorter record that checks: each
line vouches for itself alone.)
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from .atomic import atomic_write
from .errors import write_error
from .fsutil import fsync_dir, fsync_file
from .hashing import canonical_json
from .locks import file_lock
from .manifest import parse_created_at
from .paths import CATALOG_LOCK, DAMAGED_PREFIX

PROMOTIONS_FILE = "promotions.jsonl"
PROMOTIONS_TABLE = "promotions"
DIGEST_FIELD = "sha256"
# The highest seq is the promotion in force. IF NOT EXISTS: a rebuild creates it once.
PROMOTIONS_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {PROMOTIONS_TABLE} (
    seq INTEGER NOT NULL,
    stage VARCHAR NOT NULL,
    version VARCHAR NOT NULL,
    promoted_at TIMESTAMP NOT NULL,
    note VARCHAR
);
"""


def ledger_path(root: Path) -> Path:
    return Path(root) / PROMOTIONS_FILE


def read_ledger(root: Path) -> bytes:
    """The record's bytes (empty when nothing was ever promoted)."""
    try:
        return ledger_path(root).read_bytes()
    except FileNotFoundError:
        return b""


def record_digest(record: dict) -> str:
    """The SHA-256 a line records: of its fields but the digest itself, as canonical JSON."""
    fields = {key: value for key, value in record.items() if key != DIGEST_FIELD}
    return hashlib.sha256(canonical_json(fields).encode("utf-8")).hexdigest()


def _as_promotion(record, seq: int) -> dict:
    """A parsed line as a promotion; KeyError, TypeError or ValueError when it is not one."""
    return {"seq": seq, "stage": str(record["stage"]), "version": str(record["version"]),
            "promoted_at": parse_created_at(record["promoted_at"]), "note": record.get("note")}


def parse_promotions(raw: bytes) -> list[dict]:
    """The records of promotions.jsonl in order, numbered from 1; a torn or foreign line is skipped."""
    out = []
    for line in raw.decode("utf-8", errors="replace").splitlines():
        try:
            out.append(_as_promotion(json.loads(line), len(out) + 1))
        except (ValueError, KeyError, TypeError):
            continue
    return out


def fill_promotions_table(con, promotions: list[dict]) -> None:
    con.execute(PROMOTIONS_SCHEMA)
    if promotions:
        con.executemany(f"INSERT INTO {PROMOTIONS_TABLE} VALUES (?, ?, ?, ?, ?)",
                        [[p["seq"], p["stage"], p["version"], p["promoted_at"], p["note"]] for p in promotions])


def append_promotion(root: Path, stage: str, version: str, note: str | None = None) -> dict:
    """Append a promotion, with its digest, to the record (fsynced, under the rebuild lock); the
    returned record has its seq. The caller rebuilds the catalog (see storage/catalog.py)."""
    record = {"stage": stage, "version": version,
              "promoted_at": datetime.now(timezone.utc).isoformat(timespec="microseconds"), "note": note}
    line = json.dumps({**record, DIGEST_FIELD: record_digest(record)}, sort_keys=True) + "\n"
    path = ledger_path(root)
    with file_lock(Path(root) / CATALOG_LOCK):
        existing = read_ledger(root)
        created = not path.exists()
        if existing and not existing.endswith(b"\n"):
            line = "\n" + line  # a torn last line (a crash mid-append) stays on its own line
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))
            os.fsync(fd)
        except OSError as exc:  # a torn line this leaves is skipped when read
            raise write_error(root, "recording the promotion", exc) from exc
        finally:
            os.close(fd)
        if created:
            fsync_dir(Path(root))
    return {"seq": len(parse_promotions(existing)) + 1, **record}


# -- checking and repairing ------------------------------------------------------------------
CUT_SHORT = "cut short: the file ends inside it"
NOT_A_RECORD = "not a promotion record (it does not parse)"
DIGEST_DIFFERS = "SHA-256 differs from the one the line records"


@dataclass
class LedgerCheck:
    """What `check_ledger` found in the record's lines."""
    unchecked: int = 0    # records written before lines carried a digest
    damaged: list[tuple[int, str]] = field(default_factory=list)  # (line number from 1, what is wrong)
    kept: list[bytes] = field(default_factory=list)  # every line that is a record, newline-terminated


def _line_problem(line: bytes) -> tuple[str | None, bool]:
    """(what is wrong with the line, or None; whether it carries a digest)."""
    try:
        record = json.loads(line.decode("utf-8"))
        _as_promotion(record, 0)
    except (ValueError, KeyError, TypeError):  # UnicodeDecodeError is a ValueError
        return NOT_A_RECORD, False
    if DIGEST_FIELD not in record:
        return None, False
    return (None if record[DIGEST_FIELD] == record_digest(record) else DIGEST_DIFFERS), True


def check_ledger(raw: bytes) -> LedgerCheck:
    """Every line of the record's bytes `raw`: a record whose digest matches, one without a digest
    (unchecked), or damage: not a record, cut short (the file ends inside it), or another digest."""
    check = LedgerCheck()
    lines = raw.split(b"\n")
    ends_inside = lines[-1] != b""  # the last line has no newline: the file may end inside it
    if not ends_inside:
        lines.pop()
    for number, line in enumerate(lines, 1):
        problem, digested = _line_problem(line)
        if problem == NOT_A_RECORD and ends_inside and number == len(lines):
            problem = CUT_SHORT
        if problem is not None:
            check.damaged.append((number, problem))
            continue
        check.kept.append(line + b"\n")
        check.unchecked += not digested
    return check


def checking_lock(root: Path, writable: bool) -> AbstractContextManager:
    """The rebuild lock, so a line being appended is never read half-written (none on a root this
    process cannot write: nothing appends there, and a lock file could not be made)."""
    return file_lock(Path(root) / CATALOG_LOCK) if writable else nullcontext()


@dataclass(frozen=True)
class LedgerRepair:
    """What `repair_ledger` did: the records kept, the lines dropped, where the damaged file went."""
    kept: int
    dropped: int
    aside: Path


def damaged_ledger_path(root: Path, stamp: str) -> Path:
    """Where a damaged record is moved aside: hidden, beside it, never deleted by the store."""
    return Path(root) / f"{DAMAGED_PREFIX}{PROMOTIONS_FILE}-{stamp}"


def repair_ledger(root: Path, stamp: str) -> LedgerRepair | None:
    """When the record has damaged lines: keep a copy of it aside (`damaged_ledger_path`), then
    replace it, atomically, by its lines that are records, in order (under the rebuild lock). A
    dropped line's promotion no longer counts: the last record kept is the one in force. None when
    nothing is damaged. The caller rebuilds the catalog."""
    path = ledger_path(root)
    with file_lock(Path(root) / CATALOG_LOCK):
        check = check_ledger(read_ledger(root))
        if not check.damaged:
            return None
        aside = damaged_ledger_path(root, stamp)
        shutil.copy2(path, aside)  # a copy first: a crash before the swap leaves the record as it was
        fsync_file(aside)
        with atomic_write(path) as out:
            out.write(b"".join(check.kept))
    return LedgerRepair(len(check.kept), len(check.damaged), aside)
