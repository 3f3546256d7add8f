"""Finding the newer dump: a path, a glob (the newest match) or a URL (a `{date}` placeholder is tried
from today backwards), fetched into the downloads cache with urllib.

Every failure is an `InputError` naming the path, pattern or URL."""
from __future__ import annotations

import glob as globlib
import hashlib
import logging
import re
import urllib.error
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

from tasks.errors import InputError

logger = logging.getLogger("passage_forge")

_DATE_PLACEHOLDER = re.compile(r"\{date(?::([^{}]*))?\}")
_DATE_IN_NAME = re.compile(r"(?<!\d)(\d{8})(?!\d)")  # enwiki-20240601-pages-articles...
_GLOB_CHARS = set("*?[")
_NOT_THERE = (404, 410)  # a dated dump that does not exist (yet): try the day before


@dataclass(frozen=True)
class LocatedDump:
    path: Path            # the local file to read
    source: str           # what the user gave (path, pattern or URL template)
    url: str | None = None
    date: str | None = None


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


def locate_dump(spec: str, base_dir: Path, downloads: Path, *, today: date | None = None,
                lookback_days: int = 60, timeout_s: float = 60.0) -> LocatedDump:
    """The local file of `spec`: a URL is fetched into `downloads`; a relative path or glob starts
    at `base_dir`."""
    spec = spec.strip()
    if not spec:
        raise InputError("refresh.dump", "value", "empty dump source")
    if is_url(spec):
        return fetch_dump(spec, downloads, today=today or date.today(), lookback_days=lookback_days,
                          timeout_s=timeout_s)
    pattern = Path(spec).expanduser()
    if not pattern.is_absolute():
        pattern = base_dir / pattern
    if _GLOB_CHARS & set(spec):
        return LocatedDump(newest_match(str(pattern)), spec)
    if not pattern.is_file():
        raise InputError(pattern, "file", "Wikipedia dump not found")
    return LocatedDump(pattern.resolve(), spec)


def newest_match(pattern: str) -> Path:
    """The newest file matching `pattern`: the latest YYYYMMDD date in its name (dumps are named by
    date; copies lose their times), then the latest modification, then the name."""
    matches = [Path(p) for p in globlib.glob(pattern) if Path(p).is_file()]
    if not matches:
        raise InputError(pattern, "glob", "no file matches")

    def key(path: Path):
        dates = _DATE_IN_NAME.findall(path.name)
        return (max(dates) if dates else "", path.stat().st_mtime_ns, path.name)

    newest = max(matches, key=key)
    logger.info("refresh: %s matches %d file(s); the newest is %s", pattern, len(matches), newest.name)
    return newest.resolve()


def expand_date(template: str, day: date) -> str:
    return _DATE_PLACEHOLDER.sub(lambda m: day.strftime(m.group(1) or "%Y%m%d"), template)


def fetch_dump(template: str, downloads: Path, *, today: date, lookback_days: int = 60,
               timeout_s: float = 60.0) -> LocatedDump:
    """Download the newest dump a URL template names. With `{date}`, each day from `today` back
    `lookback_days` days is tried until the server has one (404/410: try the day before); a dated
    file already in the cache is used as it is (a dated dump never changes). Without it, the URL
    is fetched afresh."""
    dated = bool(_DATE_PLACEHOLDER.search(template))
    days = [today - timedelta(days=n) for n in range(lookback_days + 1)] if dated else [None]
    for day in days:
        url = expand_date(template, day) if day is not None else template
        target = _cache_path(downloads, url)
        if day is not None and target.is_file():
            logger.info("refresh: %s is in the downloads cache (%s)", url, target)
            return LocatedDump(target, template, url, day.strftime("%Y%m%d"))
        if _download(url, target, timeout_s, missing_ok=day is not None):
            return LocatedDump(target, template, url, day.strftime("%Y%m%d") if day is not None else None)
    raise InputError(template, f"dates {days[-1]:%Y%m%d} to {days[0]:%Y%m%d}",
                     "no dump found: the server answered 404 for every date")


def _cache_path(downloads: Path, url: str) -> Path:
    name = re.sub(r"[^A-Za-z0-9._-]", "_", url.rsplit("/", 1)[-1].split("?", 1)[0]) or "dump"
    return downloads / "refresh" / f"{hashlib.sha256(url.encode()).hexdigest()[:12]}-{name}"


def _download(url: str, target: Path, timeout_s: float, missing_ok: bool) -> bool:
    """Fetch `url` into `target` (whole or not at all: tasks.readers.download). False when the
    server says it has no such file and `missing_ok`."""
    from tasks.readers.download import download

    try:
        logger.info("refresh: downloading %s", url)
        download(url, target, timeout_s)
    except urllib.error.HTTPError as exc:
        if missing_ok and exc.code in _NOT_THERE:
            return False
        raise InputError(url, f"HTTP {exc.code}", f"cannot download the dump: {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:  # offline, refused, timed out, disk full
        reason = getattr(exc, "reason", exc)
        raise InputError(url, "download", f"cannot download the dump: {reason}") from None
    return True
