"""Measured activation memory of pipeline stage 0 follows the Zero Bubble paper's accounting.

GPipe holds all M micro-batches before its first backward; 1F1B and ZB-H1 hold at
most p (= number of stages). Measured in bytes by the memory probe: the stage-0
tensors held as checkpoint inputs, in units of one micro-batch.
"""
from __future__ import annotations

import bisect

import pytest
import torch

from ckpt_viz.run.pipeline import run_pipeline
from ckpt_viz.run.zoo import ModelSpec, PipelineModel


def _spec(stages: int) -> ModelSpec:
    torch.manual_seed(0)
    model = PipelineModel(8, n_stages=stages, blocks_per_stage=2)
    return ModelSpec("pipe", model, (torch.randn(12, 8),),
                     checkpoint=tuple(f"stages.{s}.{b}" for s in range(stages) for b in range(2)),
                     stages=tuple(f"stages.{s}" for s in range(stages)))


def _held_microbatches(schedule: str, stages: int, microbatches: int) -> float:
    trace = run_pipeline(_spec(stages), schedule=schedule, microbatches=microbatches, memory=True)
    seqs = [s.seq for s in trace.memory]
    readings = [trace.memory[bisect.bisect_right(seqs, e.seq) - 1] for e in trace.events]  # steps -> every event
    held = [s.by_stage.get("0", {}).get("checkpoint_inputs", 0) for s in readings]
    # Right when stage 0 starts micro-batch 1, it holds exactly micro-batch 0's checkpointed block inputs.
    second = next(i for i, e in enumerate(trace.events) if e.tags.get("stage") == 0 and e.tags.get("microbatch") == 1)
    unit = held[second]
    assert unit > 0
    return max(held) / unit


@pytest.mark.parametrize("stages,microbatches", [(2, 4), (3, 6)])
def test_gpipe_holds_every_microbatch(stages: int, microbatches: int) -> None:
    assert _held_microbatches("GPipe", stages, microbatches) == pytest.approx(microbatches)


@pytest.mark.parametrize("schedule", ["1F1B", "ZB-H1"])
@pytest.mark.parametrize("stages,microbatches", [(2, 4), (3, 6)])
def test_1f1b_and_zb_h1_hold_at_most_p_microbatches(schedule: str, stages: int, microbatches: int) -> None:
    held = _held_microbatches(schedule, stages, microbatches)
    assert held <= stages + 1e-9
    assert held == pytest.approx(stages)  # and they do fill the pipeline
