"""What a stage shows in the Prefect UI besides its logs: a progress artifact while it runs (fed by
tasks.progress.report) and a summary once it is built (version, rows, stats, its plots). Both are
reports about the run, never part of the artifact: a failed UI call is logged, not raised.

Prefect's client retries a busy server's answers (429/502/503) and dropped connections with
bounded back-off (PREFECT_CLIENT_MAX_RETRIES), but not a refused first connection of a new client,
which every one of these calls is: that one (a server restarting) is retried here, boundedly."""
from __future__ import annotations

import base64
import json
import logging
import re
import time
from pathlib import Path
from typing import Callable

import httpx
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact

from storage import Artifact

logger = logging.getLogger("passage_forge")
MAX_IMAGE_BYTES = 256_000   # a plot is embedded in the summary (data URI) up to this size
TRIES = 3                   # a refused connection is tried again this often, at doubling intervals


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys are lowercase letters, digits and dashes ('train:dpr' -> 'train-dpr')."""
    return re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")


class StageProgress:
    """A `tasks.progress` listener: one progress artifact per stage run, at the percentage of the
    loop reporting now (its label and counts in the description), updated at most every
    `every_s` seconds of `clock` and always at 100%."""

    def __init__(self, key: str, stage: str, every_s: float = 2.0, clock: Callable[[], float] = time.monotonic):
        self.key, self.stage, self.every_s, self.clock = key, stage, every_s, clock
        self.artifact_id = None
        self.last = float("-inf")
        self.refused = 0     # refused connections in a row; the next try waits every_s * 2**refused
        self.failed = False

    def __call__(self, label: str, done: int, total: int) -> None:
        now = self.clock()
        interval = self.every_s * 2 ** self.refused
        if self.failed or ((done < total or self.refused) and now - self.last < interval):
            return
        self.last = now
        percent = min(100.0, 100.0 * done / total)
        description = f"{self.stage}: {label}: {done:,}/{total:,}"
        try:
            if self.artifact_id is None:
                self.artifact_id = create_progress_artifact(percent, key=self.key, description=description)
            else:
                update_progress_artifact(self.artifact_id, percent, description=description)
            self.refused = 0
        except httpx.ConnectError as exc:  # the loop goes on; a later report tries again
            self.refused += 1
            if self.refused >= TRIES:
                self._give_up(exc)
        except Exception as exc:  # the UI is a report: the stage goes on without it
            self._give_up(exc)

    def _give_up(self, exc: Exception) -> None:
        self.failed = True
        logger.warning("%s: progress artifact not updated (%s)", self.stage, exc)


def summary_markdown(stage_name: str, artifact: Artifact) -> str:
    m = artifact.manifest
    lines = [f"# {stage_name}: {artifact.stage} `{artifact.version}`", "",
             f"{'cache hit' if artifact.cache_hit else 'built'}; {m.get('rows', 0):,} rows, {m.get('bytes', 0):,} bytes; "
             f"folder `{artifact.path}`", ""]
    inputs = m.get("inputs") or {}
    if inputs:
        lines += ["Inputs: " + ", ".join(f"{k} = {v['stage']} `{v['version']}`" for k, v in inputs.items()), ""]
    tables = m.get("tables") or {}
    if tables:
        lines += ["| table | rows | bytes |", "|---|---:|---:|"]
        lines += [f"| {name} | {t.get('rows', 0):,} | {t.get('bytes', 0):,} |" for name, t in tables.items()]
        lines += ["", f"Query: `pforge sql \"select * from {artifact.stage} where version = '{artifact.version}' limit 10\"`", ""]
    stats = m.get("stats") or {}
    scalars = {k: v for k, v in stats.items() if isinstance(v, (int, float, str, bool)) or v is None}
    if scalars:
        lines += ["| stat | value |", "|---|---|"] + [f"| {k} | {_cell(v)} |" for k, v in scalars.items()] + [""]
    nested = {k: v for k, v in stats.items() if k not in scalars}
    if nested:
        text = json.dumps(nested, indent=1, default=str)
        lines += ["```json", text if len(text) < 6000 else text[:6000] + "\n...", "```", ""]
    lines += [_embedded(png) for png in sorted(artifact.path.rglob("*.png")) if png.stat().st_size <= MAX_IMAGE_BYTES]
    return "\n".join(lines)


def _cell(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _embedded(png: Path) -> str:
    return f"![{png.name}]({_data_uri(png)})\n"


def _data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


_PNG_LINK = re.compile(r"!\[([^\]]*)\]\(([^()\s]+\.png)\)")


def embed_images(markdown: str, folder: Path) -> str:
    """`markdown` (a report.md) with its relative PNG links (`![alt](figures/x.png)`, files under
    `folder`) as data URIs, since the UI cannot read the store's files. A link to anything else, to
    a file outside `folder`, to a missing one or to one over MAX_IMAGE_BYTES stays as it is."""
    root = Path(folder).resolve()

    def embed(match: re.Match) -> str:
        alt, target = match.groups()
        png = (root / target).resolve()
        if ":" in target or not png.is_relative_to(root) or not png.is_file() or png.stat().st_size > MAX_IMAGE_BYTES:
            return match.group(0)
        return f"![{alt}]({_data_uri(png)})"

    return _PNG_LINK.sub(embed, markdown)


def publish_summary(key: str, stage_name: str, artifact: Artifact, sleep=time.sleep) -> None:
    markdown = summary_markdown(stage_name, artifact)
    for attempt in range(TRIES):
        try:
            create_markdown_artifact(key=key, markdown=markdown,
                                     description=f"{stage_name}: {artifact.stage} {artifact.version}")
            return
        except httpx.ConnectError as exc:
            if attempt == TRIES - 1:
                logger.warning("%s: summary artifact not published (%s)", stage_name, exc)
                return
            sleep(2.0 ** attempt)
        except Exception as exc:  # as for progress: the artifact is committed; the UI note is optional
            logger.warning("%s: summary artifact not published (%s)", stage_name, exc)
            return
