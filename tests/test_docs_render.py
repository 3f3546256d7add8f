"""The built site as a reader's browser shows it with no network: every page's Mermaid diagrams
render (the site serves Mermaid itself), and without that script they stay text (so the check is
proven); a large plan's diagrams keep their labels legible. A headless Chromium (docs/browser.py) opens the pages from disk, every host name but the
loopback address unresolvable. `make test` installs Debian's chromium-headless-shell as root
(CI is); without a Chromium the tests fail in CI and skip elsewhere."""
from __future__ import annotations

import os
import re

import pytest

from tasks.config import PROJECT_ROOT
from tests.conftest import running_in_ci
from tests.docs_scripts import build_site, docs_script

DOCS = PROJECT_ROOT / "docs"
PAGES_WITH_DIAGRAMS = ("getting-started", "configs/demo", "configs/squad-open", "configs/study")
# Material takes the `mermaid` class off each diagram's <pre> at once, and puts a <div class="mermaid">
# holding the drawing in its place once Mermaid has drawn it: an undrawn diagram is a <pre> of source.
AS_TEXT = "[...document.querySelectorAll('pre')].some(e => e.textContent.startsWith('flowchart'))"
RENDERED = (f"!({AS_TEXT}) && document.querySelectorAll('div.mermaid').length > 0 && "
            "[...document.querySelectorAll('div.mermaid')].every(d => d.getBoundingClientRect().height > 50)")


browser = docs_script("browser")


@pytest.fixture(scope="module")
def chromium():
    found = browser.find_chromium()
    if found is None:
        message = "no Chromium (apt-get install --no-install-recommends chromium-headless-shell; `make test` does as root)"
        if running_in_ci():
            pytest.fail(f"{message}; CI={os.environ['CI']}: the site must be opened in CI, not skipped", pytrace=False)
        pytest.skip(message)
    return found


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = tmp_path_factory.mktemp("rendered") / "site"
    code, log = build_site(PROJECT_ROOT, site)
    assert code == 0, log[-3000:]
    return site


def test_every_diagram_renders_offline(chromium, site):
    with browser.Browser(chromium) as page:
        for name in PAGES_WITH_DIAGRAMS:
            page.open((site / name / "index.html").as_uri())
            assert page.wait_for(RENDERED, timeout_s=30), f"{name}: a diagram is still text offline"


# Material draws each diagram in a closed shadow root; the test opens them to measure the labels.
OPEN_SHADOW_ROOTS = ("const attach = Element.prototype.attachShadow; "
                     "Element.prototype.attachShadow = function (o) { return attach.call(this, {...o, mode: 'open'}); };")
LABEL_HEIGHTS = ("[...document.querySelectorAll('div.mermaid')].map(d => d.shadowRoot ? "
                 "[...d.shadowRoot.querySelectorAll('.nodeLabel')].map(e => e.getBoundingClientRect().height) : [])")
LEGIBLE_PX = 12   # half the height Mermaid gives a label: a drawing scaled down to the page's width by at most 2


@pytest.mark.parametrize("name", ["configs/demo", "configs/squad-open", "configs/study", "getting-started"])
def test_a_large_plans_diagrams_keep_their_labels_legible(chromium, site, name):
    # Drawn whole, the study's 114 stages left labels of 2 or 3 pixels; in parts, none is below half size.
    with browser.Browser(chromium) as page:
        page.before_each_page(OPEN_SHADOW_ROOTS)
        page.open((site / name / "index.html").as_uri())
        assert page.wait_for(RENDERED, timeout_s=30), f"{name}: a diagram is still text offline"
        heights = page.evaluate(LABEL_HEIGHTS)
    assert heights and all(heights), f"{name}: a diagram without labels: {heights}"
    small = [(i, round(min(h), 1)) for i, h in enumerate(heights, 1) if min(h) < LEGIBLE_PX]
    assert not small, f"{name}: diagrams whose labels are under {LEGIBLE_PX} px: {small}"


def test_without_the_sites_mermaid_a_diagram_stays_text_offline(chromium, site):
    page_path = site / "getting-started" / "index.html"
    html = page_path.read_text(encoding="utf-8")
    stripped, removed = re.subn(r'<script src="[^"]*mermaid-[0-9.]+\.min\.js"></script>', "", html)
    assert removed == 1, "the page loads the site's own Mermaid once"
    bare = page_path.with_name("without-mermaid.html")
    bare.write_text(stripped, encoding="utf-8")
    with browser.Browser(chromium) as page:
        page.open(bare.as_uri(), settle_s=3)
        assert not page.wait_for(RENDERED, timeout_s=5)
        assert page.evaluate(AS_TEXT)
