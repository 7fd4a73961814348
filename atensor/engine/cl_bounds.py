"""Proves the index arithmetic a GPU program computes itself inside its buffers, with z3.

Why: sched/boundscheck.py proves every view of a kernel's AST inside its buffer; the GPU renderer
turns views into addresses the way the C renderer does, so that proof covers them. A tiled matmul's
addresses come from the renderer's own arithmetic instead (work-group and work-item ids split into
tiles, a loop over the inner axis's tiles, guards at the ragged edges). The renderer writes that
arithmetic as `IndexProof` records (backend/gpu/index.py) and renders the kernel's text from the same
records; this module proves each global load and store they describe inside its buffer, for every
work-group, work-item and loop step, under the access's guard. A violation raises BoundsError with
a counterexample (the ids, the index) before the program is built.

Run where the kernel-level proof runs (`settings.racecheck`, on in every test), once per rendered
program (engine/lower_cl.py keeps programs by AST).
"""
from __future__ import annotations

from typing import Any, Optional

from atensor.backend.gpu.index import IExpr, IndexProof
from atensor.backend.gpu.render import GPUProgram
from atensor.sched.boundscheck import BoundsError
from atensor.sched.prove import ProofTimeout, Symbols, find_counterexample, z3mod


def check_program(prog: GPUProgram, name: str) -> None:
    """Proves every access of `prog`'s index proofs in bounds; raises BoundsError naming the kernel."""
    for proof in prog.proofs:
        try:
            found = violation(proof)
        except ProofTimeout as err:
            raise BoundsError(f"{name}: cannot prove the {proof.kernel}'s accesses in bounds: {err}") from None
        if found is not None:
            raise BoundsError(f"{name}: {found}")


def violation(proof: IndexProof) -> Optional[str]:
    """The first access of `proof` that can leave its buffer, described with a counterexample, or None."""
    z3 = z3mod()
    symbols = Symbols()
    env: dict[str, Any] = {}
    ranges = []
    for unknown, (lo, hi, step) in proof.ranges.items():
        const = env[unknown] = symbols.fresh(unknown)
        ranges += [const >= lo, const <= hi]
        if step > 1:  # a loop counter: lo, lo + step, ...
            ranges.append((const - lo) % step == 0)
    for name, expr in proof.defs:
        env[name] = _z3(expr, env)
    for access in proof.accesses:
        index = _z3(access.index, env)
        guards = [_z3(g.lhs, env) < g.bound for g in access.guards]
        outside = z3.Or(index < 0, index >= access.elements)
        shown = [(u, env[u]) for u in proof.ranges] + [("index", index)]
        found = find_counterexample(symbols, ranges + guards + [outside], shown)
        if found is not None:
            where = ", ".join(f"{k}={v}" for k, v in found.items() if k != "index")
            return (f"the {proof.kernel}'s {access.what} ({access.buffer}, {access.elements} elements) reads "
                    f"element {found['index']} at {where}" if access.what.startswith("load") else
                    f"the {proof.kernel}'s {access.what} ({access.buffer}, {access.elements} elements) writes "
                    f"element {found['index']} at {where}")
    return None


def _z3(expr: IExpr, env: dict[str, Any]) -> Any:
    z3 = z3mod()
    if expr.op == "var":
        return env[expr.args[0]]
    if expr.op == "const":
        return z3.IntVal(expr.args[0])
    a, b = (_z3(x, env) for x in expr.args)
    if expr.op == "+":
        return a + b
    if expr.op == "*":
        return a * b
    if expr.op == "//":  # z3's integer division floors; on the non-negative values here C's agrees
        return a / b
    return a % b


__all__ = ["check_program", "violation"]
