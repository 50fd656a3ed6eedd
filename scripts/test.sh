#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite. CI runs exactly this (see .ci/run), then ruff and mypy.
# Two phases, both always run; the exit status is non-zero if either failed:
#   1. the tests not marked `serial`, on parallel pytest-xdist workers (one per CPU, at most 4; a test file stays on
#      one worker, so its module fixtures are made once; CKPT_VIZ_TEST_WORKERS sets the number, 1 runs in-process),
#      each with one torch intra-op thread unless OMP_NUM_THREADS says otherwise (workers that each start a thread per
#      CPU oversubscribe the CPUs: torch's busy-waiting threads made the parallel phase no faster than one worker);
#   2. the tests marked `serial` ([tool.pytest.ini_options] markers: wall-clock timing, a memory peak, the
#      machine's process table), one at a time, with nothing beside them.
# Extra arguments go to pytest in both phases; a `-m` expression is combined with each phase's own. The inner loop
# while editing skips the slow and browser tests:
#   bash scripts/test.sh -m "not slow and not browser"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

args=()
mark=""
while [ $# -gt 0 ]; do
  case "$1" in
    -m) mark="${2:?scripts/test.sh: -m needs an expression}"; shift 2 ;;
    -m*) mark="${1#-m}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
within() { if [ -n "$mark" ]; then echo "($mark) and $1"; else echo "$1"; fi; }

workers=${CKPT_VIZ_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}
[ "$workers" -gt 4 ] && [ -z "${CKPT_VIZ_TEST_WORKERS:-}" ] && workers=4
phase1=(.venv/bin/python -m pytest -q)
if [ "$workers" -gt 1 ]; then
  phase1=(env "OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}" .venv/bin/python -m pytest -q -n "$workers" --dist loadfile)
fi

# pytest's exit status 5 is "no tests collected": a phase the selection left empty has nothing to fail.
echo "[test] phase 1 of 2: the tests not marked serial, on ${workers} worker(s)"
first=0
"${phase1[@]}" -m "$(within "not serial")" ${args[@]+"${args[@]}"} || first=$?
echo "[test] phase 2 of 2: the tests marked serial, one at a time"
second=0
.venv/bin/python -m pytest -q -m "$(within serial)" ${args[@]+"${args[@]}"} || second=$?
echo "[test] phase 1 exit ${first}, phase 2 exit ${second}"
# For review, not a failure (docs/design.md, "Module sizes"): the modules past 600 lines, to look at again.
long=$(find ckpt_viz app -name '*.py' -exec wc -l {} + | awk '$2 != "total" && $1 > 600 {print "  " $2 " (" $1 " lines)"}')
[ -n "$long" ] && printf '[review] modules past 600 lines (is each still one concept?):\n%s\n' "$long"
if [ "$first" = 5 ] && [ "$second" = 5 ]; then exit 5; fi
[ "$first" = 5 ] && first=0
[ "$second" = 5 ] && second=0
exit $(( first ? first : second ))
