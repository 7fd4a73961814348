"""The native tier: kernels rendered to C (render.py) over a shared prelude (prelude.py, helpers.py), built
with the flags of flags.py. One module per job:
- compiler.py: which C compiler, and one source compiled into a shared library;
- library.py: the disk cache of compiled libraries and loading them (kernel libraries and helpers);
- registry.py: the compiled kernels by AST (`prepare`, `lookup`, background compiles, `status`);
- programs.py: running native kernels many at once in one foreign call, and the C timelines;
- replay.py: the C of a jit replay submitted in one foreign call.
Each job's state is one typed object in its module (`DISCOVERY`, `LOADED`, `REGISTRY` / `FAILURES` /
`BACKGROUND`, `RUNTIME` / `TIMELINES`), whose docstring says its lock and lifetime. The BLAS functions
the kernels call are found by backend/gemm/openblas.py, the packed-weight helper is loaded by
backend/quant/kernels.py."""
