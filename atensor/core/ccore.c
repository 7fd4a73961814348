/* atensor.core._ccore: the compiled core of the host path's hottest objects.

Why C, and why these objects: an eager awaited realize of a 16-element `x + 1` runs the same few
Python functions every time (measured with cProfile and perf_counter stages on a 2-core AMD EPYC Zen 4,
bench/round_trip_breakdown.py): the schedule key walk over the graph (sched/cache.py `walk_key`, the
largest self time of the round trip), the interning of each node an op records and of a
realize's BUFFER and ASSIGN nodes (graph/node.py `Node.make` and `_publish`), the ledger's commit of
each realized assign (atensor/ledger `commit_assign_locked`, `set_value_locked`), the BufferSpec of
each result, the inline-size check and the follow of a tensor's node to its storage's newest version
(engine/realize.py `_small`, `_follow_storage`), and the per-tensor loops of a realize (tensor/tensor.py
`_capture`, each tensor's node; engine/realize.py `_storages`, a Storage per computed tensor), which run on
the caller's thread, the event loop's: about 0.2 and 0.4 us a tensor in Python, 1.2-2 ms of a 3,000-output
realize's 2-3 ms there (thread_time, collections paused; bench/loop_lag.py --tiny 3000). Each is a short loop of attribute
reads, dict probes and tuple builds whose cost is the interpreter's, not the work's: here the same
reads are loads at a fixed slot offset and the probes are direct dict calls.

What stays Python: everything that decides something. A node the common elementwise rule cannot
infer goes to graph/node.py's `_make_general` (the Python rules, which raise the errors); a walk
that meets a realized value returns None and the scheduler substitutes in Python. The Python
functions are the executable specification: tests/core/ compares the two on random graphs.

Invariants kept here exactly as graph/node.py states them:
- one live node per key: a node is published under `_intern_lock` (the same threading.Lock the
  Python path takes, acquired through its bound `acquire`/`release`, so either path may run on any
  thread and both may be mixed), and the probe under the lock decides;
- a dead node's entry goes (its weak reference's callback, `forget`, bound to the key), unless a
  newer node replaced it;
- BufferSpec uids are unique and increase: the counter is bumped with the GIL held and no Python
  code in between (so no thread switch can split the read from the write).

Built with the plain C API (member descriptors' slot offsets are read from PyMemberDescrObject),
for CPython 3.11 and later. This file is the module: what configure() is given, the method table;
node.c, walk.c, ledger.c and fresh.c hold the objects, cl.c a short OpenCL command's launch and wait
(ccore.h what they share). */
#include "ccore.h"

/* ---- what configure() is given ------------------------------------------------------------- */
PyTypeObject *node_type;     /* graph.node.Node */
PyTypeObject *newnode_type;  /* graph.node._NewNode (a node being filled in by Python) */
PyTypeObject *spec_type;     /* graph.node.BufferSpec */
PyObject *interned;          /* graph.node._interned: key -> weakref */
PyObject *lock_acquire, *lock_release;  /* graph.node._intern_lock's bound methods */
PyObject *same_shape;        /* graph.node._SAME_SHAPE: op -> 0, 1 or 2 */
PyObject *multi_op, *buffer_op, *assign_op, *bool_dtype;
PyObject *str_shape, *str_mask;  /* interned attribute names of a View */
PyObject *make_general;      /* graph.node._make_general(op, dtype, src, arg, key) */
long long spec_uid;          /* the last uid handed out */

/* slot offsets of Node (op, dtype, src, arg, shape, device) and BufferSpec (uid, device, size, dtype) */
Py_ssize_t n_op, n_dtype, n_src, n_arg, n_shape, n_device;
Py_ssize_t s_uid, s_device, s_size, s_dtype;


int slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *offset) {
    PyObject *descr = PyObject_GetAttrString((PyObject *)type, name);
    if (descr == NULL)
        return -1;
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type)
            || ((PyMemberDescrObject *)descr)->d_member->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "atensor.core: %s.%s is not a __slots__ member", type->tp_name, name);
        Py_DECREF(descr);
        return -1;
    }
    *offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    Py_DECREF(descr);
    return 0;
}

int lock_methods(PyObject *lock, PyObject **acquire, PyObject **release) {
    PyObject *a = PyObject_GetAttrString(lock, "acquire");
    PyObject *r = a ? PyObject_GetAttrString(lock, "release") : NULL;
    if (r == NULL) {
        Py_XDECREF(a);
        return -1;
    }
    Py_XSETREF(*acquire, a);
    Py_XSETREF(*release, r);
    return 0;
}

void keep(PyObject **where, PyObject *value) {
    Py_XINCREF(value);
    Py_XSETREF(*where, value);
}

PyObject *configure(PyObject *module, PyObject *args) {
    PyObject *node, *newnode, *spec, *table, *lock, *rules, *multi, *buffer, *assign, *boolean, *general;
    long long last_uid;
    if (!PyArg_ParseTuple(args, "O!O!O!O!OO!OOOOOL:configure", &PyType_Type, &node, &PyType_Type, &newnode,
                          &PyType_Type, &spec, &PyDict_Type, &table, &lock, &PyDict_Type, &rules, &multi,
                          &buffer, &assign, &boolean, &general, &last_uid))
        return NULL;
    if (str_shape == NULL && ((str_shape = PyUnicode_InternFromString("shape")) == NULL
                              || (str_mask = PyUnicode_InternFromString("mask")) == NULL))
        return NULL;
    PyTypeObject *nt = (PyTypeObject *)node, *st = (PyTypeObject *)spec;
    if (slot_offset(nt, "op", &n_op) || slot_offset(nt, "dtype", &n_dtype) || slot_offset(nt, "src", &n_src)
            || slot_offset(nt, "arg", &n_arg) || slot_offset(nt, "shape", &n_shape)
            || slot_offset(nt, "device", &n_device) || slot_offset(st, "uid", &s_uid)
            || slot_offset(st, "device", &s_device) || slot_offset(st, "size", &s_size)
            || slot_offset(st, "dtype", &s_dtype))
        return NULL;
    if (((PyTypeObject *)newnode)->tp_basicsize != nt->tp_basicsize) {
        PyErr_SetString(PyExc_TypeError, "atensor.core: _NewNode must have Node's layout");
        return NULL;
    }
    if (lock_methods(lock, &lock_acquire, &lock_release) < 0)
        return NULL;
    keep((PyObject **)&node_type, node);
    keep((PyObject **)&newnode_type, newnode);
    keep((PyObject **)&spec_type, spec);
    keep(&interned, table);
    keep(&same_shape, rules);
    keep(&multi_op, multi);
    keep(&buffer_op, buffer);
    keep(&assign_op, assign);
    keep(&bool_dtype, boolean);
    keep(&make_general, general);
    spec_uid = last_uid;
    Py_RETURN_NONE;
}

int configured(void) {
    if (node_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "atensor.core._ccore is not configured (graph/node.py does it)");
        return 0;
    }
    return 1;
}

