"""Lesson 5: phases, and the backward trigger that lets DW reach weights a checkpoint captures in a closure."""
from ckpt_viz.analysis.lifecycle import lifecycle
from ckpt_viz.analysis.routing import snapshot_before


def record_closure(depth=3, batch=512):
    import torch

    import ckpt_viz

    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(32, 32) / 32 ** 0.5)
               for _ in range(depth)]
    x = torch.randn(batch, 32, requires_grad=True)

    def block(i, w):
        def body(t):          # w is captured: it is no input of the checkpoint
            return t + torch.sin(t @ w.t())
        body.__qualname__ = f"block{i}"  # the name the trace gives its handle
        return body

    with ckpt_viz.record(memory=True, graphs=True) as rec:
        with ckpt_viz.reentrant_checkpoint_scope(weights) as handles:
            h = x
            for i, w in enumerate(weights):
                h = ckpt_viz.checkpoint(block(i, w), h, use_reentrant=True)
        loss = h.pow(2).sum()
        ckpt_viz.backward_input(loss, None, [x], handles=handles)       # DX
        ckpt_viz.backward_weight(loss, None, weights, handles=handles)  # DW
    return rec.trace


def check_phases(trace, runs):
    handles = lifecycle(trace).handle_ids
    for h in handles:
        moves = [(e.old, e.new) for e in trace.for_handle(h) if e.kind == "phase_set"]
        assert moves == [("ordinary", "dx"), ("dx", "dw")], f"h{h}: {moves}"
    return {"handles": len(handles)}


def check_captured_through_trigger(trace, runs):
    dw = [e for e in trace.of_kind("grads_routed") if e.phase == "dw"]
    handles = lifecycle(trace).handle_ids
    assert len(dw) == len(handles) and all(e.targets == () for e in dw), dw
    accumulated = [c for e in dw for c in e.captured if c.accumulated]
    assert len(accumulated) == len(handles), accumulated
    snapshot = snapshot_before(trace, dw[0].seq)
    triggers = sorted({n.handle_id for n in snapshot.nodes if n.kind == "trigger"})
    assert triggers == sorted(handles), (triggers, handles)
    return {"handles": len(handles), "triggers": ", ".join(f"h{h}" for h in triggers),
            "captured": len(accumulated), "label": snapshot.label}
