"""Hostile model: writes up to 2 GiB, in 64 MiB files, to each place it can write: its working folder, /tmp,
/dev/shm (issue 25, finding 6: only single files used to be capped, and the folder was on the host's disk).

How much each place took, and the error that stopped it, go into the error it raises.
"""
import errno
import os

CHUNK = b"\0" * (1 << 20)
FILE_MB, TOTAL_MB = 64, 2048


def fill(folder: str) -> str:
    written, why = 0, "no error"
    try:
        for n in range(TOTAL_MB // FILE_MB):
            with open(os.path.join(folder, f"fill-{os.getpid()}-{n}.bin"), "wb") as f:  # new names each run
                for _ in range(FILE_MB):
                    f.write(CHUNK)
                    written += 1
                f.flush()
    except OSError as exc:
        why = errno.errorcode.get(exc.errno, str(exc.errno))
    return f"{folder}: {written} MiB, {why}"


def make_model():
    places = [os.getcwd(), "/tmp", "/dev/shm"]
    raise RuntimeError("filled " + "; ".join(fill(p) for p in places))
