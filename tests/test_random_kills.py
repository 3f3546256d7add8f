"""Crash consistency at seeded random moments: `pforge run configs/tiny.yaml` SIGKILLed (its whole
session, ephemeral Prefect server included) at a moment drawn with `random.Random(SEED)`, then rerun.
After the kill the store lists only complete versions (each with its manifest and every file its
`files` record names, at the recorded size and SHA-256; no `.tmp-*` build folder; the catalog agrees);
the rerun exits 0, builds again nothing the killed run committed, stops whatever of the killed run's
session outlived it, and leaves a store equal to a clean run's that `pforge verify` passes.

The moments are fractions of the clean reference run's stage time (from its first stage's "running"
line to its last "(built)" one), counted from the killed run's own first "running" line: the
Prefect server's start before it (20-40 s of the 50-80 s here) and the exit after it write nothing
into the store, so a moment there would test no commit. Each of the MOMENTS is drawn within its
own third of that time, so the three spread over the early stages, the BM25 index and the
search and evaluation.

"Equal" is byte for byte but for what two clean runs already write differently. Measured on two
clean runs of configs/tiny.yaml (into fresh roots, one after the other): every Parquet file, the
evaluation's report.md and figures/*.png and the index's empty write.lock were identical; these
differed, and are left out:

- every manifest.json: `created_at`, `timings` (build_s) and each file record's `mtime_ns` (clocks);
- every manifest.json.sha256 (the manifest's digest, which covers those): compared as whether it
  matches its manifest;
- bm25_index's manifest: `stats.seconds`, `stats.index_seconds`, `stats.write_seconds` (clocks),
  and the `sha256` of its Lucene files;
- bm25_index's Lucene files (index/* but write.lock: segments_1, _0.si, _0.fdt, ...): the same
  names and sizes, 20 to 180 bytes apart. Lucene writes a random 16-byte id into each file's header
  (the segment id; segments_N a commit id too), which the file's CRC footer covers, and a timestamp
  into the .si file. They are compared by size; their content is checked through bm25_runs (the
  search over that index, compared byte for byte) and by `pforge verify` (their recorded digests).

benchmarks/random_kills.py runs the same checks at many more moments.
"""
import shutil

import pytest

from tests.crash_consistency import (differences, draw_moments, kill_and_resume, partial_listings, run_clean, snapshot,
                                     unfinished_folders_on_disk)
from tests.lifecycle import pforge_env

pytestmark = pytest.mark.usefixtures("shared_data")
SEED = 20261202
MOMENTS = 3


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    # One PREFECT_HOME for every run here: its database is migrated once, not per run.
    return pforge_env(tmp_path_factory.mktemp("prefect"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, env):
    """A clean run's store (its snapshot) and its stage time."""
    folder = tmp_path_factory.mktemp("reference")
    clean = run_clean(folder / "root", folder / "run.log", env)
    return clean, snapshot(clean.root)


@pytest.mark.parametrize("index", range(MOMENTS), ids=[f"moment-{i + 1}-of-{MOMENTS}" for i in range(MOMENTS)])
def test_a_run_killed_at_a_random_moment_resumes_into_the_clean_runs_store(reference, env, index, tmp_path):
    clean, expected = reference
    moment = draw_moments(SEED, MOMENTS, clean.stages_s)[index]
    killed, problems = kill_and_resume(expected, moment, tmp_path, env)
    assert problems == [], (f"killed {moment:.2f}s into the stages ({killed.where}); left {killed.left}", problems)


def test_the_checks_see_a_missing_file_a_changed_byte_and_a_folder_without_manifest(reference, tmp_path):
    """What the test above passes on is no blind spot: each check names the damage it exists for."""
    clean, expected = reference
    root = tmp_path / "root"
    shutil.copytree(clean.root, root)
    assert partial_listings(root) == unfinished_folders_on_disk(root) == differences(expected, snapshot(root)) == []
    (passages,) = root.glob("passages/*/data/part-00000.parquet")
    passages.unlink()
    (runs,) = root.glob("bm25_runs/*/data/part-00000.parquet")
    data = bytearray(runs.read_bytes())
    data[len(data) // 2] ^= 0xFF   # the same size: only a digest or a byte comparison sees it
    runs.write_bytes(bytes(data))
    (root / "documents" / "0123456789abcdef").mkdir()   # as a rename of an unfinished build would leave
    assert [line.split()[0] for line in unfinished_folders_on_disk(root)] == ["documents/0123456789abcdef:"]
    assert sorted(line.split()[0] for line in partial_listings(root)) == ["bm25_runs", "passages"]
    assert sorted(line.split()[0] for line in differences(expected, snapshot(root))) == ["bm25_runs", "passages"]
