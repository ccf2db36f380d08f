"""MkDocs hooks of the docs site (``mkdocs.yml`` ``hooks:``): everything it loads is local.

The site is meant to work offline, opened from the file system. Material's offline
plugin makes search work there with a Web Worker shim, which it would load from a CDN
unless ``extra.polyfills`` already names one. ``mkdocs.yml`` names a local copy; this
hook copies it into the built site from npm's ``iframe-worker`` package (installed with
buf by ``make install``), and fails the build when it is missing.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parent.parent
#: The shim as npm installs it (the file the CDN's ``iframe-worker/shim`` serves).
SHIM = ROOT / "node_modules" / "iframe-worker" / "shim" / "index.js"
#: Where ``mkdocs.yml``'s ``extra.polyfills`` expects it, relative to the site's root.
TARGET = "assets/javascripts/iframe-worker-shim.js"


def on_config(config: Any) -> Any:
    """Check that the polyfills are local and that the shim is the local copy.

    Raises:
        PluginError: a polyfill names another host, or the local shim is not listed.
    """
    polyfills = list(config.extra.get("polyfills", []))
    remote = [p for p in polyfills if "://" in p or p.startswith("//")]
    if remote or TARGET not in polyfills:
        raise PluginError(
            f"extra.polyfills must list only local scripts, {TARGET} among them; got {polyfills}"
        )
    return config


def on_post_build(config: Any) -> None:
    """Copy the shim into the built site.

    Raises:
        PluginError: npm's ``iframe-worker`` is not installed (run ``make install``).
    """
    if not SHIM.is_file():
        raise PluginError(f"{SHIM.relative_to(ROOT)} is missing: run `make install` (npm install)")
    target = Path(config.site_dir) / TARGET
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SHIM, target)
