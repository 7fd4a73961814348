"""The graph: immutable, interned nodes (node.py) over ops (ops.py), views (view.py) and symbolic shapes.

Why this package's init does one thing: graph/node.py makes the nodes of sharded values through
graph/multi.py's rules, and multi.py is built on node.py, so node.py cannot import it. The rules are
handed over here, explicitly, because a package's init runs before any of its modules: whichever
module of atensor.graph a process imports first, and whatever else it imports, node.py has the rules
before a node is made (tests/test_registrations.py imports them in other orders and subsets).
"""
from atensor.graph import multi as _multi
from atensor.graph.node import register_multi as _register_multi

_register_multi(_multi.push, _multi.view, _multi.movement, _multi.infer)
