"""The CPU allocator's own record of one step: every allocation and free, in order, with marks.

Owns `Allocations`, the plan's allocator-accurate memory reading (the profile step and
`verify`'s measurement). It runs torch's profiler with memory profiling only: the only
activity asked for is MTIA, which records nothing where there is no MTIA device, so no op
events are made and the cost per allocation is a few C++ stores (a step's time is not
inflated the way a per-op Python call inflates it). Never the UI.

NOTE [ Allocator record ]
  1. The record is `(ptr, nbytes)` per allocation (nbytes > 0) or free (< 0), in the order the
     allocator made them, for the thread that started it and the autograd work it launches.
  2. A mark is a one-byte storage kept alive until the record stops, so its address is the last
     allocation at that address: its index in the record is the instant it was made. Marks are
     left out of the live bytes.
  3. Live bytes at index i are the sum of sizes up to i: frees of storages allocated before the
     record started count too (a `.grad` replaced, an input dropped), so a reading is the
     allocator's own "allocated" figure relative to the start, not only the new storages.
  4. One torch profiler per process: `start` refuses (CkptVizError) while another runs: a user's
     torch.profiler, or a `record(memory=True)` whose memory probe reads the allocator through the
     profiler. The error says what to do instead: profile a step apart from the recording and
     attach the profile to its trace. (The other nesting, the recording inside the plan's block,
     would put the recording's saved-tensor hooks on top of the profile's, which would then see
     nothing saved.) Where CUDA is present the CPU record is still exact for CPU tensors; CUDA
     tensors are not in it (the plan reads CPU steps).
  5. torch prints a line to stderr when a profiler starts and stops; file descriptor 2 is sent to
     /dev/null around those two calls only.
"""
from __future__ import annotations

import gc
import warnings
from dataclasses import dataclass

import torch

from ckpt_viz.errors import CkptVizError
from ckpt_viz.probe.stream import quiet_stderr

__all__ = ["Allocations", "Record"]


@dataclass(frozen=True)
class Record:
    """What `Allocations.stop` returns: the sizes in order, and each mark's index among them.

    Attributes:
        sizes: nbytes per allocator event (negative for a free), marks excluded.
        ptrs: the address of each event.
        marks: index into `sizes` of each mark, in the order `mark` was called: the number of
            events that happened before it.
    """

    sizes: list[int]
    ptrs: list[int]
    marks: list[int]


class Allocations:
    """One memory-only profiler session on this thread (NOTE [ Allocator record ])."""

    def __init__(self, api: str) -> None:
        self.api = api
        self._marks: list[torch.UntypedStorage] = []
        self._running = False

    def start(self) -> Allocations:
        from torch._C._profiler import ProfilerActivity, ProfilerConfig, ProfilerState, _ExperimentalConfig
        from torch.autograd import _enable_profiler, _prepare_profiler

        if torch.autograd._profiler_enabled():
            raise CkptVizError(f"{self.api}: torch's profiler is already running in this process (yours, or a "
                               "record(memory=True) that reads the allocator through it), and the plan reads the "
                               "allocator through it too: one profiler at a time.\nTip: stop your torch.profiler; "
                               "with record(memory=True), profile one step before or after the recording (not inside "
                               "it) and add the profile to its trace: ckpt_viz.plan.attach(rec.trace, prof.profile).")
        # state, report_input_shapes, profile_memory, with_stack, with_flops, with_modules, experimental
        config = ProfilerConfig(ProfilerState.KINETO, False, True, False, False, False, _ExperimentalConfig())
        self._config = (config, {ProfilerActivity.MTIA})
        gc.collect()  # garbage of earlier runs freed now, not inside the record
        with quiet_stderr():
            _prepare_profiler(*self._config)
            _enable_profiler(*self._config)
        self._running = True
        return self

    def mark(self) -> int:
        """Mark this instant (NOTE rule 2); returns the mark's number."""
        self._marks.append(torch.UntypedStorage(1))
        return len(self._marks) - 1

    def stop(self) -> Record:
        from torch.autograd import _disable_profiler

        if not self._running:
            return Record([], [], [])
        self._running = False
        with quiet_stderr(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = _disable_profiler()
        events = [(e.extra_fields.ptr, e.extra_fields.alloc_size) for e in result.experimental_event_tree()]
        mark_ptrs = {s.data_ptr(): i for i, s in enumerate(self._marks)}
        last_alloc: dict[int, int] = {}  # mark address -> index of the last allocation there: the mark
        for index, (ptr, size) in enumerate(events):
            if size > 0 and ptr in mark_ptrs:
                last_alloc[ptr] = index
        mark_events = {index: mark_ptrs[ptr] for ptr, index in last_alloc.items()}
        sizes: list[int] = []
        ptrs: list[int] = []
        marks = [-1] * len(self._marks)
        for index, (ptr, size) in enumerate(events):
            number = mark_events.get(index)
            if number is not None:
                marks[number] = len(sizes)
                continue
            sizes.append(size)
            ptrs.append(ptr)
        marks = [len(sizes) if m < 0 else m for m in marks]
        self._marks.clear()
        return Record(sizes, ptrs, marks)

    def __enter__(self) -> Allocations:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self._running:
            self.stop()
