#!/usr/bin/env bash
# Runs tinygrad's own op tests (test/backend/test_ops.py of a tinygrad checkout; test/test_ops.py in older
# ones) against atensor, comparing to PyTorch: tinygrad's suite stays in tinygrad's repository and is run
# from there through tests/ports/tinygrad_shim.py, which makes `tinygrad` mean atensor while the file imports.
#
#   git clone https://github.com/tinygrad/tinygrad /tmp/tinygrad
#   scripts/run_tinygrad_ops.sh /tmp/tinygrad              # every case on the CPU device
#   ATENSOR_TINYGRAD_OPS=subset scripts/run_tinygrad_ops.sh /tmp/tinygrad   # the 74-case subset (~15 s)
#   ATENSOR_DEVICE=CL scripts/run_tinygrad_ops.sh /tmp/tinygrad -x          # on OpenCL; more pytest options
#
# Known failures (tests/ports/tinygrad_known_failures.py, each with its reason) are xfail; the run ends with
# the pass rate. ATENSOR_TINYGRAD_OPS_SHARD=i/n and ATENSOR_TINYGRAD_OPS_SHUFFLE=seed split or reorder a
# slow run (docs/porting.md). PYTHON picks the interpreter (default: this checkout's .venv, else python3).
set -euo pipefail
if [ $# -lt 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 TINYGRAD_DIR [pytest options]  (TINYGRAD_DIR: a tinygrad checkout, git clone https://github.com/tinygrad/tinygrad)" >&2
  exit 2
fi
tinygrad_dir=$(cd "$1" && pwd)
shift
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-}
if [ -z "$python" ]; then
  if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python=python3; fi
fi
mode=${ATENSOR_TINYGRAD_OPS:-all}
[ "$mode" = subset ] && mode=
cd "$root"
ATENSOR_TINYGRAD_DIR="$tinygrad_dir" ATENSOR_TINYGRAD_OPS="$mode" PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" \
  exec "$python" -m pytest tests/ports/test_tinygrad_ops.py -p no:cacheprovider -q "$@"
