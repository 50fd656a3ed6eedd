"""One rank of a test from torch's own suite (test/distributed/pipelining) run with ckpt_viz's stage on gloo.

torch's pipelining tests are `MultiProcContinuousTest` methods that ask for NCCL and 4 GPUs (skip decorators).
This runs the body of one of them, unchanged, in a rank of a 2-rank gloo group on CPU: the test module is
imported from a folder of torch's sources (this repository keeps no copy of them), the name `PipelineStage` in
that module is pointed at the stage under test, and the method is called past its skip decorators with its
parametrized arguments, on a stand-in `self` holding what the body reads (rank, world_size, device, config).
Each rank writes `<out>/rank<r>.txt`: "ok", or the traceback.
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback
import types

import torch
import torch.distributed as dist


def _variants(cls: type, method: str) -> list[tuple[object, dict]]:
    """(generic function, its arguments) of each parametrized variant of `method` (instantiate_parametrized_tests
    keeps them as the default of `param_kwargs`), or of the plain method."""
    found = []
    for name in sorted(dir(cls)):
        if name == method or name.startswith(method + "_"):
            fn = getattr(cls, name)
            defaults = getattr(fn, "__defaults__", None) or ()
            params = defaults[0] if defaults and isinstance(defaults[0], dict) else {}
            found.append((inspect.unwrap(fn), params))
    return found


def run(rank: int, world: int, port: int, test_dir: str, module_name: str, test: str, stage: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        sys.path.insert(0, test_dir)
        module = importlib.import_module(module_name)
        if stage == "ckpt_viz":
            from ckpt_viz.pipelining import PipelineStage

            module.PipelineStage = PipelineStage
        cls_name, method = test.split(".")
        cls = getattr(module, cls_name)
        variants = _variants(cls, method)
        if not variants:
            raise LookupError(f"{module_name}.{test} not found in {test_dir}")
        device = torch.device("cpu")
        config = module.PipelineTestConfig(world_size=world, device=device, rank=rank)
        me = types.SimpleNamespace(rank=rank, world_size=world, device=device, config=config)
        for fn, params in variants:
            torch.manual_seed(0)  # each rank builds the same model and data, as the module's import-time seed does
            fn(me, **params)
            dist.barrier()
        result = "ok"
    except BaseException:
        result = traceback.format_exc()
    finally:
        with open(os.path.join(out, f"rank{rank}.txt"), "w") as f:
            f.write(result)
        dist.destroy_process_group()
