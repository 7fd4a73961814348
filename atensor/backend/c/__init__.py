"""The native tier: kernels rendered to C (render.py) over a shared prelude (prelude.py, helpers.py),
built with the flags of flags.py, and compiled, cached and loaded by native.py; replay.py is the C of a
jit replay submitted in one foreign call."""
