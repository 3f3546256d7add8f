"""Shared helpers for the storage tests: subprocess scripts that use the store."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Build script run in a child: writes parquet, then signals readiness and sleeps (to be killed)
# or finishes. argv: root, mode ("hang" | "finish" | "die_before_catalog" | "gated"), ready_file,
# counter_file, then for "gated": go_file, marker_prefix. A "gated" build waits for go_file before
# it returns, and the child touches MARKER.waiting just before it asks for the version lock and
# MARKER.acquired once it holds it (the real lock, only traced).
CHILD = r'''
import contextlib, os, sys, time, json, signal
from pathlib import Path
import pyarrow as pa
from storage import ArtifactStore, write_table
root, mode, ready, counter = sys.argv[1:5]
store = ArtifactStore(Path(root))

if mode == "gated":
    import storage.store as store_module
    go, marker = sys.argv[5:7]
    real_lock = store_module.file_lock

    @contextlib.contextmanager
    def traced_lock(*args, **kwargs):
        Path(marker + ".waiting").touch()
        with real_lock(*args, **kwargs) as held:
            Path(marker + ".acquired").touch()
            yield held

    store_module.file_lock = traced_lock

def build(tmp):
    with open(counter, "a") as f:
        f.write(f"{os.getpid()}\n")
    write_table(tmp, pa.table({"x": pa.array(range(100), pa.int64())}))
    Path(ready).touch()
    if mode == "hang":
        time.sleep(60)
    elif mode == "finish":
        time.sleep(0.5)  # hold the version lock long enough for the other writer to queue
    elif mode == "gated":
        deadline = time.monotonic() + 60
        while not Path(go).exists():
            if time.monotonic() > deadline:
                raise TimeoutError("no go file")
            time.sleep(0.02)
    return {"stats": {"n": 100}}

if mode == "die_before_catalog":
    # Crash right after the rename, before the catalog insert.
    store.register = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
art = store.materialize("numbers", "v1", {"n": 100}, {}, build)
print(json.dumps({"version": art.version, "path": str(art.path), "cache_hit": art.cache_hit}))
'''


def spawn(root: Path, mode: str, ready: Path, counter: Path, *extra: Path | str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(root), mode, str(ready), str(counter),
                             *map(str, extra)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
