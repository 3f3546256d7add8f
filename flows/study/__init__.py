"""The corpus-scale study: rows measured in pieces, by whoever holds a machine, with nothing of
value kept only on a machine. `definition` reads a study's rows, `records` writes and reads the
small per-row records committed to the repository, `machine` describes the CPU they ran on,
`estimate` prices a row on this CPU from those records, `status` says where each row stands,
`runner` builds rows within a time budget and `tables` builds every table from the records alone.
"""
