"""Which trained encoder serves searches and corpus refreshes: promoting one (`pforge promote
VERSION`) and the catalog's record of promotions, the last of which is in force."""
from __future__ import annotations

import re
from pathlib import Path

from storage import Artifact, ArtifactStore, resolve_root

MODEL_STAGE = "dense_model"  # what `pforge promote` promotes


def promote(version: str, *, root: str | Path | None = None, note: str | None = None,
            store: ArtifactStore | None = None) -> dict:
    """Record a trained encoder as the one that serves searches and corpus refreshes
    (`pforge promote VERSION`).

    Args:
        version: a dense_model version, a unique prefix of one, or `dense_model:VERSION`.
        root: the artifact root (default: `$PFORGE_HOME`, else `./artifacts`); it must exist.
        note: why, kept with the promotion.
        store: an open store, instead of `root`.

    Returns:
        The promotion record, with seq, stage, version, promoted_at, note and the system that
        trained the encoder.

    Raises:
        ValueError: no dense_model version matches, or several do.
        RuntimeError: the artifact has no `model/` folder to serve.
        ReadOnlyStoreError: the root is read-only.
    """
    store = store or ArtifactStore(resolve_root(str(root) if root is not None else None), create=False)
    store.require_writable()
    artifact = resolve_model(store, version)
    if not (artifact.path / "model").is_dir():
        raise RuntimeError(f"{artifact.path}: {MODEL_STAGE} {artifact.version} has no model/ folder to serve")
    record = store.catalog.record_promotion(MODEL_STAGE, artifact.version, note)
    store.reconcile(force=True)
    return {**record, "system": artifact.manifest.get("parameters", {}).get("system")}


def promotions(store: ArtifactStore) -> list[dict]:
    """The catalog's promotions, oldest first (`pforge promote` without a version): dicts of
    seq, stage, version, promoted_at and note. The last one is in force."""
    table = store.sql("SELECT seq, stage, version, promoted_at, note FROM promotions ORDER BY seq")
    return table.to_pylist()


def latest_promotion(store: ArtifactStore, stage: str = MODEL_STAGE) -> str | None:
    """The version promoted last for `stage`, or None when nothing was promoted."""
    rows = store.sql("SELECT version FROM promotions WHERE stage = $1 ORDER BY seq DESC LIMIT 1", [stage])
    return rows.column(0)[0].as_py() if rows.num_rows else None


def resolve_model(store: ArtifactStore, version: str) -> Artifact:
    """The dense_model artifact that `version` names (a version, a unique prefix of one, or
    `dense_model:VERSION`)."""
    stage, _, wanted = version.rpartition(":")
    if stage and stage != MODEL_STAGE:
        raise ValueError(f"promote: {version!r} is not a {MODEL_STAGE} version (only trained encoders are promoted)")
    wanted = wanted.strip()
    if not wanted:
        raise ValueError("promote: no version given")
    # A version is a hex hash of this store's dense_model: a path (another store's folder, say) or a
    # name matches nothing, so it cannot reach the record.
    plain = re.fullmatch(r"[0-9a-f]+", wanted) is not None
    exact = store.get(MODEL_STAGE, wanted) if plain else None
    if exact is not None:
        return exact
    matches = sorted({row["version"] for row in store.list_artifacts(MODEL_STAGE)
                      if plain and row["version"].startswith(wanted)})
    if len(matches) == 1:
        return store.get(MODEL_STAGE, matches[0])
    if matches:
        raise ValueError(f"promote: {wanted!r} matches several {MODEL_STAGE} versions: {', '.join(matches)}")
    known = [row["version"] for row in store.list_artifacts(MODEL_STAGE)]
    raise ValueError(f"{store.root}: no {MODEL_STAGE} version {wanted!r}"
                     + (f"; known: {', '.join(known)}" if known else " (no trained encoder in this store)"))
