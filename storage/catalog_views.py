"""The catalog's views: one per table of each stage's latest version, so `SELECT strategy, count(*)
FROM negatives GROUP BY 1` reads the newest negatives' Parquet.

View naming: the default table of stage S is view "S"; a named table T is view "T". When that name
is already taken (by a stage registered earlier, i.e. with an older first artifact, or by the
catalog's own tables), the view is "S_T" instead. A stage whose artifacts carry a `variant`
(a mapping of column -> value in the manifest, e.g. one artifact per system) gets the latest
version of each variant in its views, unioned, with the variant's columns added where the table
lacks them.
"""
from __future__ import annotations

from pathlib import Path

from .hashing import canonical_json
from .manifest import parse_created_at

VIEWS_TABLE = "catalog_views"
VIEWS_SCHEMA = f"CREATE TABLE {VIEWS_TABLE} (view_name VARCHAR PRIMARY KEY, stage VARCHAR, versions VARCHAR[], table_name VARCHAR);"
Committed = dict[tuple[str, str], tuple[dict, Path]]  # (stage, version) -> (manifest, folder)


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _latest_per_variant(committed: Committed) -> list[tuple[str, list[tuple[str, dict, Path]]]]:
    """[(stage, [(version, manifest, path) latest of each variant])], stages by first appearance."""
    by_stage: dict[str, dict[str, tuple]] = {}
    first_seen: dict[str, tuple] = {}
    for (stage, version), (manifest, path) in committed.items():
        created = parse_created_at(manifest["created_at"])
        first_seen[stage] = min(first_seen.get(stage, (created, stage)), (created, stage))
        key = canonical_json(manifest.get("variant") or {})
        best = by_stage.setdefault(stage, {}).get(key)
        if best is None or (created, version) > (best[0], best[1]):
            by_stage[stage][key] = (created, version, manifest, path)
    ordered = sorted(by_stage, key=lambda s: first_seen[s])
    return [(s, [(v, m, p) for _, v, m, p in sorted(by_stage[s].values(), key=lambda t: canonical_json(t[2].get("variant") or {}))])
            for s in ordered]


def _select(glob: str, variant: dict, columns: set[str]) -> str:
    extra = "".join(f", {quote_literal(str(value))} AS {quote_ident(col)}"
                    for col, value in sorted(variant.items()) if col not in columns)
    return f"SELECT *{extra} FROM read_parquet({quote_literal(glob)})"


def create_views(con, committed: Committed, reserved: set[str]) -> None:
    """A view per table of each stage's latest version(s), recorded in VIEWS_TABLE (which `con`
    already has); `reserved`: the catalog's own table names, which no view takes."""
    used = {name.lower() for name in reserved} | {VIEWS_TABLE}
    for stage, latest in _latest_per_variant(committed):
        tables: dict[str, dict] = {}  # every variant's tables (one variant may write a named table others lack)
        for _, manifest, _ in latest:
            for table, info in manifest.get("tables", {}).items():
                tables.setdefault(table, info)
        # The default table first, so it keeps the stage's own name.
        for table in sorted(tables, key=lambda t: (not tables[t].get("default"), t)):
            info = tables[table]
            parts = [(v, m, p) for v, m, p in latest if m.get("tables", {}).get(table, {}).get("files")]
            if not parts:
                continue
            name = stage if info.get("default") else table
            if name.lower() in used:
                name = f"{stage}_{table}"
            if name.lower() in used:
                continue
            sub = "data" if info.get("default") else f"data/{table}"
            selects = []
            for _, manifest, path in parts:
                glob = str(Path(path) / sub / "*.parquet")
                columns = manifest["tables"][table].get("columns")
                if columns is None:  # a manifest from before tables recorded their columns
                    columns = [c[0] for c in con.execute(f"DESCRIBE SELECT * FROM read_parquet({quote_literal(glob)})").fetchall()]
                selects.append(_select(glob, manifest.get("variant") or {}, set(columns)))
            # DDL cannot take bound parameters; identifiers and literals are escaped, and both come
            # from validated stage/table names and our own paths.
            con.execute(f"CREATE VIEW {quote_ident(name)} AS " + " UNION ALL BY NAME ".join(selects))
            con.execute(f"INSERT INTO {VIEWS_TABLE} VALUES (?, ?, ?, ?)", [name, stage, [v for v, _, _ in parts], table])
            used.add(name.lower())
