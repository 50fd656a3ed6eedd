"""Lesson 6: release at the end of DW; DW before DX is refused (the lanes show each handle's states)."""
from ckpt_viz.analysis.lifecycle import lifecycle
from ckpt_viz.analysis.words import reason_word, state_word
from ckpt_viz.render.swimlane import lifecycle_intervals


def make_blocks(depth, width=32, hidden=128):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.ModuleDict({
        f"block{i}": nn.Sequential(
            nn.Linear(width, hidden), nn.Tanh(), nn.Linear(hidden, width))
        for i in range(depth)})


def record_dx_then_dw(depth=4, batch=384):
    import torch

    import ckpt_viz

    blocks = make_blocks(depth)
    params = list(blocks.parameters())
    x = torch.randn(batch, 32, requires_grad=True)
    with ckpt_viz.record(memory=True, model=blocks) as rec:
        with ckpt_viz.reentrant_checkpoint_scope(params) as handles:
            h = x
            for block in blocks.values():
                h = h + ckpt_viz.checkpoint(block, h, use_reentrant=True)
        loss = h.pow(2).sum()
        ckpt_viz.backward_input(loss, None, [x], handles=handles)      # DX
        ckpt_viz.backward_weight(loss, None, params, handles=handles)  # DW
    return rec.trace


def record_dw_first(depth=4, batch=384):
    import torch

    import ckpt_viz

    blocks = make_blocks(depth)
    params = list(blocks.parameters())
    x = torch.randn(batch, 32, requires_grad=True)
    with ckpt_viz.record(memory=True, model=blocks) as rec:
        with ckpt_viz.reentrant_checkpoint_scope(params) as handles:
            h = x
            for block in blocks.values():
                h = h + ckpt_viz.checkpoint(block, h, use_reentrant=True)
        loss = h.pow(2).sum()
        ckpt_viz.backward_weight(loss, None, params, handles=handles)  # DW first
        try:
            ckpt_viz.backward_input(loss, None, [x], handles=handles)  # then DX
        except ckpt_viz.HandleReleasedError:
            pass  # the trace keeps it: an `error` event
    return rec.trace


def _lane_words(trace):
    """The states the lanes draw (the renderer's rows), in words, in the order they first appear."""
    states = [row["state"] for row in lifecycle_intervals(trace)]
    return [state_word(s) for s in dict.fromkeys(states)]


def check_released_after_dw(trace, runs):
    life = lifecycle(trace)
    for h in life.handle_ids:
        events = list(trace.for_handle(h))
        kinds = [e.kind for e in events]
        last_routed = max(i for i, e in enumerate(events) if e.kind == "grads_routed")
        assert kinds.index("released") > last_routed, kinds
        assert life.released(h).reason == "dw_complete"
    words = _lane_words(trace)
    assert state_word("retained") in words, words
    return {"states": " -> ".join(words), "retained": state_word("retained"),
            "reason": reason_word("dw_complete"), "handles": len(life.handle_ids)}


def check_refused_after_release(trace, runs):
    (error,) = trace.of_kind("error")
    released = [e for e in trace.of_kind("released") if e.handle_id == error.handle_id]
    assert released and released[0].seq < error.seq
    assert released[0].reason == "dw_complete", released
    assert error.type == "HandleReleasedError", error
    words = _lane_words(trace)
    assert state_word("phase_dw") in words, words
    return {"handle": f"h{error.handle_id}", "released_at": released[0].seq, "error_at": error.seq,
            "error": error.type, "waiting": state_word("phase_dw"), "states": " -> ".join(words)}
