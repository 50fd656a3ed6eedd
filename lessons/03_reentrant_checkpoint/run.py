"""Lesson 3: the built-in mlp with the reentrant checkpoint."""
from ckpt_viz import lessons


def record_reentrant():
    return lessons.builtin("mlp", "reentrant")


def check_no_holders(trace, runs):
    assert trace.count("tensor_packed") == 0
    assert trace.count("handle_created") == 4
    return "0 holders packed; 4 handles, one per checkpointed block"


def check_replay_inside_backward(trace, runs):
    for h in trace.handle_ids():
        kinds = [e.kind for e in trace.for_handle(h)]
        order = [kinds.index(k) for k in ("backward_entered", "replay_started", "replay_finished", "grads_routed",
                                          "released")]
        assert order == sorted(order), f"h{h}: {kinds}"
    return "for every handle: backward_entered < replay_started < replay_finished < grads_routed < released"
