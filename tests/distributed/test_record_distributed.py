"""`ckpt-viz record --distributed`'s torchrun command line (torch-free): our options before SCRIPT, torchrun's passed
through, --standalone only on one node, and everything after SCRIPT left to the script."""
from __future__ import annotations

from ckpt_viz.cli.record import distributed_parser, torchrun_argv


def test_single_node_is_standalone_and_script_options_stay_the_scripts() -> None:
    args = distributed_parser().parse_args(
        ["--distributed", "--nproc-per-node", "2", "--out", "t", "train.py", "--out", "x", "--nnodes", "9"])
    assert (args.out, args.script, args.script_args) == ("t", "train.py", ["--out", "x", "--nnodes", "9"])
    assert torchrun_argv(args, python="py") == [
        "py", "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
        "-m", "ckpt_viz.distributed", "train.py", "--out", "x", "--nnodes", "9"]


def test_multi_node_flags_are_passed_through() -> None:
    args = distributed_parser().parse_args(
        ["--distributed", "--nproc-per-node", "4", "--nnodes", "2", "--node-rank", "1", "--rdzv-id", "job7",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", "host:29400", "train.py"])
    argv = torchrun_argv(args, python="py")
    assert "--standalone" not in argv
    assert argv[:5] == ["py", "-m", "torch.distributed.run", "--nproc-per-node", "4"]
    flags = dict(zip(argv[5:-3:2], argv[6:-3:2]))
    assert flags == {"--nnodes": "2", "--node-rank": "1", "--rdzv-endpoint": "host:29400", "--rdzv-id": "job7",
                     "--rdzv-backend": "c10d"}
    assert argv[-3:] == ["-m", "ckpt_viz.distributed", "train.py"]
