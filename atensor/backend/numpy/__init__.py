"""The numpy tier: render.py turns each fused kernel into a Python function over numpy, once;
plans.py holds the work it decides at render time instead of on every call. Every kernel has this
form, so it is the fallback when no C compiler is present."""
