"""Wikipedia pages-articles XML dump reader (bz2 or plain XML), wikitext -> plain prose.

Streams the dump with ElementTree.iterparse and clears each page after use. Keeps namespace-0,
non-redirect pages; the wikitext is rendered with mwparserfromhell to paragraphs of prose, in the
spirit of DPR's preprocessing (semi-structured data dropped):

- dropped: templates (infoboxes, navboxes, citations), tables, <ref>/<references> and other
  non-prose tags (math, gallery, ...), comments, files/images/media, categories, interlanguage
  links, external-link URLs, magic words (__TOC__), section headings, and the boilerplate
  sections "References", "External links", "See also", "Notes", "Further reading", ...;
- kept: wikilinks as their text, bold/italic text, list items as text, HTML entities decoded;
- whitespace inside a paragraph is collapsed to single spaces; paragraphs are joined by "\\n\\n".

Pages that are empty after cleaning are skipped and counted in `stats`.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterator

import mwparserfromhell
from mwparserfromhell.nodes import (Argument, Comment, ExternalLink, Heading, HTMLEntity, Tag,
                                    Template, Text, Wikilink)

from tasks.errors import InputError
from tasks.readers._common import SeenIds, Utf8CheckedReader, content_hash, open_maybe_bz2

# Tags whose contents are not prose.
_DROP_TAGS = {
    "ref", "references", "table", "gallery", "math", "chem", "ce", "timeline", "imagemap",
    "score", "syntaxhighlight", "source", "pre", "graph", "templatedata", "mapframe",
    "maplink", "inputbox", "categorytree", "hiero", "div", "noinclude", "includeonly",
}
_BREAK_TAGS = {"br", "hr"}
_DROP_LINK_NAMESPACES = {"file", "image", "media", "category"}
# Interlanguage prefixes look like language codes: "de", "simple", "zh-min-nan", "be-x-old".
_LANG_PREFIX = re.compile(r"^[a-z]{2,3}(-[a-z0-9]+)*$|^simple$")
_BOILERPLATE_SECTIONS = {
    "references", "external links", "see also", "notes", "further reading", "bibliography",
    "sources", "citations", "footnotes", "notes and references", "references and notes",
    "external links and references", "literature", "works cited",
}
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
# Pre-pass (before mwparserfromhell): comments and references never hold prose, and removing them
# first avoids the parser's failures on unbalanced markup inside refs (it then leaves raw text).
_COMMENT = re.compile(r"<!--.*?(?:-->|$)", re.S)
_REF = re.compile(r"<ref\b[^>]*?/>|<ref\b[^>]*>.*?</ref\s*>", re.S | re.I)
_REFERENCES = re.compile(r"<references\b[^>]*?/>|<references\b[^>]*>.*?</references\s*>",
                         re.S | re.I)
# Post-pass: markup that mwparserfromhell left as text (it gives up on some unbalanced markup).
_LEFT_TEMPLATE = re.compile(r"\{\{(?:(?!\{\{|\}\}).)*\}\}", re.S)
_LEFT_TABLE = re.compile(r"\{\|(?:(?!\{\||\|\}).)*\|\}", re.S)
_LEFT_LINK = re.compile(r"\[\[([^\[\]]*)\]\]")
_LEFT_TAG = re.compile(r"</?[a-zA-Z][a-zA-Z0-9]*(?:\s[^<>]*)?/?>")
_LEFT_QUOTES = re.compile(r"'{2,}")
_LEFT_REF = re.compile(r"<ref\b[^>]*?/>|<ref\b[^>]*>.*?</ref\s*>|</?ref\b[^>]*>", re.S | re.I)
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n\s*")
_SPACES = re.compile(r"\s+")
_EMPTY_PARENS = re.compile(r"\(\s*[,;:]?\s*\)")
_SPACE_BEFORE_PUNCT = re.compile(r" +([,.;:)])")
_OPEN_PAREN_SPACE = re.compile(r"\( +")
_LEADING_PUNCT_IN_PARENS = re.compile(r"\(\s*[,;]\s*")


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _drop_link(title: str) -> bool:
    title = title.strip()
    if title.startswith(":"):  # [[:Category:X]] is a visible link to that page
        return False
    if ":" not in title:
        return False
    prefix = title.split(":", 1)[0].strip().lower()
    return prefix in _DROP_LINK_NAMESPACES or bool(_LANG_PREFIX.match(prefix))


def _render(code) -> str:
    out: list[str] = []
    for node in code.nodes:
        if isinstance(node, Text):
            out.append(node.value)
        elif isinstance(node, Wikilink):
            title = str(node.title)
            if _drop_link(title):
                continue
            if node.text is not None:
                out.append(_render(node.text))
            else:
                out.append(_render(node.title).lstrip(":"))
        elif isinstance(node, HTMLEntity):
            try:
                out.append(node.normalize())
            except (ValueError, OverflowError):
                pass
        elif isinstance(node, Tag):
            name = str(node.tag).strip().lower()
            if name in _DROP_TAGS:
                continue
            if name in _BREAK_TAGS:
                out.append("\n")
            elif node.contents is not None:
                out.append(_render(node.contents))
        elif isinstance(node, ExternalLink):
            if node.title is not None:
                out.append(_render(node.title))
        elif isinstance(node, (Template, Comment, Argument, Heading)):
            continue
        # anything else (e.g. parser-function leftovers) is dropped
    return "".join(out)


def _sub_until_stable(pattern: re.Pattern, repl, text: str) -> str:
    while True:
        new = pattern.sub(repl, text)
        if new == text:
            return text
        text = new


def _left_link(m: re.Match) -> str:
    inner = m.group(1)
    if _drop_link(inner.split("|", 1)[0]):
        return ""
    return inner.rsplit("|", 1)[-1].lstrip(":")


def _remove_leftovers(text: str) -> str:
    if "<" in text:
        text = _LEFT_REF.sub("", text)
    if "{" in text:
        text = _sub_until_stable(_LEFT_TEMPLATE, "", text)
        text = _sub_until_stable(_LEFT_TABLE, "", text)
    if "[[" in text:
        text = _sub_until_stable(_LEFT_LINK, _left_link, text)
    if "<" in text:
        text = _LEFT_TAG.sub("", text)
    return _LEFT_QUOTES.sub("", text)


def _clean_paragraph(p: str) -> str:
    p = _SPACES.sub(" ", p).strip()
    p = _EMPTY_PARENS.sub("", p)
    p = _LEADING_PUNCT_IN_PARENS.sub("(", p)
    p = _OPEN_PAREN_SPACE.sub("(", p)
    p = _SPACE_BEFORE_PUNCT.sub(r"\1", p)
    p = _SPACES.sub(" ", p).strip()
    # A paragraph without a single letter or digit is markup debris.
    if not any(ch.isalnum() for ch in p):
        return ""
    return p


def wikitext_to_text(wikitext: str) -> str:
    """Plain prose of one article's wikitext: paragraphs joined with "\\n\\n" ('' if none)."""
    wikitext = _COMMENT.sub("", wikitext)
    if "<ref" in wikitext.lower():
        wikitext = _REFERENCES.sub("", _REF.sub("", wikitext))
    code = mwparserfromhell.parse(wikitext)
    # Split into sections at top-level headings, dropping boilerplate sections.
    kept: list[str] = []
    buf = []
    skip_level: int | None = None
    for node in code.nodes:
        if isinstance(node, Heading):
            kept.append(_render(mwparserfromhell.wikicode.Wikicode(buf)))
            buf = []
            kept.append("\n\n")
            name = _SPACES.sub(" ", node.title.strip_code()).strip().lower()
            if skip_level is not None and node.level <= skip_level:
                skip_level = None
            if skip_level is None and name in _BOILERPLATE_SECTIONS:
                skip_level = node.level
            continue
        if skip_level is None:
            buf.append(node)
    kept.append(_render(mwparserfromhell.wikicode.Wikicode(buf)))
    text = _remove_leftovers(_MAGIC_WORD.sub("", "".join(kept)))
    paragraphs = (_clean_paragraph(p) for p in _PARAGRAPH_BREAK.split(text))
    return "\n\n".join(p for p in paragraphs if p)


