"""`record(memory=True)` around a user's own training loop: the allocator's peak, and categories users recognise.

An HF Llama (random init, tiny config) trained with AdamW, as an engineer's loop runs it: with no checkpoint,
with torch's checkpoint (HF's `gradient_checkpointing_enable`, both kinds) and with ours. The allocator's own
figure on CPU comes from torch.profiler's memory events over the same step on an identical copy of the model
and optimizer: the bytes the step's storages held at its start plus the highest running sum of the
allocations and frees it reports (NOTE [ Allocation ledger ] rule 7 in ckpt_viz/probe/allocations.py).
"""
from __future__ import annotations

import functools
import warnings
from typing import Any

import pytest
import torch

import ckpt_viz
from ckpt_viz.runtime import checkpoint as our_checkpoint

transformers = pytest.importorskip("transformers")
MODES = ("none", "torch-nonreentrant", "torch-reentrant", "ours")


def llama(mode: str, *, vocab: int, layers: int, seed: int = 0) -> tuple[Any, torch.optim.Optimizer]:
    transformers.logging.set_verbosity_error()
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, use_cache=False)
    model = transformers.LlamaForCausalLM(config).train()
    if mode.startswith("torch"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # transformers 5 calls it a deprecated alias; it is what users call
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": mode == "torch-reentrant"})
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(model: Any, opt: torch.optim.Optimizer, ids: torch.Tensor, mode: str) -> None:
    if mode == "ours":
        from ckpt_viz.usermodel.hf import own_checkpointing

        layers = {f"model.layers.{i}": layer for i, layer in enumerate(model.model.layers)}
        with own_checkpointing(model, layers, lambda name, layer: functools.partial(our_checkpoint,
                                                                                    use_reentrant=True)):
            model(input_ids=ids, labels=ids).loss.backward()
    else:
        model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _storages(tensors: list[torch.Tensor]) -> int:
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def live_at_start(model: Any, opt: torch.optim.Optimizer, ids: torch.Tensor) -> int:
    """The bytes of every storage the step starts with: parameters, buffers, gradients, optimizer state, input."""
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return _storages([*model.parameters(), *model.buffers(), *state, *grads, ids])


def profiler_peak(step: Any) -> int:
    """The highest running sum of the allocations and frees torch.profiler reports over `step()`."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    sizes: list[tuple[int, int]] = []
    nodes = list(prof.profiler.kineto_results.experimental_event_tree())
    while nodes:
        node = nodes.pop()
        if node.tag == torch._C._profiler._EventType.Allocation:
            sizes.append((node.start_time_ns, node.extra_fields.alloc_size))
        nodes.extend(node.children)
    running = highest = 0
    for _, size in sorted(sizes):
        running += size
        highest = max(highest, running)
    return highest


def recorded_peak(trace: Any) -> Any:
    return max(trace.memory, key=lambda s: sum(s.bytes_by_category.values()))


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU figure; the GPU's is test_peak_on_a_gpu")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("vocab", "batch"), [(4096, 2), (256, 8)], ids=["peak-in-optimizer-step", "peak-in-backward"])
def test_the_recorded_peak_is_the_allocators(mode: str, vocab: int, batch: int) -> None:
    ids = torch.randint(0, vocab, (batch, 32), generator=torch.Generator().manual_seed(1))
    profiled, recorded = llama(mode, vocab=vocab, layers=3), llama(mode, vocab=vocab, layers=3)
    for model, opt in (profiled, recorded):  # the optimizer's state exists, as in any step after the first
        train_step(model, opt, ids, mode)
    want = live_at_start(*profiled, ids) + profiler_peak(lambda: train_step(*profiled, ids, mode))
    with ckpt_viz.record(memory=True, model=recorded[0], optimizer=recorded[1]) as rec:
        train_step(*recorded, ids, mode)
    assert rec.trace.meta["memory_probe"] == "allocator"
    peak = recorded_peak(rec.trace)
    got = sum(peak.bytes_by_category.values())
    assert abs(got - want) <= 0.01 * want, (mode, got, want)
    # the peaks of these configurations are where the ids say: in the optimizer's step or in the backward
    where = {e.seq: e.at for e in rec.trace.events if e.kind == "memory_sampled"}
    if vocab == 4096:
        assert where.get(peak.seq) == "AdamW.step" and peak.bytes_by_category["optimizer_step"] > 0
    else:
        assert where.get(peak.seq) != "AdamW.step" and peak.bytes_by_category["optimizer_step"] == 0
        assert peak.bytes_by_category["gradients"] > 0


def test_checkpointing_lowers_the_recorded_peak() -> None:
    """The baseline question, answered from the user's own loop: the same step recorded without and with
    checkpointing (a configuration whose peak is in the backward)."""
    ids = torch.randint(0, 256, (8, 32), generator=torch.Generator().manual_seed(1))
    peaks = {}
    for mode in MODES:
        model, opt = llama(mode, vocab=256, layers=3)
        with ckpt_viz.record(memory=True, model=model, optimizer=opt) as rec:
            train_step(model, opt, ids, mode)
            train_step(model, opt, ids, mode)
        peak = recorded_peak(rec.trace)
        peaks[mode] = sum(peak.bytes_by_category.values())
    assert all(peaks[mode] < peaks["none"] for mode in MODES[1:]), peaks


@pytest.mark.parametrize("given", [True, False], ids=["optimizer-given", "optimizer-found"])
def test_an_hf_llama_training_loop_in_categories_users_recognise(given: bool) -> None:
    """3 AdamW steps: "other" under 5 % of the peak; optimizer state, gradients, parameters exactly what the
    model and optimizer hold; the input ids and the model's output are counted as such."""
    vocab = 4096
    ids = torch.randint(0, vocab, (4, 32), generator=torch.Generator().manual_seed(2))
    model, opt = llama("none", vocab=vocab, layers=4)
    train_step(model, opt, ids, "none")  # AdamW's state from before the block
    state = _storages([v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)])
    weights = _storages([*model.parameters(), *model.buffers()])
    with ckpt_viz.record(memory=True, model=model, optimizer=opt if given else None) as rec:
        for _ in range(3):
            outputs = model(input_ids=ids, labels=ids)
            outputs.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del outputs
    samples = list(rec.trace.memory)
    peak = recorded_peak(rec.trace)
    total = sum(peak.bytes_by_category.values())
    assert peak.bytes_by_category["other"] < 0.05 * total, peak.bytes_by_category
    assert peak.bytes_by_category["parameters"] == weights
    assert peak.bytes_by_category["optimizer_state"] == state  # AdamW's two moments and step counters
    assert peak.bytes_by_category["gradients"] >= sum(p.numel() * p.element_size() for p in model.parameters())
    first = samples[0].bytes_by_category
    assert first["optimizer_state"] == (state if given else 0)  # found at its first step when not given
    assert all(s.bytes_by_category["optimizer_state"] == state for s in samples if s.seq >= 4)
    assert max(s.bytes_by_category["inputs"] for s in samples) == ids.untyped_storage().nbytes()
    logits = 4 * 32 * vocab * 4
    forwards = [e.seq for e in rec.trace.events if e.kind == "memory_sampled" and e.at.endswith(" forward")]
    assert len(forwards) == 3  # the forward's samples are tied to its event; its last one is after it returned
    assert all([s for s in samples if s.seq == seq][-1].bytes_by_category["outputs"] >= logits for seq in forwards)


