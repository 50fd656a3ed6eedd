"""Hostile model: writes relative to its working folder (allowed), then next to itself (refused)."""
from pathlib import Path


def make_model():
    Path("relative.txt").write_text("a relative write")  # lands in the sandbox's own folder
    Path(__file__).with_name("escaped.txt").write_text("written beside the model file")
    raise RuntimeError("the write beside the model file succeeded")
