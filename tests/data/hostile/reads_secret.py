"""Hostile model: looks for secrets in its environment and in its parent's; raises with what it found."""
import os


def make_model():
    try:
        with open(f"/proc/{os.getppid()}/environ", "rb") as f:
            parent = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError as exc:
        parent = f"unreadable ({exc.strerror})"
    raise RuntimeError(f"environment keys {sorted(os.environ)}; CKPT_VIZ_FAKE_SECRET="
                       f"{os.environ.get('CKPT_VIZ_FAKE_SECRET')}; parent's environment: {parent}")