def _child_text(elem, name: str) -> str | None:
    for child in elem:
        if _local(child.tag) == name:
            return child.text or ""
    return None


def _page_text(page) -> tuple[str | None, bool]:
    """(wikitext of the page's last revision, has <redirect>)."""
    text = None
    redirect = False
    for child in page:
        tag = _local(child.tag)
        if tag == "redirect":
            redirect = True
        elif tag == "revision":
            t = _child_text(child, "text")
            if t is not None:
                text = t
    return text, redirect


_STAT_KEYS = ("pages", "redirects", "non_article", "empty", "yielded")


def iter_wikipedia_documents(path: str | Path, source: str = "wikipedia",
                             stats: dict | None = None) -> Iterator[dict]:
    """Documents (documents schema) of a pages-articles dump; doc_id is 'wiki:<page id>'.

    `stats`, if given, is filled while iterating with counts of pages, redirects, non_article
    (namespace other than 0, not a redirect), empty (nothing left after cleaning) and yielded.
    """
    path = str(path)
    if stats is None:
        stats = {}
    for key in _STAT_KEYS:
        stats[key] = 0
    seen = SeenIds(path, "page id")
    last_title = None
    raw = open_maybe_bz2(path)
    reader = Utf8CheckedReader(raw, path)

    def where() -> str:
        after = f"after page {last_title!r}" if last_title is not None else "before the first page"
        return f"{reader.position}, {after}"

    try:
        events = ET.iterparse(reader, events=("start", "end"))
        root = None
        while True:
            try:
                event, elem = next(events)
            except StopIteration:
                break
            except ET.ParseError as e:
                line, col = e.position
                after = f"after page {last_title!r}" if last_title is not None else "before the first page"
                raise InputError(path, f"line {line}, column {col}, {after}",
                                 f"malformed XML: {e}") from None
            except EOFError as e:
                raise InputError(path, where(), f"truncated compressed file: {e}") from None
            except OSError as e:  # corrupt bz2 stream
                raise InputError(path, where(), f"cannot decompress: {e}") from None
            if event == "start":
                if root is None:
                    root = elem
                continue
            if _local(elem.tag) != "page":
                continue
            stats["pages"] += 1
            title = _child_text(elem, "title")
            page_id = _child_text(elem, "id")
            ns = _child_text(elem, "ns")
            loc = f"page {stats['pages']} ({title!r}), {where()}"
            if not title:
                raise InputError(path, f"page {stats['pages']}, {where()}",
                                 "missing required field 'title'")
            if not page_id or not page_id.strip():
                raise InputError(path, loc, "missing required field 'id'")
            page_id = page_id.strip()
            last_title = title
            seen.add(page_id, loc)
            wikitext, redirect = _page_text(elem)
            elem.clear()
            if root is not None:
                root.clear()
            if redirect or (wikitext or "").lstrip()[:9].upper() == "#REDIRECT":
                stats["redirects"] += 1  # counted in every namespace
                continue
            if (ns or "0").strip() != "0":
                stats["non_article"] += 1
                continue
            try:
                text = wikitext_to_text(wikitext or "")
            except Exception as e:  # mwparserfromhell should not fail; name the page if it does
                raise InputError(path, loc, f"cannot parse wikitext: {e!r}") from None
            if not text:
                stats["empty"] += 1
                continue
            stats["yielded"] += 1
            yield {"doc_id": f"wiki:{page_id}", "title": title, "text": text, "source": source,
                   "content_hash": content_hash(text)}
    finally:
        raw.close()
