"""Call sites: the user's `file:line` of an event, found by walking out of ckpt_viz, torch and the libraries.

`bus.emit` stamps each event's `site` with `call_site()`. Standard library only.

NOTE [ The user's line ]
  1. Each file on the stack is one of three kinds, decided once per file:
       - never the user's: ckpt_viz's runtime, bus, recording and this module, torch, the
         standard context helpers (contextlib, threading, functools), code with no file
         ("<string>"), transformers' layer wrapper (`modeling_layers.py`) and whatever
         `skip_frames_in(path)` named (ckpt_viz's own block wrappers);
       - a library: the rest of ckpt_viz (its CLI, harness, pipelining), transformers, the
         standard library, and the packages named by `skip_package(name)` or the environment
         variable CKPT_VIZ_SKIP_PACKAGES (comma-separated names, read when the first site
         is found; it reaches sandboxed runs too);
       - the user's: everything else, and ckpt_viz's built-in demo models (run/zoo.py,
         run/broken.py, run/divergent.py), which stand for a user's model, and the steps that
         run them (run/scenarios.py, run/pipeline.py), which stand for a user's training step:
         a built-in run's backward events name the step's backward line, whoever called it (the
         app, a test, the CLI), so two recordings of one run are equal.
  2. The site is the innermost frame of the user's; when the stack holds none (a model file
     run by `ckpt-viz record`, whose model is a transformers class), the innermost library
     frame, so the event still names the model line that made the call.
  3. Two caches keep the walk cheap: `_skip_cache` (file -> kind) and `_site_cache`
     ((file, line) -> site); `skip_package` clears the first.

Example: an HF Llama step in train.py, `loss = model(ids, labels=ids).loss` on line 12, with
`model.gradient_checkpointing_enable()`: every handle_created's site is "train.py:12", not
transformers' modeling_layers.py; `skip_package("accelerate")` keeps accelerate's lines out too.
"""
from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
from types import FrameType

