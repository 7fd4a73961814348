"""GPU kernels: render.py lowers a kernel AST into data-parallel kernels from the C renderer's
lowering, dialect.py holds what differs between kernel languages, and index.py the index arithmetic a
GPU kernel computes itself, rendered and proved alike."""
