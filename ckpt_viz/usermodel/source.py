"""Where a user model comes from: the reference, the imported module, and the line to blame.

Owns `parse_ref` ("path/to/file.py:factory" or "package.module:factory" -> `ModelRef`),
importing what a reference names (`open_module`), `ModelLoadError`, and the helpers that
build its message and locate the user's line in a traceback (`user_frame`). The
contract a factory must meet is checked in `ckpt_viz.usermodel.load` (see NOTE [ Model
file contract ] there), which re-exports the public names here. Never imports torch or
the UI, so the sandbox parent and the app can use these names without loading torch.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import itertools
import linecache
import os
import re
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType

from ckpt_viz.errors import ModelLoadError  # re-exported: defined with the whole error tree

__all__ = [
    "DEFAULT_FACTORY",
    "ModelLoadError",
    "ModelRef",
    "model_error",
    "open_module",
    "parse_ref",
    "user_code_error",
    "user_frame",
]

DEFAULT_FACTORY = "make_model"
_API = "ckpt_viz.load_model"
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_counter = itertools.count()
_PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)


@dataclass(frozen=True, slots=True)
class ModelRef:
    """A parsed reference: a file path or a module name, and the factory's name."""

    target: str
    factory: str
    is_file: bool


def model_error(what: str, tip: str, *, file: str | None = None, line: int | None = None, code: str = "",
                exc: BaseException | None = None) -> ModelLoadError:
    """Build the error: "<api>: <what>", a Python-style location block, "Tip: <tip>"."""
    parts = [f"{_API}: {what}"]
    if file is not None:
        parts.append(f'  File "{file}"' + (f", line {line}" if line is not None else ""))
        if code:
            parts.append(f"    {code}")
    parts.append(f"Tip: {tip}")
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)) if exc is not None else ""
    return ModelLoadError("\n".join(parts), file=file, line=line, traceback=tb)


