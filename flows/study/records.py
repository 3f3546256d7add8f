"""A row's record: what a finished row measured, small enough to commit (tens of kilobytes), and
enough to rebuild every table without the artifacts: the per-question outcome over each split
(the first answer-bearing rank, from which top-k at every k and the paired bootstrap follow; or,
for corpora judged by qrels, each query's nDCG@10), the metrics, the config and the versions it
planned, the commit the code ran at, the machine, and every stage's build time.

The per-question outcomes are lists aligned with a question list kept once per question set
(`questions/<digest>.json`: each split's qids, sorted), so a record holds numbers, not ids."""
from __future__ import annotations

import hashlib
import json
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from storage.atomic import atomic_write_text
from tasks.config import PROJECT_ROOT

SCHEMA = 1
RANK = "first_hit_rank"          # answer-match corpora: 1-based rank of the first answer-bearing passage, None: none in the top 100
NDCG_AT_10 = "ndcg_cut_10"       # qrels corpora (BEIR): the query's nDCG@10
OUTCOME_DIGITS = 4               # nDCG values kept to 4 decimals
OUTCOME_SPLITS = ("dev", "test")  # the per-question outcomes kept (a corpus without them keeps what it has)
REPLACED = "replaced"            # records/replaced/: the records measured again kept, beside the ones now


def step_label(stage: dict) -> str:
    """A record's stage as its tables and prices name it: the step, or `CONFIG.yaml:STEP` for a
    step of another config's run that the row needed first (its generator, its teacher)."""
    config = stage.get("config")
    return f"{Path(config).name}:{stage['step']}" if config else stage["step"]


def question_digest(splits: dict[str, list[str]]) -> str:
    text = json.dumps({s: sorted(q) for s, q in sorted(splits.items())}, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def write_questions(folder: Path, splits: dict[str, list[str]]) -> str:
    """Keeps the question list once (`folder/questions/<digest>.json`); returns its digest."""
    digest = question_digest(splits)
    path = folder / "questions" / f"{digest}.json"
    if not path.is_file():
        atomic_write_text(path, json.dumps({"splits": {s: sorted(q) for s, q in sorted(splits.items())}},
                                           indent=0) + "\n")
    return digest


def read_questions(folder: Path, digest: str) -> dict[str, list[str]]:
    path = folder / "questions" / f"{digest}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))["splits"]
    except FileNotFoundError:
        raise ValueError(f"{path}: the question list a record names is missing") from None


def code_commit(repo: Path = PROJECT_ROOT) -> dict:
    """The commit the code runs at and whether its files differ from it (records and the local
    artifact root aside)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        changed = [line for line in git("status", "--porcelain", "--untracked-files=no").splitlines()
                   if not line[3:].startswith("studies/")]
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(changed)}


def file_safe(row_name: str) -> str:
    """Row names hold '(' and ':' (hybrid(gold-s1), nfcorpus:bm25): kept readable, made file-safe."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in row_name)


def record_path(folder: Path, row_name: str) -> Path:
    return folder / "records" / f"{file_safe(row_name)}.json"


def replaced_path(folder: Path, record: dict) -> Path:
    """Where a record that `--again` replaced is kept (`records/replaced/ROW@VERSION.json`): the
    tables set the row's two measurements side by side."""
    return folder / "records" / REPLACED / f"{file_safe(record['row'])}@{record.get('version') or 'unversioned'}.json"


def keep_replaced(folder: Path, record: dict) -> Path:
    path = replaced_path(folder, record)
    atomic_write_text(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def read_replaced(folder: Path) -> dict[tuple[str, str | None], dict]:
    """(row, version) -> the record `--again` replaced, for every one kept."""
    return {(r["row"], r.get("version")): r for r in _read_folder(folder / "records" / REPLACED).values()}


def write_record(folder: Path, record: dict) -> Path:
    record = {"schema": SCHEMA, "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), **record}
    path = record_path(folder, record["row"])
    atomic_write_text(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def read_records(folder: Path) -> dict[str, dict]:
    """row name -> its record, for every record under `folder/records/` (the replaced ones aside)."""
    return _read_folder(folder / "records")


def _read_folder(records: Path) -> dict[str, dict]:
    out = {}
    for path in sorted(records.glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not a record (line {exc.lineno}: {exc.msg})") from None
        if record.get("schema") != SCHEMA or "row" not in record:
            raise ValueError(f"{path}: not a record of schema {SCHEMA}")
        out[record["row"]] = record
    return out


def outcomes_by_split(record: dict, folder: Path) -> dict[str, dict[str, float | int | None]]:
    """split -> {qid: outcome} of a runs record (its question list joined back)."""
    outcomes = record["outcomes"]
    splits = read_questions(folder, outcomes["questions"])
    out = {}
    for split, values in outcomes["splits"].items():
        qids = splits[split]
        if len(qids) != len(values):
            raise ValueError(f"record {record['row']!r}: {len(values)} outcomes on {split}, its question list has "
                             f"{len(qids)}")
        out[split] = dict(zip(qids, values))
    return out