def _first(samples: list[Any], seq: int) -> Any:
    """The reading right after event `seq` (test_probe_memory.reading_at)."""
    before = [s for s in samples if s.seq <= seq]
    return next((s for s in before if s.seq == seq), before[-1])


def test_a_plain_loop_with_no_checkpoint_has_events_and_samples_in_every_pass() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(32, 64)
    with ckpt_viz.record(memory=True) as rec:  # no model, no optimizer given: both found as they run
        for _ in range(2):
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
    # one event as each pass opens: memory_sampled for the forward and the step, backward_called for the backward
    at = [e.at if e.kind == "memory_sampled" else e.kind for e in rec.trace.events]
    assert at == ["Sequential forward", "backward_called", "SGD.step"] * 2
    samples = rec.trace.memory
    passes = {e.seq: name for e, name in zip(rec.trace.events, at)}
    assert {passes[s.seq] for s in samples} == set(at)
    in_forward = [s for s in samples if passes[s.seq] == "Sequential forward"]
    assert len(in_forward) >= 4  # module boundaries inside the forward
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert all(s.bytes_by_category["parameters"] == weights for s in samples)
    momentum = samples[-1].bytes_by_category["optimizer_state"]
    assert momentum == weights  # SGD's momentum buffers, found at its first step
    for seq, name in passes.items():
        last = [s for s in samples if s.seq == seq][-1].bytes_by_category
        if name == "backward_called":  # as the backward returns: every .grad, nothing in flight
            assert last["gradients"] == weights
        elif name == "SGD.step":  # as the step returns: its momentum buffers
            assert last["optimizer_state"] == weights
    assert samples[-1].bytes_by_category["gradients"] == 0  # the block closes after zero_grad()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", MODES)
def test_peak_on_a_gpu(mode: str) -> None:
    """On a GPU the recorded peak is torch.cuda.max_memory_allocated() of the step, within 1 %."""
    ids = torch.randint(0, 4096, (8, 64), generator=torch.Generator().manual_seed(1)).cuda()
    model, opt = llama(mode, vocab=4096, layers=3)
    model.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train_step(model, opt, ids, mode)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with ckpt_viz.record(memory=True, model=model, optimizer=opt) as rec:
        train_step(model, opt, ids, mode)
    torch.cuda.synchronize()
    want = torch.cuda.max_memory_allocated()
    devices = [s.device_allocated for s in rec.trace.memory if s.device_allocated is not None]
    assert devices and abs(max(devices) - want) <= 0.01 * want, (max(devices), want)
    got = sum(recorded_peak(rec.trace).bytes_by_category.values())
    assert abs(got - want) <= 0.01 * want, (got, want)