def _exc_text(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def parse_ref(ref: str) -> ModelRef:
    """Split `path/to/file.py:factory` or `package.module:factory`.

    See NOTE [ Model file contract ] in `ckpt_viz.usermodel.load`.

    Raises:
        ModelLoadError: the reference has neither shape.
    """
    if not isinstance(ref, str) or not ref.strip():
        raise model_error(f"expected a model reference string, got {ref!r}.",
                          "pass 'path/to/file.py:factory' or 'package.module:factory'.")
    ref = ref.strip()
    target, sep, factory = ref.rpartition(":")
    if not sep or not _IDENT.fullmatch(factory) or not target:
        # No factory part (a colon inside a Windows drive, "C:\\m.py", is not one).
        target, factory = ref, ""
    is_file = target.endswith(".py") or "/" in target or os.sep in target
    if is_file:
        return ModelRef(target, factory or DEFAULT_FACTORY, True)
    if not factory:
        raise model_error(f"cannot read the model reference {ref!r}: it names no factory.",
                          f"write 'package.module:factory' or 'path/to/file.py:factory' (e.g. '{ref}:make_model').")
    if not _DOTTED.fullmatch(target):
        raise model_error(f"cannot read the model reference {ref!r}: {target!r} is neither a .py file "
                          "nor a module name.",
                          "write 'path/to/file.py:factory' or 'package.module:factory'.")
    return ModelRef(target, factory, False)


# -- locating the user's line in a traceback --


def _same_file(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return False
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, ValueError):
        return a == b


def _library_paths() -> tuple[str, ...]:
    import sysconfig

    paths = {_PACKAGE_DIR, sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
             sysconfig.get_paths()["platlib"]}
    torch = sys.modules.get("torch")
    torch_file = getattr(torch, "__file__", None) if torch is not None else None
    if torch_file:
        paths.add(str(Path(torch_file).resolve().parent))
    return tuple(os.path.realpath(p) + os.sep for p in paths if p)


def user_frame(tb: TracebackType | None, user_file: str | None) -> traceback.FrameSummary | None:
    """The frame to blame for an exception raised by user code.

    The innermost frame in `user_file`; else the innermost one outside ckpt_viz, torch and
    the installed libraries; else the innermost one outside ckpt_viz and importlib.
    """
    frames = traceback.extract_tb(tb)
    for frame in reversed(frames):
        if _same_file(frame.filename, user_file):
            return frame
    libs = _library_paths()
    for frame in reversed(frames):
        if not frame.filename.startswith("<") and not os.path.realpath(frame.filename).startswith(libs):
            return frame
    ours = os.path.realpath(_PACKAGE_DIR) + os.sep
    for frame in reversed(frames):
        if not frame.filename.startswith("<") and not os.path.realpath(frame.filename).startswith(ours):
            return frame
    return None


def user_code_error(what: str, exc: BaseException, user_file: str | None, tip: str) -> ModelLoadError:
    """An error for an exception raised by user code, located at the user's innermost frame."""
    frame = user_frame(exc.__traceback__, user_file)
    if frame is None:
        return model_error(f"{what} raised {_exc_text(exc)}.", tip, file=user_file, exc=exc)
    code = frame.line or linecache.getline(frame.filename, frame.lineno or 0).strip()
    return model_error(f"{what} raised {_exc_text(exc)} (line {frame.lineno} of {Path(frame.filename).name}, "
                       f"in {frame.name}).", tip, file=frame.filename, line=frame.lineno, code=code, exc=exc)


# -- importing --


def _syntax_error(exc: SyntaxError, user_file: str | None) -> ModelLoadError:
    file = exc.filename or user_file
    line = exc.lineno
    where = f" at line {line}" if line is not None else ""
    msg = (exc.msg or "invalid syntax").rstrip()
    msg += "" if msg.endswith((".", "?", "!")) else "."
    return model_error(f"{Path(file).name if file else 'the model file'} has a syntax error{where}: {msg}",
                       f"fix that line; `python -m py_compile {file}` shows the same error.",
                       file=file, line=line, code=(exc.text or "").strip(), exc=exc)


def _import_failed(what: str, exc: BaseException, user_file: str | None) -> ModelLoadError:
    if isinstance(exc, SyntaxError):
        return _syntax_error(exc, user_file)
    if isinstance(exc, ModuleNotFoundError):
        tip = f"install the module {exc.name!r} into this Python ({sys.executable}) or fix the import."
    else:
        tip = "fix the error at that line: the module runs top to bottom when it is loaded, before the factory."
    return user_code_error(what, exc, user_file, tip)


@contextlib.contextmanager
def _file_module(target: str) -> Iterator[tuple[ModuleType, str]]:
    """Import a .py file under a fresh name; its folder is on sys.path meanwhile.

    See NOTE [ Model file contract ] in `ckpt_viz.usermodel.load`, rule 7.
    """
    path = Path(target).expanduser()
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise model_error(f"the model file {target!r} {what} (looked from {os.getcwd()}).",
                          "pass the path of a .py file, relative to the folder you run from, then ':factory'.")
    if path.suffix != ".py":
        raise model_error(f"the model file {target!r} is not a .py file.",
                          "pass a Python source file, or a module name as 'package.module:factory'.")
    user_file = str(path.resolve())
    stem = re.sub(r"\W", "_", path.stem)
    name = f"_ckpt_viz_user_model_{next(_counter)}_{stem}"
    spec = importlib.util.spec_from_file_location(name, user_file)
    if spec is None or spec.loader is None:  # cannot happen for an existing .py file
        raise model_error(f"cannot import {user_file}.", "pass a readable .py file.", file=user_file)
    module = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    sys.modules[name] = module  # dataclasses and typing look the module up while it runs
    sys.path.insert(0, folder)
    try:
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as exc:
            raise _import_failed(f"importing {path.name}", exc, user_file) from exc
        yield module, user_file
    finally:
        sys.modules.pop(name, None)
        if folder in sys.path:
            sys.path.remove(folder)


@contextlib.contextmanager
def _package_module(target: str) -> Iterator[tuple[ModuleType, str | None]]:
    try:
        module = importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name and (target == exc.name or target.startswith(exc.name + ".")):
            raise model_error(f"no module named {exc.name!r} (from the reference {target!r}).",
                              "check the spelling, install the package, or add its folder to PYTHONPATH; "
                              "for a file, write 'path/to/file.py:factory'.", exc=exc) from exc
        raise _import_failed(f"importing {target}", exc, None) from exc
    except (Exception, SystemExit) as exc:
        raise _import_failed(f"importing {target}", exc, None) from exc
    yield module, getattr(module, "__file__", None)


def open_module(ref: ModelRef) -> contextlib.AbstractContextManager[tuple[ModuleType, str | None]]:
    """Import what `ref` names for the length of a `with` block: yields (module, its file or None).

    Raises:
        ModelLoadError: the file is missing or not .py, the module is not found, or importing it raised.
    """
    return _file_module(ref.target) if ref.is_file else _package_module(ref.target)
