"""Hostile model: tries to attach to, write into, or take descriptors from PID 1 of its sandbox and its parent.

The attack of issue 25, finding 2: attach to PID 1 (bubblewrap's init, once) and make it run a program
outside the run's limits. Each attempt's outcome goes into the error it raises ("attached", "wrote" or
"took" when it worked; the errno's name when it was refused), and a subprocess of the model tries the
same on PID 1, so a test can read what a process of the run, and one it started, could do.
"""
import ctypes
import errno
import os
import subprocess
import sys

PTRACE_ATTACH, PTRACE_DETACH = 16, 17
SYS_PIDFD_OPEN, SYS_PIDFD_GETFD = 434, 438


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _name(err: int) -> str:
    return errno.errorcode.get(err, str(err))


def attempts(pid: int) -> list[str]:
    libc = ctypes.CDLL(None, use_errno=True)
    out = []
    if libc.ptrace(PTRACE_ATTACH, pid, None, None) == 0:
        out.append(f"ptrace({pid}): attached")
        try:
            os.waitpid(pid, 0x40000000)  # __WALL: the attached process stops; then let it go
        except OSError:
            pass
        libc.ptrace(PTRACE_DETACH, pid, None, None)
    else:
        out.append(f"ptrace({pid}): {_name(ctypes.get_errno())}")
    data = ctypes.create_string_buffer(b"\xcc" * 8)
    local, remote = IoVec(ctypes.addressof(data), 8), IoVec(0x1000, 8)  # a never-mapped page: EFAULT if allowed
    if libc.process_vm_writev(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) >= 0:
        out.append(f"process_vm_writev({pid}): wrote")
    else:
        err = ctypes.get_errno()
        out.append(f"process_vm_writev({pid}): " + ("reached it (EFAULT)" if err == errno.EFAULT else _name(err)))
    try:
        with open(f"/proc/{pid}/mem", "r+b", buffering=0):
            out.append(f"/proc/{pid}/mem: opened for writing")
    except OSError as exc:
        out.append(f"/proc/{pid}/mem: {_name(exc.errno)}")
    pidfd = libc.syscall(SYS_PIDFD_OPEN, pid, 0)
    if pidfd < 0:
        out.append(f"pidfd_open({pid}): {_name(ctypes.get_errno())}")
    else:
        fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, 0, 0)
        out.append(f"pidfd_getfd({pid}): " + ("took fd 0" if fd >= 0 else _name(ctypes.get_errno())))
        os.close(pidfd)
    return out


def make_model():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return None
    seen = attempts(1) + (attempts(os.getppid()) if os.getppid() not in (0, 1) else [])
    child = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True, timeout=60)
    seen += ["subprocess " + line for line in child.stdout.splitlines()]
    raise RuntimeError(f"pid {os.getpid()}, parent {os.getppid()}: " + "; ".join(seen))


if __name__ == "__main__" and sys.argv[1:] == ["--child"]:
    print("\n".join(attempts(1)))
