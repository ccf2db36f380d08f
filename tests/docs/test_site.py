"""The docs site builds with ``mkdocs build --strict`` and loads nothing from another host.

The site must work offline (opened from the file system, or served with no internet):
no web fonts, scripts, stylesheets or images from a CDN. The build is run here as
``make docs`` runs it; every ``<script src>``, ``<link href>``, ``<img src>`` and every
``url()`` / ``@import`` of the built pages and stylesheets must be local.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIM = ROOT / "node_modules" / "iframe-worker" / "shim" / "index.js"

#: ``url(…)`` and ``@import "…"`` in CSS (fonts, images, other stylesheets).
_CSS_REF = re.compile(r"""url\(\s*['"]?([^'")\s]+)|@import\s+(?:url\()?\s*['"]([^'"]+)""")


class _Refs(HTMLParser):
    """Collects the resources a page loads: scripts, links, images, inline CSS."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "script" and a.get("src"):
            self.refs.append(str(a["src"]))
        elif tag == "link" and a.get("href") and a.get("rel") != "canonical":
            self.refs.append(str(a["href"]))
        elif tag in ("img", "source", "iframe") and a.get("src"):
            self.refs.append(str(a["src"]))
        elif tag == "style":
            self._in_style = True
        if a.get("style"):
            self.refs.extend(m[0] or m[1] for m in _CSS_REF.findall(str(a["style"])))

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.refs.extend(m[0] or m[1] for m in _CSS_REF.findall(data))


def external(ref: str) -> bool:
    """Whether a reference names another host (``https://…``, ``//host/…``)."""
    return bool(re.match(r"^(?:[a-z][a-z0-9+.-]*:)?//", ref.strip(), re.I))


def remote_refs(site: Path) -> list[str]:
    """``page: reference`` for every resource of the built site loaded from another host."""
    found: list[str] = []
    for page in sorted(site.rglob("*.html")):
        parser = _Refs()
        parser.feed(page.read_text(encoding="utf-8"))
        found += [f"{page.relative_to(site)}: {r}" for r in parser.refs if external(r)]
    for sheet in sorted(site.rglob("*.css")):
        text = sheet.read_text(encoding="utf-8")
        refs = [m[0] or m[1] for m in _CSS_REF.findall(text)]
        found += [f"{sheet.relative_to(site)}: {r}" for r in refs if external(r)]
    return found


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as ``make docs-check`` builds it."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def test_the_checker_sees_remote_resources(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text(
        '<html><head><script src="https://unpkg.com/iframe-worker/shim"></script>'
        '<link rel="stylesheet" href="//fonts.googleapis.com/css?family=Roboto">'
        '<script src="assets/local.js"></script>'
        "<style>@import 'https://cdn.example/x.css';</style></head></html>",
        encoding="utf-8",
    )
    (tmp_path / "a.css").write_text(
        "@font-face{src:url(https://fonts.gstatic.com/r.woff2)} .x{background:url(img/a.png)}",
        encoding="utf-8",
    )
    assert remote_refs(tmp_path) == [
        "index.html: https://unpkg.com/iframe-worker/shim",
        "index.html: //fonts.googleapis.com/css?family=Roboto",
        "index.html: https://cdn.example/x.css",
        "a.css: https://fonts.gstatic.com/r.woff2",
    ]


def test_site_loads_nothing_from_another_host(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert remote_refs(site) == [], "the docs site must work offline"


def test_offline_search_shim_is_local(site: Path) -> None:
    shim = site / "assets" / "javascripts" / "iframe-worker-shim.js"
    assert shim.read_bytes() == SHIM.read_bytes()
    assert 'src="assets/javascripts/iframe-worker-shim.js"' in (site / "index.html").read_text(
        encoding="utf-8"
    )
    assert (site / "search" / "search_index.js").is_file(), "offline search index"


def test_reference_numbered_headings_are_anchors(site: Path) -> None:
    html = (site / "reference" / "jobs.html").read_text(encoding="utf-8")
    for n in ("s2", "s2.1", "s2.3", "s2.6"):
        assert f'id="{n}"' in html