/* ---- the module ------------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(Node, _NewNode, BufferSpec, interned, intern_lock, same_shape, MULTI, BUFFER, ASSIGN, bool, "
     "make_general, last_uid): the Python objects the core works on (graph/node.py calls it once)."},
    {"make", (PyCFunction)(void (*)(void))make, METH_FASTCALL,
     "make(op, dtype, src=(), arg=None) -> Node: graph/node.py's Node.make (its general rules in Python)."},
    {"known", (PyCFunction)(void (*)(void))known, METH_FASTCALL,
     "known(key, shape, device) -> Node: graph/node.py's _known."},
    {"publish", (PyCFunction)(void (*)(void))publish, METH_FASTCALL,
     "publish(key, node) -> Node: graph/node.py's _publish."},
    {"new_spec", (PyCFunction)(void (*)(void))new_spec, METH_FASTCALL,
     "new_spec(cls, device, size, dtype) -> BufferSpec: BufferSpec.__new__ with the next uid."},
    {"last_uid", last_uid, METH_NOARGS, "The uid of the newest BufferSpec made so far."},
    {"walk_key", (PyCFunction)(void (*)(void))walk_key, METH_FASTCALL,
     "walk_key(roots, settings, has_entry) -> (key, leaves, order, buffer_nodes) or None: sched/cache.py's "
     "walk_key."},
    {"small_graph", (PyCFunction)(void (*)(void))small_graph, METH_FASTCALL,
     "small_graph(nodes, limit, has_entry) -> bool: engine/realize.py's _small."},
    {"configure_storages", configure_storages, METH_VARARGS,
     "configure_storages(Storage, VIEW, other_item): engine/realize.py's Storage and general case (it does it)."},
    {"storages", storages, METH_O,
     "storages(captured) -> (items, given): engine/realize.py's _storages."},
    {"capture", (PyCFunction)(void (*)(void))capture, METH_FASTCALL,
     "capture(tensors, keep_graphs) -> [(tensor, node)]: tensor/tensor.py's _capture."},
    {"configure_ledger", configure_ledger, METH_VARARGS,
     "configure_ledger(Record, records, new_record, values, pending): the ledger's tables (atensor/ledger does it)."},
    {"commit_assign_locked", (PyCFunction)(void (*)(void))commit_assign_locked, METH_FASTCALL,
     "commit_assign_locked(node, spec): atensor.ledger.commit_assign_locked."},
    {"set_value_locked", (PyCFunction)(void (*)(void))set_value_locked, METH_FASTCALL,
     "set_value_locked(node, target): atensor.ledger.set_value_locked."},
    {"configure_follow", configure_follow, METH_VARARGS,
     "configure_follow(VIEW, follow_to_latest): engine/realize.py's general case (it does it)."},
    {"follow_storage", follow_storage, METH_O, "follow_storage(node) -> Node: engine/realize.py's _follow_storage."},
    {"configure_attach", configure_attach, METH_VARARGS,
     "configure_attach(lock, drop_record): the ledger's lock and record callback (atensor/ledger does it)."},
    {"attach_new", (PyCFunction)(void (*)(void))attach_new, METH_FASTCALL,
     "attach_new(spec, runtime, version): atensor.ledger.attach_new."},
    {"drop_record", drop_record_c, METH_O,
     "drop_record(record): atensor.ledger._drop_record (the records' weak-reference callback)."},
    {"configure_fresh", configure_fresh, METH_VARARGS,
     "configure_fresh(Buffer, SmallPool, Lock, collector, python_fresh_small): hcq/device.py does it."},
    {"fresh_small", (PyCFunction)(void (*)(void))fresh_small, METH_FASTCALL,
     "fresh_small(device, spec, version, key) -> Buffer: hcq/device.py's fresh_small."},
    {"cl_open", cl_open, METH_O, "cl_open(path) -> bool: the loaded OpenCL library's entry points (cl.c)."},
    {"cl_enqueue", (PyCFunction)(void (*)(void))cl_enqueue, METH_FASTCALL,
     "cl_enqueue(queue, launches) -> (first event, last event): hcq/cl_native.py's launch."},
    {"cl_finish", (PyCFunction)(void (*)(void))cl_finish, METH_FASTCALL,
     "cl_finish(first, last) -> (status, start, end): waits, stamps and releases (cl.c)."},
    {"cl_release", cl_release, METH_O, "cl_release(event): releases an event cl_enqueue returned (cl.c)."},
    {"cl_spin", cl_spin, METH_O, "cl_spin(ns): how long cl_finish reads the status before it sleeps (cl.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "atensor.core._ccore",
    "The compiled core of atensor's hot host-path objects (see atensor/core/__init__.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__ccore(void) {
    return PyModule_Create(&module_def);
}
