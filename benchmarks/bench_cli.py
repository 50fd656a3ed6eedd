"""How long does `ckpt-viz info` take on a small trace, start-up included?

    .venv/bin/python benchmarks/bench_cli.py            # 10 runs
    .venv/bin/python benchmarks/bench_cli.py --quick    # 2 runs

Writes a small synthetic trace (2,000 events, as bench_trace_io builds them), runs
`<python> -m ckpt_viz info <file>` (what the `ckpt-viz` script runs) in a fresh interpreter
`--runs` times and reports the median wall time (target 0.5 s) and the median CPU time of the child (user + system: on a
loaded machine the wall time includes waiting for a core). Then one `-X importtime` run
lists the slowest imports, and the script checks that torch was never imported. No torch here.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_trace_io import build_trace  # noqa: E402

TARGET_S = 0.5


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    runs = 2 if args.quick else args.runs
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "small.json.gz"
        build_trace(2_000).save(path)
        command = [sys.executable, "-m", "ckpt_viz", "info", str(path)]
        walls, cpus = [], []
        for _ in range(runs):
            cpu = _child_cpu()
            start = time.perf_counter()
            proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
            walls.append(time.perf_counter() - start)
            cpus.append(_child_cpu() - cpu)
            if proc.returncode != 0:
                print(f"bench_cli: `ckpt-viz info` failed ({proc.returncode}):\n{proc.stderr}")
                return 2
        probe = subprocess.run([sys.executable, "-X", "importtime", "-c",
                                "import sys; from ckpt_viz.__main__ import main; code = main(['info', sys.argv[1]]); "
                                "print('torch imported:', 'torch' in sys.modules)", str(path)],
                               capture_output=True, text=True, cwd=ROOT)
    imports = []
    for line in probe.stderr.splitlines():
        parts = line.split("|")
        if line.startswith("import time:") and len(parts) == 3 and parts[1].strip().isdigit():
            imports.append((int(parts[1]), parts[2].rstrip()))
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    print(f"bench_cli: `ckpt-viz info` on a 2,000-event trace, {runs} fresh interpreters")
    print(f"median wall {wall:.3f} s (target {TARGET_S} s) {'PASS' if wall <= TARGET_S else 'FAIL'}; "
          f"median CPU (user+sys) {cpu:.3f} s; {(probe.stdout.strip().splitlines() or ['?'])[-1]}")
    print("slowest imports (cumulative us):")
    for us, name in sorted(imports, reverse=True)[:8]:
        print(f"  {us:>9,}  {name.strip()}")
    return 0 if wall <= TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
