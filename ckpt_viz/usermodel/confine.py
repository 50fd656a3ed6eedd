"""The system calls a run may not make: a seccomp filter built with libseccomp (`pyseccomp`).

`confine()` is the last step of `ckpt_viz.usermodel.child.apply_limits`, before the model file is
loaded; the filter holds for the run's process and everything it starts (fork, exec and threads
inherit it, and nothing can remove it). `problem()` says, for the parent's warning, why it cannot
be applied here. Standard library plus pyseccomp (ctypes over the system's libseccomp.so.2).

NOTE [ Seccomp filter ]
  1. What it refuses, with EPERM (the call fails; the process goes on):
     - ptrace, process_vm_readv, process_vm_writev, pidfd_getfd, process_madvise, kcmp:
       every system call that reads, writes or steals from another process's memory or file
       table. With these gone, no process of the run can attach to, inject code into or take
       a descriptor from another process: the sandbox's PID 1 (the warm process, or the
       cold child's collector), the run that came before, or the caller without bubblewrap.
     - socket(AF_UNIX, ...): a run cannot make a Unix socket, so it cannot connect() to a
       socket it can see through the read-only view of the system (a Docker or D-Bus
       socket). socketpair() stays allowed: its two ends reach only each other
       (multiprocessing's pipes use it). Abstract sockets are per network namespace, which
       bubblewrap makes new.
     - io_uring_setup, io_uring_enter, io_uring_register: io_uring does socket(), connect()
       and file I/O without passing through the system calls above, so it would bypass them.
  2. Why this is enough for "cannot write into another process": the kernel has four ways
     to another process's memory (ptrace, process_vm_writev, /proc/PID/mem, pidfd_getfd for
     its descriptors). The filter closes three; /proc/PID/mem is an open() of a path, which
     seccomp cannot inspect. That one is closed by the sandbox's layout: under bubblewrap
     with --as-pid-1, the only process in the run's PID namespace that is not the run's
     is PID 1, which makes itself undumpable (PR_SET_DUMPABLE 0) before any run exists, and
     the kernel refuses every ptrace-mode access (/proc/1/mem, /proc/1/fd, ptrace,
     process_vm_*) to an undumpable process from one without CAP_SYS_PTRACE (bubblewrap
     drops every capability). The filter is the second wall for the three system calls and
     the only one without bubblewrap, where /proc/PID/mem of the caller stays open (its
     warning says the caller's processes are reachable).
  3. Calls from another architecture (i386 `int 0x80` on x86-64) are not in the filter:
     libseccomp's default for a foreign architecture is to kill the process.
  4. It needs no privilege: libseccomp sets PR_SET_NO_NEW_PRIVS first, and TSYNC applies
     the filter to threads the process already has (a warm run's torch threads).
"""
from __future__ import annotations

import errno
import functools
import socket

__all__ = ["DENIED_SYSCALLS", "confine", "problem"]

DENIED_SYSCALLS = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "process_madvise", "kcmp",
                   "io_uring_setup", "io_uring_enter", "io_uring_register")


@functools.lru_cache(maxsize=1)
def problem() -> str | None:
    """None when the filter can be built here; else why not, in words."""
    try:
        _build()
    except (ImportError, OSError, RuntimeError, ValueError) as exc:  # pyseccomp raises RuntimeError without libseccomp
        return f"the seccomp filter cannot be built ({type(exc).__name__}: {exc})"
    return None


def _build():  # -> pyseccomp.SyscallFilter
    import pyseccomp as seccomp

    flt = seccomp.SyscallFilter(seccomp.ALLOW)
    flt.set_attr(seccomp.Attr.CTL_TSYNC, 1)
    deny = seccomp.ERRNO(errno.EPERM)
    for name in DENIED_SYSCALLS:
        try:
            flt.add_rule(deny, name)
        except OSError:  # a name this libseccomp or kernel does not know: nothing to refuse
            continue
    flt.add_rule(deny, "socket", seccomp.Arg(0, seccomp.EQ, socket.AF_UNIX))
    return flt


def confine() -> None:
    """Load the filter of NOTE [ Seccomp filter ] into this process (and its threads); irrevocable."""
    _build().load()
