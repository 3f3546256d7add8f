"""The change report of a refresh: a `refresh_changes` table (one row per new, changed or deleted
document and passage), a `refresh_counts` table (every kind of change counted, unchanged included)
and report.md with the counts and a few examples of each change."""
from __future__ import annotations

import pyarrow as pa

from tasks.refresh.diff import CHANGES, Diff, rows_with

CHANGES_SCHEMA = pa.schema([("level", pa.string()), ("change", pa.string()), ("id", pa.string()),
                            ("doc_id", pa.string()), ("title", pa.string())])
COUNTS_SCHEMA = pa.schema([("level", pa.string()), ("change", pa.string()), ("count", pa.int64())])


def _rows(level: str, diff: Diff, key: str, new: pa.Table, old: pa.Table) -> pa.Table:
    parts = []
    for change in ("new", "changed", "deleted"):
        ids = getattr(diff, change)
        source = old if change == "deleted" else new  # a deleted row is described as it was
        found = rows_with(source, key, ids)
        parts.append(pa.table({"level": pa.array([level] * found.num_rows, pa.string()),
                               "change": pa.array([change] * found.num_rows, pa.string()),
                               "id": found.column(key), "doc_id": found.column("doc_id"),
                               "title": found.column("title")}, schema=CHANGES_SCHEMA))
    return pa.concat_tables(parts)


def change_tables(doc_diff: Diff, passage_diff: Diff, documents: pa.Table, previous_documents: pa.Table,
                  passages: pa.Table, previous_passages: pa.Table, reencoded: int | None) -> tuple[pa.Table, pa.Table]:
    """(refresh_changes, refresh_counts)."""
    changes = pa.concat_tables([
        _rows("document", doc_diff, "doc_id", documents, previous_documents),
        _rows("passage", passage_diff, "pid", passages, previous_passages),
    ])
    counts = [(level, change, n) for level, diff in (("document", doc_diff), ("passage", passage_diff))
              for change, n in diff.counts().items()]
    if reencoded is not None:
        counts.append(("passage", "reencoded", reencoded))
    table = pa.table({"level": [c[0] for c in counts], "change": [c[1] for c in counts],
                      "count": [c[2] for c in counts]}, schema=COUNTS_SCHEMA)
    return changes, table


def report_markdown(stats: dict, changes: pa.Table, examples: int) -> str:
    dump = stats["dump"]
    lines = ["# Corpus refresh", "",
             f"Dump: `{dump.get('url') or dump['path']}` (sha256 {dump['sha256'][:16]}"
             + (f", dated {dump['date']}" if dump.get("date") else "") + ")", "",
             "| level | " + " | ".join(CHANGES) + " |", "|---|" + "---:|" * len(CHANGES)]
    for level in ("documents", "passages"):
        counts = stats[level]
        lines.append(f"| {level} | " + " | ".join(f"{counts[c]:,}" for c in CHANGES) + " |")
    lines.append("")
    if stats.get("reencoded") is not None:
        lines.append(f"Passages re-encoded with the promoted encoder (dense_model {stats['encoder']}): "
                     f"{stats['reencoded']:,}; vectors carried over: {stats['carried_over']:,}.")
    else:
        lines.append("Dense index: not refreshed (refresh.dense: false).")
    lines.append("")
    lines.append("| artifact | from | to |")
    lines.append("|---|---|---|")
    for stage, change in stats["refreshed"].items():
        lines.append(f"| {stage} | {change['from']} | {change['to']}{'' if change['from'] != change['to'] else ' (unchanged)'} |")
    rows = changes.to_pylist()
    for level in ("document", "passage"):
        for change in ("new", "changed", "deleted"):
            picked = [r for r in rows if r["level"] == level and r["change"] == change][:examples]
            if not picked:
                continue
            lines += ["", f"## {change.capitalize()} {level}s (examples)", ""]
            lines += [f"- {r['title']} (`{r['id']}`)" for r in picked]
    return "\n".join(lines) + "\n"
