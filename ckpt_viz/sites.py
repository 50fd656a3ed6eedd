"""Call sites: the user's `file:line` of an event, found by walking out of ckpt_viz, torch and the helpers.

`bus.emit` stamps each event's `site` with `call_site()`; `skip_frames_in(path)` adds
files or folders that are never "the user's code" (ckpt_viz's own block wrappers, a
library's layer helpers). Standard library only.
"""
from __future__ import annotations

import os
import sys

__all__ = ["call_site", "skip_frames_in"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# The runtime and the bus are never "the user's code"; scenarios and lessons are.
_SKIP_PREFIXES: list[str] = [_PACKAGE_DIR + "runtime" + os.sep, os.path.abspath(__file__),
                             _PACKAGE_DIR + "bus.py", _PACKAGE_DIR + "recording.py"]
_skip_cache: dict[str, bool] = {}
_library_dirs_added = False


def skip_frames_in(path: str) -> None:
    """Never report a line of `path` (a file, or a folder ending in os.sep) as the user's call site."""
    _SKIP_PREFIXES.append(os.path.abspath(path) + (os.sep if path.endswith(os.sep) else ""))
    _skip_cache.clear()


def _library_dirs() -> None:
    global _library_dirs_added
    _library_dirs_added = True
    for name in ("torch", "contextlib", "threading", "functools"):
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            folder = os.path.dirname(os.path.abspath(path))
            _SKIP_PREFIXES.append(folder + os.sep if name == "torch" else os.path.abspath(path))


def _skipped(filename: str) -> bool:
    hit = _skip_cache.get(filename)
    if hit is None:
        if not _library_dirs_added:
            _library_dirs()
        path = os.path.abspath(filename)
        hit = filename.startswith("<") or any(path.startswith(p) for p in _SKIP_PREFIXES)
        _skip_cache[filename] = hit
    return hit


def call_site(depth: int = 2) -> str | None:
    """The innermost `file:line` outside ckpt_viz, torch and the standard context helpers."""
    frame = sys._getframe(depth)
    skip = _skip_cache  # inlined `_skipped` for the files seen before: this walk runs on every emit
    while frame is not None:
        filename = frame.f_code.co_filename
        hit = skip.get(filename)
        if hit is None:
            hit = _skipped(filename)
        if not hit:
            key = (filename, frame.f_lineno)
            site = _site_cache.get(key)
            if site is None:
                if len(_site_cache) >= _MAX_SITES:
                    _site_cache.clear()
                site = _site_cache[key] = f"{_short_path(filename)}:{key[1]}"
            return site
        frame = frame.f_back
    return None


_site_cache: dict[tuple[str, int], str] = {}  # (file, line) -> "short/path.py:line", one string per site
_MAX_SITES = 65536


_short_cache: dict[str, str] = {}


def _short_path(filename: str) -> str:
    short = _short_cache.get(filename)
    if short is None:
        try:
            rel = os.path.relpath(filename)
        except ValueError:
            rel = filename
        short = filename if rel.startswith("..") else rel
        _short_cache[filename] = short
    return short