__all__ = ["call_site", "skip_frames_in", "skip_package"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_USER, _SKIP, _LIBRARY = False, True, "library"  # the kinds of NOTE rule 1, as `_skip_cache` holds them
# The runtime and the bus are never "the user's code"; ckpt_viz's demo models and their steps are.
_SKIP_PREFIXES: list[str] = [_PACKAGE_DIR + "runtime" + os.sep, os.path.abspath(__file__),
                             _PACKAGE_DIR + "bus.py", _PACKAGE_DIR + "recording.py"]
_DEMO_FILES = tuple(_PACKAGE_DIR + os.path.join("run", name)
                    for name in ("zoo.py", "broken.py", "divergent.py", "scenarios.py", "pipeline.py"))
_LIBRARY_PREFIXES: list[str] = [_PACKAGE_DIR]  # ckpt_viz and the library packages' folders
_STDLIB_PREFIXES: list[str] = []  # the standard library's folders (without the site-packages inside them)
_LIBRARY_PACKAGES: list[str] = ["transformers"]  # rule 1; skip_package adds to it
_skip_cache: dict[str, bool | str] = {}
_library_dirs_added = False


def skip_frames_in(path: str) -> None:
    """Never report a line of `path` (a file, or a folder ending in os.sep) as the user's call site."""
    _SKIP_PREFIXES.append(os.path.abspath(path) + (os.sep if path.endswith(os.sep) else ""))
    _skip_cache.clear()


def skip_package(name: str) -> None:
    """Treat the installed package `name` (e.g. "accelerate") as a library: its lines are an event's site only when
    no line of the user's is on the stack (NOTE [ The user's line ]). Also: CKPT_VIZ_SKIP_PACKAGES=accelerate,peft.
    """
    if not isinstance(name, str) or not name.strip() or "." in name.strip():
        raise ValueError(f"ckpt_viz.sites.skip_package: expected a top-level package name such as 'accelerate', "
                         f"got {name!r}.\nTip: pass the name you import, without dots.")
    _LIBRARY_PACKAGES.append(name.strip())
    if _library_dirs_added:
        _add_package(name.strip())
    _skip_cache.clear()


def _package_dir(name: str) -> str | None:
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    if path is None:
        try:
            spec = importlib.util.find_spec(name)  # a top-level name: reads the path, imports nothing
        except (ImportError, ValueError):
            return None
        path = spec.origin if spec is not None else None
        if path is None and spec is not None and spec.submodule_search_locations:
            return os.path.abspath(next(iter(spec.submodule_search_locations))) + os.sep
    if not path:
        return None
    return os.path.dirname(os.path.abspath(path)) + os.sep


def _add_package(name: str) -> None:
    folder = _package_dir(name)
    if folder is None:
        return
    _LIBRARY_PREFIXES.append(folder)
    if name == "transformers":  # the layer wrapper that calls the checkpoint: never the site (rule 1)
        _SKIP_PREFIXES.append(folder + "modeling_layers.py")


def _library_dirs() -> None:
    global _library_dirs_added
    _library_dirs_added = True
    for name in ("torch", "contextlib", "threading", "functools"):
        module = sys.modules.get(name)
        path = getattr(module, "__file__", None)
        if path:
            folder = os.path.dirname(os.path.abspath(path))
            _SKIP_PREFIXES.append(folder + os.sep if name == "torch" else os.path.abspath(path))
    extra = os.environ.get("CKPT_VIZ_SKIP_PACKAGES", "")
    _LIBRARY_PACKAGES.extend(n.strip() for n in extra.split(",") if n.strip() and "." not in n.strip())
    for name in dict.fromkeys(_LIBRARY_PACKAGES):
        _add_package(name)
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib"):
        folder = paths.get(key)
        if folder:
            _STDLIB_PREFIXES.append(os.path.abspath(folder) + os.sep)


def _installed(path: str) -> bool:
    """A third-party package under the standard library's folder (a system Python's site-packages)."""
    parts = path.split(os.sep)
    return "site-packages" in parts or "dist-packages" in parts


def _kind(filename: str) -> bool | str:
    """NOTE [ The user's line ], rule 1: `_USER`, `_SKIP` or `_LIBRARY` for `filename`, cached."""
    hit = _skip_cache.get(filename)
    if hit is None:
        if not _library_dirs_added:
            _library_dirs()
        path = os.path.abspath(filename)
        if filename.startswith("<") or any(path.startswith(p) for p in _SKIP_PREFIXES):
            hit = _SKIP
        elif path in _DEMO_FILES:
            hit = _USER
        elif any(path.startswith(p) for p in _LIBRARY_PREFIXES) or any(
                path.startswith(p) and not _installed(path[len(p):]) for p in _STDLIB_PREFIXES):
            hit = _LIBRARY
        else:
            hit = _USER
        _skip_cache[filename] = hit
    return hit


def call_site(depth: int = 2) -> str | None:
    """The innermost `file:line` of the user's code, else of a library (NOTE [ The user's line ], rule 2)."""
    frame: FrameType | None = sys._getframe(depth)
    skip = _skip_cache  # inlined `_kind` for the files seen before: this walk runs on every emit
    library = None
    while frame is not None:
        filename = frame.f_code.co_filename
        hit = skip.get(filename)
        if hit is None:
            hit = _kind(filename)
        if hit is _USER:
            return _site(filename, frame.f_lineno)
        if library is None and hit is _LIBRARY:
            library = (filename, frame.f_lineno)
        frame = frame.f_back
    return _site(*library) if library is not None else None


def _site(filename: str, line: int) -> str:
    key = (filename, line)
    site = _site_cache.get(key)
    if site is None:
        if len(_site_cache) >= _MAX_SITES:
            _site_cache.clear()
        site = _site_cache[key] = f"{_short_path(filename)}:{line}"
    return site


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
