"""The documentation speaks of the software and what was measured, never of the work that produced
it: no page under docs/, no README.md, no config (whose opening comment is its docs page's summary
and whose whole text the page shows) and no changelog names an issue by number, a session, or
carries a dated "where this stops" note. The check is proven on examples of each (it flags them and
passes their rewrites), then run on every page, listing each offending page and line."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tasks.config import PROJECT_ROOT
from tests.docs_scripts import docs_script

# What a page must not say, each matched across a line break (a phrase a paragraph wraps).
FORBIDDEN = {
    "an issue number": re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE),
    "a session": re.compile(r"\bsessions?\b", re.IGNORECASE),
    "a 'where this stops' note": re.compile(r"\bwhere\s+this\s+stops\b", re.IGNORECASE),
}


def checked_files() -> list[Path]:
    docs = sorted((PROJECT_ROOT / "docs").rglob("*.md"))
    configs = sorted((PROJECT_ROOT / "configs").glob("*.yaml"))
    top = [PROJECT_ROOT / name for name in ("README.md", "CHANGELOG.md") if (PROJECT_ROOT / name).exists()]
    return [*top, *docs, *configs]


def offences(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, the line) of every forbidden phrase in `text`, in order."""
    lines = text.splitlines()
    found = []
    for what, pattern in FORBIDDEN.items():
        for match in pattern.finditer(text):
            number = text.count("\n", 0, match.start()) + 1
            found.append((number, what, lines[number - 1].strip()))
    return sorted(found)


@pytest.mark.parametrize("bad", [
    "the adaptation recipe (issue 25; GPL's recipe)",
    "Issue 3 asks that a trained single dense model beat BM25.",
    "## CPU runtimes (issue 23, in progress)",
    "issue 9's bar: two-stage beats gold-only",
    "issues 24 and 25 say where their studies stop",
    "as in issue #14",
    "the bars of issue\n23 are not met",
    "another session's `pforge run` used a core",
    "a run of the last session: 21 minutes",
    "when the session ended",
    "in sessions of 3 hours",
    "**Where this stops (2026-11-28).** The classifier's bar is met",
    "what it takes. Where this\nstops: the ablations",
])
def test_the_check_flags_each_kind_of_remark(bad):
    assert offences(bad), bad


@pytest.mark.parametrize("good", [
    "the adaptation recipe (GPL's recipe)",
    "The bar: a trained single dense model must beat BM25 at top-1 and top-20 on unseen articles.",
    "## CPU runtimes",
    "measured 2026-11-29 on a Zen 5 EPYC: 4.36x",
    "Measured while a `pforge run configs/negatives.yaml` used about one of the 2 cores",
    "the ablations are not measured yet",
    "paper 003 passes BM25 with 70k gold questions; tissue 25 and reissue 3 are other words",
])
def test_the_check_passes_the_rewrites(good):
    assert offences(good) == [], good


def test_no_page_names_an_issue_a_session_or_where_its_work_stops():
    files = checked_files()
    assert PROJECT_ROOT / "README.md" in files and PROJECT_ROOT / "docs" / "index.md" in files
    assert any(p.parent.name == "configs" and p.suffix == ".yaml" for p in files)
    report = [f"{path.relative_to(PROJECT_ROOT).as_posix()}:{number}: {what}: {line[:160]}"
              for path in files for number, what, line in offences(path.read_text(encoding="utf-8"))]
    assert not report, ("pages that speak of issues or sessions instead of the software "
                        f"({len(report)}):\n" + "\n".join(report))


def test_the_changelog_keeps_its_form_and_the_site_page_is_a_copy_of_it():

    text = (PROJECT_ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^(#{1,3}) (.+)$", text, flags=re.MULTILINE)
    assert headings[0] == ("#", "Changelog")
    versions = [title for level, title in headings if level == "##"]
    assert versions[0] == "[Unreleased]" and "[0.1.0]" in versions, versions
    assert {title for level, title in headings if level == "###"} <= {
        "Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    gen = docs_script("generate")
    assert (PROJECT_ROOT / "docs" / "changelog.md").read_text(encoding="utf-8") == gen.changelog_page(), \
        "docs/changelog.md differs from CHANGELOG.md: run `make docs-generate`"
