"""What changed between two versions of a table, row by key: new, changed, deleted, unchanged.

Documents are compared by content hash and title, passages by title and text (what is indexed and
encoded). Vectorised with Arrow joins: no Python loop over the rows."""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

CHANGES = ("new", "changed", "deleted", "unchanged")


@dataclass(frozen=True)
class Diff:
    new: pa.Array
    changed: pa.Array
    deleted: pa.Array
    unchanged: pa.Array

    def counts(self) -> dict[str, int]:
        return {name: len(getattr(self, name)) for name in CHANGES}

    @property
    def touched(self) -> pa.Array:
        """Keys whose old row is gone: changed and deleted."""
        return pa.concat_arrays([self.changed, self.deleted])

    @property
    def fresh(self) -> pa.Array:
        """Keys whose row is to be (re)computed: new and changed."""
        return pa.concat_arrays([self.new, self.changed])

    @property
    def empty(self) -> bool:
        return not (len(self.new) or len(self.changed) or len(self.deleted))


def diff_tables(old: pa.Table, new: pa.Table, key: str, compare: list[str]) -> Diff:
    """Rows of `new` against rows of `old`, matched on `key` (unique on each side): a row is
    changed when any `compare` column differs (null counts as empty)."""
    columns = [key, *compare]
    for name, table in (("old", old), ("new", new)):
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise ValueError(f"diff: the {name} table lacks {missing}")
    left = new.select(columns).append_column("_in_new", pa.array([True] * new.num_rows, pa.bool_()))
    right = old.select(columns).rename_columns([key, *(f"_old_{c}" for c in compare)]) \
        .append_column("_in_old", pa.array([True] * old.num_rows, pa.bool_()))
    joined = left.join(right, keys=key, join_type="full outer")
    if pc.count_distinct(joined.column(key)).as_py() != joined.num_rows:  # a duplicate key multiplies rows
        raise ValueError(f"diff: {key} is not unique")
    in_new = pc.fill_null(joined.column("_in_new"), False)
    in_old = pc.fill_null(joined.column("_in_old"), False)
    same = pa.array([True] * joined.num_rows, pa.bool_())
    for c in compare:
        a = pc.fill_null(pc.cast(joined.column(c), pa.string()), "")
        b = pc.fill_null(pc.cast(joined.column(f"_old_{c}"), pa.string()), "")
        same = pc.and_(same, pc.equal(a, b))
    both = pc.and_(in_new, in_old)
    keys = joined.column(key)

    def where(mask) -> pa.Array:
        return pc.filter(keys, mask).combine_chunks().cast(pa.string())

    return Diff(new=where(pc.and_(in_new, pc.invert(in_old))),
                changed=where(pc.and_(both, pc.invert(same))),
                deleted=where(pc.and_(in_old, pc.invert(in_new))),
                unchanged=where(pc.and_(both, same)))


def diff_documents(old: pa.Table, new: pa.Table) -> Diff:
    return diff_tables(old, new, "doc_id", ["content_hash", "title"])


def diff_passages(old: pa.Table, new: pa.Table) -> Diff:
    return diff_tables(old, new, "pid", ["title", "text"])


def rows_with(table: pa.Table, column: str, values: pa.Array, keep: bool = True) -> pa.Table:
    """The rows whose `column` is (keep) or is not (not keep) one of `values`."""
    mask = pc.is_in(table.column(column), value_set=values.cast(table.schema.field(column).type))
    return table.filter(mask if keep else pc.invert(mask))
