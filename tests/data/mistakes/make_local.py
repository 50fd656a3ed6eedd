"""Generator of the single-process half of the mistakes corpus: realistic mistakes, recorded and saved as traces.

    python tests/data/mistakes/make_local.py [NAME ...]      (default: every scenario, into this folder)

Each scenario is a small training step written the way a user would write it, with one mistake, recorded with
`ckpt_viz.record(model=...)` and saved as `<name>.json.gz` beside this file with `meta["mistake"]` saying what was
done. The distributed half (torch's stock stage, killed ranks, dw_builder) is `make.py`. Regenerate after a change
of the trace format; tests/distributed/test_mistakes.py checks the saved files and (slow) runs this again.

Scenarios:
  second-backward       `loss.backward(retain_graph=True)` then `loss.backward()` through an unscoped reentrant
                        checkpoint: the first backward released the handle, the second is refused.
  forgotten-handles     a split step whose `backward_weight(...)` forgets `handles=`: DW reaches none of the
                        micro-batch's handles, which are never released and whose parameters get no gradient.
  missing-trigger       DW written by hand with `torch.autograd.backward(loss, inputs=params)` after
                        `set_phase("dw")`: the handle's backward_trigger is not among the inputs, DW skips it.
  torch-checkpoint-grad torch's own reentrant checkpoint inside a pipeline stage's module, whose input-gradient
                        pass (torch's I action: `torch.autograd.grad` of the stage output) torch refuses.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCENARIOS = ("second-backward", "forgotten-handles", "missing-trigger", "torch-checkpoint-grad")


def _model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3)))


def second_backward() -> object:
    import torch

    import ckpt_viz
    from ckpt_viz.runtime import checkpoint

    model = _model()
    x = torch.randn(4, 8, requires_grad=True)
    with ckpt_viz.record(model=model) as rec:
        h = x
        for block in model:
            h = checkpoint(block, h, use_reentrant=True)
        loss = h.square().mean()
        loss.backward(retain_graph=True)
        try:
            loss.backward()  # the mistake: a second backward through the released checkpoints
        except RuntimeError:
            pass
    return rec.trace


def forgotten_handles() -> object:
    import torch

    import ckpt_viz
    from ckpt_viz.runtime import backward_input, backward_weight, checkpoint, reentrant_checkpoint_scope

    model = _model()
    params = list(model.parameters())
    x = torch.randn(4, 8, requires_grad=True)
    with ckpt_viz.record(model=model) as rec:
        with reentrant_checkpoint_scope(params) as handles:
            h = x
            for block in model:
                h = checkpoint(block, h, use_reentrant=True)
        loss = h.square().mean()
        backward_input(loss, None, [x], handles=handles)
        backward_weight(loss, None, params)  # the mistake: handles= forgotten
    return rec.trace


def missing_trigger() -> object:
    import torch

    import ckpt_viz
    from ckpt_viz.runtime import backward_input, checkpoint, reentrant_checkpoint_scope

    model = _model()
    params = list(model.parameters())
    x = torch.randn(4, 8, requires_grad=True)
    with ckpt_viz.record(model=model) as rec:
        with reentrant_checkpoint_scope(params) as handles:
            h = x
            for block in model:
                h = checkpoint(block, h, use_reentrant=True)
        loss = h.square().mean()
        backward_input(loss, None, [x], handles=handles)
        for handle in handles:
            handle.set_phase("dw")
        torch.autograd.backward(loss, inputs=params)  # the mistake: no handle.backward_trigger among the inputs
    return rec.trace


def torch_checkpoint_grad() -> object:
    import torch
    from torch.utils.checkpoint import checkpoint as torch_checkpoint

    import ckpt_viz

    model = _model()
    x = torch.randn(4, 8, requires_grad=True)
    with ckpt_viz.record(model=model) as rec:
        h = x
        for block in model:  # the mistake: torch's reentrant checkpoint inside a pipeline stage
            h = torch_checkpoint(block, h, use_reentrant=True)
        try:
            # what torch.distributed.pipelining's I action does with a stage's output: input gradients only
            torch.autograd.grad(h, [x], torch.ones_like(h))
        except RuntimeError:
            pass
    return rec.trace


MAKERS = {"second-backward": second_backward, "forgotten-handles": forgotten_handles,
          "missing-trigger": missing_trigger, "torch-checkpoint-grad": torch_checkpoint_grad}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"one of {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--out", default=HERE)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; expected {', '.join(SCENARIOS)}")
    for name in args.names or SCENARIOS:
        trace = MAKERS[name]()
        trace.meta["mistake"] = name
        path = os.path.join(args.out, f"{name}.json.gz")
        trace.save(path)
        print(f"{name}: {path} ({len(trace.events)} events)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
