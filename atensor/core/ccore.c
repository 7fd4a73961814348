/* atensor.core._ccore: the compiled core of the host path's hottest objects.

Why C, and why these objects: an eager awaited realize of a 16-element `x + 1` runs the same few
Python functions every time (measured with cProfile and perf_counter stages on a 2-core AMD EPYC Zen 4,
bench/round_trip_breakdown.py): the schedule key walk over the graph (sched/cache.py `walk_key`, the
largest self time of the round trip), the interning of each node an op records and of a
realize's BUFFER and ASSIGN nodes (graph/node.py `Node.make` and `_publish`), the ledger's commit of
each realized assign (atensor/ledger `commit_assign_locked`, `set_value_locked`), the BufferSpec of
each result, the inline-size check and the follow of a tensor's node to its storage's newest version
(engine/realize.py `_small`, `_follow_storage`). Each is a short loop of attribute
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
for CPython 3.11 and later. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* ---- what configure() is given ------------------------------------------------------------- */
static PyTypeObject *node_type;     /* graph.node.Node */
static PyTypeObject *newnode_type;  /* graph.node._NewNode (a node being filled in by Python) */
static PyTypeObject *spec_type;     /* graph.node.BufferSpec */
static PyObject *interned;          /* graph.node._interned: key -> weakref */
static PyObject *lock_acquire, *lock_release;  /* graph.node._intern_lock's bound methods */
static PyObject *same_shape;        /* graph.node._SAME_SHAPE: op -> 0, 1 or 2 */
static PyObject *multi_op, *buffer_op, *assign_op, *bool_dtype;
static PyObject *str_shape, *str_mask;  /* interned attribute names of a View */
static PyObject *make_general;      /* graph.node._make_general(op, dtype, src, arg, key) */
static long long spec_uid;          /* the last uid handed out */

/* slot offsets of Node (op, dtype, src, arg, shape, device) and BufferSpec (uid, device, size, dtype) */
static Py_ssize_t n_op, n_dtype, n_src, n_arg, n_shape, n_device;
static Py_ssize_t s_uid, s_device, s_size, s_dtype;

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

static int slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *offset) {
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

static void keep(PyObject **where, PyObject *value) {
    Py_XINCREF(value);
    Py_XSETREF(*where, value);
}

static PyObject *configure(PyObject *module, PyObject *args) {
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
    PyObject *acquire = PyObject_GetAttrString(lock, "acquire");
    PyObject *release = acquire ? PyObject_GetAttrString(lock, "release") : NULL;
    if (release == NULL) {
        Py_XDECREF(acquire);
        return NULL;
    }
    Py_XSETREF(lock_acquire, acquire);
    Py_XSETREF(lock_release, release);
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

static int configured(void) {
    if (node_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "atensor.core._ccore is not configured (graph/node.py does it)");
        return 0;
    }
    return 1;
}

/* ---- the node table -------------------------------------------------------------------------- */

/* The live node interned under `key`, as a new reference; NULL with no error when none lives. */
static PyObject *lookup_live(PyObject *key) {
    PyObject *ref = PyDict_GetItemWithError(interned, key);
    if (ref == NULL)
        return NULL;
    PyObject *found = PyWeakref_GetObject(ref);  /* borrowed; Py_None when dead */
    if (found == NULL || found == Py_None)
        return NULL;
    Py_INCREF(found);
    return found;
}

/* A node died: its entry goes, unless a newer node with the same key replaced it. `self` is the key. */
static PyObject *forget(PyObject *key, PyObject *ref) {
    PyObject *current = PyDict_GetItemWithError(interned, key);
    if (current == ref) {
        if (PyDict_DelItem(interned, key) < 0)
            return NULL;
    } else if (current == NULL && PyErr_Occurred()) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef forget_def = {"forget", (PyCFunction)forget, METH_O,
                                 "Drops the node table's entry of a dead node (bound to its key)."};

static PyObject *call_noargs(PyObject *fn) {
    return PyObject_CallNoArgs(fn);
}

/* `node` made a Node and interned under `key`, or the node another thread interned under it meanwhile.
   Steals nothing; returns a new reference. */
static PyObject *publish_node(PyObject *key, PyObject *node) {
    if (Py_TYPE(node) == newnode_type) {  /* a node Python filled in: now a Node (same layout) */
        Py_INCREF(node_type);
        Py_SET_TYPE(node, node_type);
        Py_DECREF(newnode_type);
    }
    PyObject *held = call_noargs(lock_acquire);
    if (held == NULL)
        return NULL;
    Py_DECREF(held);
    PyObject *result = lookup_live(key);
    if (result == NULL && !PyErr_Occurred()) {
        PyObject *callback = PyCFunction_New(&forget_def, key);
        PyObject *ref = callback ? PyWeakref_NewRef(node, callback) : NULL;
        Py_XDECREF(callback);
        if (ref != NULL) {
            int failed = PyDict_SetItem(interned, key, ref);
            Py_DECREF(ref);
            if (!failed) {
                Py_INCREF(node);
                result = node;
            }
        }
    }
    /* release even when something failed above (keeping the error raised there) */
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    PyObject *released = call_noargs(lock_release);
    if (released == NULL) {
        Py_XDECREF(result);
        Py_XDECREF(exc_type);
        Py_XDECREF(exc_value);
        Py_XDECREF(exc_tb);
        return NULL;
    }
    Py_DECREF(released);
    PyErr_Restore(exc_type, exc_value, exc_tb);
    return result;
}

static PyObject *publish(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "publish(key, node)");
        return NULL;
    }
    if (!configured())
        return NULL;
    return publish_node(args[0], args[1]);
}

/* The Node of (op, dtype, src, arg) with `shape` and `device` (new reference), not yet published. */
static PyObject *new_node(PyObject *op, PyObject *dtype, PyObject *src, PyObject *arg, PyObject *shape,
                          PyObject *device) {
    PyObject *node = node_type->tp_alloc(node_type, 0);
    if (node == NULL)
        return NULL;
    PyObject *values[6] = {op, dtype, src, arg, shape, device};
    Py_ssize_t offsets[6] = {n_op, n_dtype, n_src, n_arg, n_shape, n_device};
    for (int i = 0; i < 6; i++) {
        Py_INCREF(values[i]);
        SLOT(node, offsets[i]) = values[i];
    }
    return node;
}

/* The common elementwise rule of graph/node.py's `Node.make`: 1 when every source has the first's
   shape and device (and its dtype under rule 1; a bool first source under rule 2) and none is
   sharded, with the shape and device set (borrowed); 0 when the general rules must decide; -1 on error. */
static int same_shape_rule(PyObject *op, PyObject *src, PyObject **shape, PyObject **device) {
    PyObject *rule = PyDict_GetItemWithError(same_shape, op);
    if (rule == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyTuple_CheckExact(src) || PyTuple_GET_SIZE(src) == 0)
        return 0;
    long kind = PyLong_AsLong(rule);
    if (kind == -1 && PyErr_Occurred())
        return -1;
    PyObject *first = PyTuple_GET_ITEM(src, 0);
    if (!PyObject_TypeCheck(first, node_type))
        return 0;
    PyObject *first_shape = SLOT(first, n_shape), *first_device = SLOT(first, n_device);
    PyObject *first_dtype = SLOT(first, n_dtype);
    Py_ssize_t count = PyTuple_GET_SIZE(src);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *s = PyTuple_GET_ITEM(src, i);
        if (!PyObject_TypeCheck(s, node_type) || SLOT(s, n_op) == multi_op)
            return 0;
        PyObject *ss = SLOT(s, n_shape), *sd = SLOT(s, n_device);
        if (ss != first_shape) {
            int equal = PyObject_RichCompareBool(ss, first_shape, Py_EQ);
            if (equal <= 0)
                return equal;
        }
        if (sd != first_device) {
            int equal = PyObject_RichCompareBool(sd, first_device, Py_EQ);
            if (equal <= 0)
                return equal;
        }
        if (kind == 1 && SLOT(s, n_dtype) != first_dtype)
            return 0;
    }
    if (kind == 2 && first_dtype != bool_dtype)
        return 0;
    *shape = first_shape;
    *device = first_device;
    return 1;
}

/* graph/node.py `_infer`'s rules for a BUFFER node, (BufferSpec, version): shape (size,) and the spec's
   device (new references). 1 when they apply, 0 when the general rules must decide. */
static int buffer_rule(PyObject *src, PyObject *arg, PyObject **shape, PyObject **device) {
    if (!PyTuple_CheckExact(src) || PyTuple_GET_SIZE(src) != 0 || !PyTuple_CheckExact(arg)
            || PyTuple_GET_SIZE(arg) != 2 || !PyObject_TypeCheck(PyTuple_GET_ITEM(arg, 0), spec_type))
        return 0;
    PyObject *spec = PyTuple_GET_ITEM(arg, 0);
    *shape = PyTuple_Pack(1, SLOT(spec, s_size));
    if (*shape == NULL)
        return -1;
    *device = SLOT(spec, s_device);
    Py_INCREF(*device);
    return 1;
}

/* `_infer`'s rule for ASSIGN(storage, value) through the View `arg`, where it holds: the storage is a
   BUFFER or an ASSIGN, the value has the view's shape and the storage's device, the view has no mask,
   no source is sharded. Shape and device are the storage's (new references). 1 when it holds, 0 when
   the general rules must decide (and raise), -1 on error. */
static int assign_rule(PyObject *src, PyObject *arg, PyObject **shape, PyObject **device) {
    if (!PyTuple_CheckExact(src) || PyTuple_GET_SIZE(src) != 2)
        return 0;
    PyObject *storage = PyTuple_GET_ITEM(src, 0), *value = PyTuple_GET_ITEM(src, 1);
    if (!PyObject_TypeCheck(storage, node_type) || !PyObject_TypeCheck(value, node_type))
        return 0;
    PyObject *storage_op = SLOT(storage, n_op);
    if ((storage_op != buffer_op && storage_op != assign_op) || SLOT(value, n_op) == multi_op)
        return 0;
    PyObject *mask = PyObject_GetAttr(arg, str_mask);
    if (mask == NULL)
        return -1;
    Py_DECREF(mask);
    if (mask != Py_None)
        return 0;
    PyObject *view_shape = PyObject_GetAttr(arg, str_shape);
    if (view_shape == NULL)
        return -1;
    int equal = PyObject_RichCompareBool(SLOT(value, n_shape), view_shape, Py_EQ);
    Py_DECREF(view_shape);
    if (equal <= 0)
        return equal;
    PyObject *sd = SLOT(storage, n_device), *vd = SLOT(value, n_device);
    if (sd != vd && (equal = PyObject_RichCompareBool(vd, sd, Py_EQ)) <= 0)
        return equal;
    *shape = SLOT(storage, n_shape);
    *device = sd;
    Py_INCREF(*shape);
    Py_INCREF(*device);
    return 1;
}

/* Shape and device of a new node by the rules kept here (new references): 1, or 0 when the general
   rules (Python) must decide, -1 on error. */
static int fast_rules(PyObject *op, PyObject *src, PyObject *arg, PyObject **shape, PyObject **device) {
    if (op == buffer_op)
        return buffer_rule(src, arg, shape, device);
    if (op == assign_op)
        return assign_rule(src, arg, shape, device);
    int rule = same_shape_rule(op, src, shape, device);
    if (rule == 1) {
        Py_INCREF(*shape);
        Py_INCREF(*device);
    }
    return rule;
}

static PyObject *make(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "Node.make(op, dtype, src=(), arg=None)");
        return NULL;
    }
    if (!configured())
        return NULL;
    PyObject *op = args[0], *dtype = args[1];
    PyObject *src = nargs > 2 ? args[2] : NULL, *arg = nargs > 3 ? args[3] : Py_None;
    PyObject *empty = NULL;
    if (src == NULL) {
        src = empty = PyTuple_New(0);
        if (src == NULL)
            return NULL;
    }
    PyObject *key = PyTuple_Pack(4, op, dtype, src, arg);
    PyObject *result = NULL;
    if (key == NULL)
        goto done;
    result = lookup_live(key);
    if (result != NULL || PyErr_Occurred())
        goto done;
    PyObject *shape, *device;
    int rule = fast_rules(op, src, arg, &shape, &device);
    if (rule < 0)
        goto done;
    if (rule == 0) {  /* the general rules (graph/node.py), which raise for invalid operands */
        PyObject *call[5] = {op, dtype, src, arg, key};
        result = PyObject_Vectorcall(make_general, call, 5, NULL);
        goto done;
    }
    PyObject *node = new_node(op, dtype, src, arg, shape, device);
    Py_DECREF(shape);
    Py_DECREF(device);
    if (node != NULL) {
        result = publish_node(key, node);
        Py_DECREF(node);
    }
done:
    Py_XDECREF(key);
    Py_XDECREF(empty);
    return result;
}

static PyObject *known(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyTuple_CheckExact(args[0]) || PyTuple_GET_SIZE(args[0]) != 4) {
        PyErr_SetString(PyExc_TypeError, "known((op, dtype, src, arg), shape, device)");
        return NULL;
    }
    if (!configured())
        return NULL;
    PyObject *key = args[0];
    PyObject *found = lookup_live(key);
    if (found != NULL || PyErr_Occurred())
        return found;
    PyObject *node = new_node(PyTuple_GET_ITEM(key, 0), PyTuple_GET_ITEM(key, 1), PyTuple_GET_ITEM(key, 2),
                              PyTuple_GET_ITEM(key, 3), args[1], args[2]);
    if (node == NULL)
        return NULL;
    PyObject *result = publish_node(key, node);
    Py_DECREF(node);
    return result;
}

/* ---- BufferSpec ------------------------------------------------------------------------------ */

static PyObject *new_spec(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    /* BufferSpec.__new__(cls, device, size, dtype) */
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "BufferSpec(device, size, dtype)");
        return NULL;
    }
    if (!configured())
        return NULL;
    PyTypeObject *cls = (PyTypeObject *)args[0];
    if (!PyType_Check(args[0]) || !PyType_IsSubtype(cls, spec_type)) {
        PyErr_SetString(PyExc_TypeError, "BufferSpec.__new__: the class must be BufferSpec or a subclass");
        return NULL;
    }
    PyObject *spec = cls->tp_alloc(cls, 0);
    if (spec == NULL)
        return NULL;
    PyObject *uid = PyLong_FromLongLong(++spec_uid);  /* (GIL held, no Python code since the read) */
    if (uid == NULL) {
        Py_DECREF(spec);
        return NULL;
    }
    SLOT(spec, s_uid) = uid;
    Py_INCREF(args[1]);
    SLOT(spec, s_device) = args[1];
    Py_INCREF(args[2]);
    SLOT(spec, s_size) = args[2];
    Py_INCREF(args[3]);
    SLOT(spec, s_dtype) = args[3];
    return spec;
}

static PyObject *last_uid(PyObject *module, PyObject *unused) {
    return PyLong_FromLongLong(spec_uid);
}

/* ---- the schedule key walk ------------------------------------------------------------------- */

/* The dict behind `has_entry` when it is a dict's bound `get` (the ledger's `value_entry`), else NULL. */
static PyObject *dict_of_get(PyObject *fn) {
    if (!PyCFunction_Check(fn))
        return NULL;
    PyObject *self = PyCFunction_GET_SELF(fn);
    PyMethodDef *def = ((PyCFunctionObject *)fn)->m_ml;
    if (self != NULL && PyDict_CheckExact(self) && strcmp(def->ml_name, "get") == 0)
        return self;
    return NULL;
}

/* 1 when the ledger may hold a value for `node` (has_entry(id(node)) is not None), 0 if not, -1 error */
static int has_value(PyObject *node, PyObject *table, PyObject *fn) {
    PyObject *id = PyLong_FromVoidPtr(node);
    if (id == NULL)
        return -1;
    if (table != NULL) {
        PyObject *found = PyDict_GetItemWithError(table, id);
        Py_DECREF(id);
        if (found == NULL)
            return PyErr_Occurred() ? -1 : 0;
        return found != Py_None;
    }
    PyObject *found = PyObject_CallOneArg(fn, id);
    Py_DECREF(id);
    if (found == NULL)
        return -1;
    int has = found != Py_None;
    Py_DECREF(found);
    return has;
}

/* The key's part of `node`, emitted at `position`; appends to the walk's lists. 0 or -1 on error. */
static int emit(PyObject *node, PyObject *position, PyObject *slots, PyObject *leaves, PyObject *buffer_nodes,
                PyObject *parts) {
    PyObject *part;
    if (SLOT(node, n_op) == buffer_op) {
        PyObject *arg = SLOT(node, n_arg);
        if (!PyTuple_Check(arg) || PyTuple_GET_SIZE(arg) < 1 || !PyObject_TypeCheck(PyTuple_GET_ITEM(arg, 0), spec_type)) {
            PyErr_SetString(PyExc_TypeError, "a BUFFER node's argument must be (BufferSpec, version)");
            return -1;
        }
        PyObject *spec = PyTuple_GET_ITEM(arg, 0);
        PyObject *slot = PyDict_GetItemWithError(slots, spec);
        if (slot == NULL) {
            if (PyErr_Occurred())
                return -1;
            slot = PyLong_FromSsize_t(PyList_GET_SIZE(leaves));
            if (slot == NULL)
                return -1;
            int failed = PyDict_SetItem(slots, spec, slot) || PyList_Append(leaves, spec);
            Py_DECREF(slot);  /* (the dict holds it) */
            if (failed)
                return -1;
        }
        if (PyList_Append(buffer_nodes, node) < 0)
            return -1;
        part = PyTuple_Pack(5, buffer_op, SLOT(node, n_dtype), slot, SLOT(spec, s_device), SLOT(spec, s_size));
    } else {
        PyObject *src = SLOT(node, n_src);
        Py_ssize_t count = PyTuple_GET_SIZE(src);
        PyObject *places = PyTuple_New(count);
        if (places == NULL)
            return -1;
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *at = PyDict_GetItemWithError(position, PyTuple_GET_ITEM(src, i));
            if (at == NULL) {
                Py_DECREF(places);
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_RuntimeError, "walk_key: a source was not emitted before its user");
                return -1;
            }
            Py_INCREF(at);
            PyTuple_SET_ITEM(places, i, at);
        }
        part = PyTuple_Pack(4, SLOT(node, n_op), SLOT(node, n_dtype), SLOT(node, n_arg), places);
        Py_DECREF(places);
    }
    if (part == NULL)
        return -1;
    int failed = PyList_Append(parts, part);
    Py_DECREF(part);
    return failed;
}

/* A walk over a big graph (a realize of 3,000 outputs: 18,000 nodes, ~11 ms of CPU here) lets other
   threads take the GIL every this many nodes, as the interpreter lets them every 5 ms (its switch
   interval) in the Python walk: held for the whole walk, the GIL kept the event loop's thread waiting
   (on a loaded machine, while this thread was descheduled holding it; tests/engine/test_async.py's gap
   test failed). The walk's state is its own and nodes are immutable, so another thread may run between
   any two steps, as it may in the Python walk. */
#define YIELD_EVERY_NODES 1024

static PyObject *walk_key(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    /* walk_key(roots, settings, has_entry) -> (key, leaves, order, buffer_nodes) or None */
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "walk_key(roots, settings, has_entry)");
        return NULL;
    }
    if (!configured())
        return NULL;
    PyObject *roots = PySequence_Fast(args[0], "walk_key: roots must be a sequence of Nodes");
    if (roots == NULL)
        return NULL;
    PyObject *settings = args[1], *fn = args[2];
    PyObject *table = dict_of_get(fn);
    PyObject *position = PyDict_New(), *expanded = PySet_New(NULL), *slots = PyDict_New();
    PyObject *leaves = PyList_New(0), *buffer_nodes = PyList_New(0), *parts = PyList_New(0);
    PyObject *order = PyList_New(0), *stack = PyList_New(0);
    PyObject *result = NULL;
    size_t steps = 0;
    if (!position || !expanded || !slots || !leaves || !buffer_nodes || !parts || !order || !stack)
        goto done;
    for (Py_ssize_t r = 0; r < PySequence_Fast_GET_SIZE(roots); r++) {
        PyObject *root = PySequence_Fast_GET_ITEM(roots, r);
        if (!PyObject_TypeCheck(root, node_type)) {
            PyErr_SetString(PyExc_TypeError, "walk_key: roots must be Nodes");
            goto done;
        }
        int seen = PyDict_Contains(position, root);
        if (seen < 0)
            goto done;
        if (seen)
            continue;
        if (PyList_Append(stack, root) < 0)
            goto done;
        while (PyList_GET_SIZE(stack)) {
            if (++steps % YIELD_EVERY_NODES == 0) {
                Py_BEGIN_ALLOW_THREADS
                Py_END_ALLOW_THREADS
            }
            Py_ssize_t top = PyList_GET_SIZE(stack) - 1;
            PyObject *node = PyList_GET_ITEM(stack, top);  /* borrowed: the stack holds it */
            int is_expanded = PySet_Contains(expanded, node);
            if (is_expanded < 0)
                goto done;
            if (is_expanded) {
                Py_INCREF(node);
                if (PyList_SetSlice(stack, top, top + 1, NULL) < 0) {
                    Py_DECREF(node);
                    goto done;
                }
                int emitted = PyDict_Contains(position, node);
                if (emitted == 0) {
                    PyObject *at = PyLong_FromSsize_t(PyList_GET_SIZE(order));
                    emitted = at == NULL || PyDict_SetItem(position, node, at) < 0
                              || PyList_Append(order, node) < 0
                              || emit(node, position, slots, leaves, buffer_nodes, parts) < 0 ? -1 : 0;
                    Py_XDECREF(at);
                }
                Py_DECREF(node);
                if (emitted < 0)
                    goto done;
                continue;
            }
            int has = has_value(node, table, fn);
            if (has < 0)
                goto done;
            if (has) {  /* the ledger may hold its value: the scheduler substitutes (Python) */
                Py_INCREF(Py_None);
                result = Py_None;
                goto done;
            }
            if (PySet_Add(expanded, node) < 0)
                goto done;
            PyObject *src = SLOT(node, n_src);
            for (Py_ssize_t i = PyTuple_GET_SIZE(src) - 1; i >= 0; i--) {
                PyObject *child = PyTuple_GET_ITEM(src, i);
                int known_child = PySet_Contains(expanded, child);
                if (known_child < 0 || (!known_child && PyList_Append(stack, child) < 0))
                    goto done;
            }
        }
    }
    if (PyList_Append(parts, settings) < 0)
        goto done;
    PyObject *key = PyList_AsTuple(parts);
    if (key == NULL)
        goto done;
    result = PyTuple_Pack(4, key, leaves, order, buffer_nodes);
    Py_DECREF(key);
done:
    Py_DECREF(roots);
    Py_XDECREF(position);
    Py_XDECREF(expanded);
    Py_XDECREF(slots);
    Py_XDECREF(leaves);
    Py_XDECREF(buffer_nodes);
    Py_XDECREF(parts);
    Py_XDECREF(order);
    Py_XDECREF(stack);
    return result;
}

/* ---- the storage ledger's commit (atensor/ledger/__init__.py) ------------------------------------ */

static PyTypeObject *record_type;  /* ledger.Record (a weakref subclass with slots) */
static PyObject *records, *new_record, *values, *pending, *one;
static Py_ssize_t r_version, r_head;

static PyObject *configure_ledger(PyObject *module, PyObject *args) {
    PyObject *record, *table, *make_record, *value_table, *pending_table;
    if (!PyArg_ParseTuple(args, "O!O!OO!O!:configure_ledger", &PyType_Type, &record, &PyDict_Type, &table,
                          &make_record, &PyDict_Type, &value_table, &PyDict_Type, &pending_table))
        return NULL;
    if (slot_offset((PyTypeObject *)record, "version", &r_version)
            || slot_offset((PyTypeObject *)record, "head", &r_head))
        return NULL;
    if (one == NULL && (one = PyLong_FromLong(1)) == NULL)
        return NULL;
    keep((PyObject **)&record_type, record);
    keep(&records, table);
    keep(&new_record, make_record);
    keep(&values, value_table);
    keep(&pending, pending_table);
    Py_RETURN_NONE;
}

static int ledger_configured(void) {
    if (records == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "atensor.core._ccore's ledger is not configured (atensor/ledger does it)");
        return 0;
    }
    return configured();
}

/* A node with a realized value died: its entry goes, unless a newer entry replaced it. `self` is the key
   (the node's id). No lock, as ledger._forget (the ledger's header says why). */
static PyObject *forget_value(PyObject *key, PyObject *ref) {
    PyObject *entry = PyDict_GetItemWithError(values, key);
    if (entry == NULL)
        return PyErr_Occurred() ? NULL : (Py_INCREF(Py_None), Py_None);
    if (PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 2 && PyTuple_GET_ITEM(entry, 0) == ref
            && PyDict_DelItem(values, key) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef forget_value_def = {"forget_value", (PyCFunction)forget_value, METH_O,
                                       "Drops the ledger's realized value of a dead node (bound to its id)."};

/* values[id(node)] = (weakref to node, dropping the entry when it dies; target). 0 or -1. */
static int set_value(PyObject *node, PyObject *target) {
    PyObject *key = PyLong_FromVoidPtr(node);
    if (key == NULL)
        return -1;
    PyObject *callback = PyCFunction_New(&forget_value_def, key);
    PyObject *ref = callback ? PyWeakref_NewRef(node, callback) : NULL;
    Py_XDECREF(callback);
    PyObject *entry = ref ? PyTuple_Pack(2, ref, target) : NULL;
    Py_XDECREF(ref);
    int failed = entry == NULL || PyDict_SetItem(values, key, entry) < 0;
    Py_XDECREF(entry);
    Py_DECREF(key);
    return failed ? -1 : 0;
}

static PyObject *set_value_locked(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_value_locked(node, target)");
        return NULL;
    }
    if (!ledger_configured() || set_value(args[0], args[1]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *commit_assign_locked(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    /* commit_assign_locked(node, spec): ledger.commit_assign_locked (the caller holds ledger.lock) */
    if (nargs != 2 || !PyObject_TypeCheck(args[1], spec_type)) {
        PyErr_SetString(PyExc_TypeError, "commit_assign_locked(node, spec: BufferSpec)");
        return NULL;
    }
    if (!ledger_configured())
        return NULL;
    PyObject *node = args[0], *spec = args[1], *uid = SLOT(spec, s_uid);
    PyObject *record = PyDict_GetItemWithError(records, uid);
    if (record == NULL) {
        if (PyErr_Occurred())
            return NULL;
        record = PyObject_CallOneArg(new_record, spec);
        if (record == NULL)
            return NULL;
        int failed = PyDict_SetItem(records, uid, record);
        Py_DECREF(record);  /* (the table holds it) */
        if (failed)
            return NULL;
    }
    if (!PyObject_TypeCheck(record, record_type)) {
        PyErr_SetString(PyExc_TypeError, "the ledger's record table holds something other than a Record");
        return NULL;
    }
    Py_INCREF(record);  /* held across the calls below, whichever thread drops the table's entry */
    PyObject *result = NULL, *target = NULL, *version_arg = NULL;
    PyObject *version = PyNumber_Add(SLOT(record, r_version), one);
    if (version == NULL)
        goto done;
    Py_XSETREF(SLOT(record, r_version), version);  /* (the slot takes the reference) */
    version_arg = PyTuple_Pack(2, spec, version);
    PyObject *empty = version_arg ? PyTuple_New(0) : NULL;
    if (empty == NULL)
        goto done;
    PyObject *call[4] = {buffer_op, SLOT(spec, s_dtype), empty, version_arg};
    target = make(NULL, call, 4);
    Py_DECREF(empty);
    if (target == NULL || set_value(node, target) < 0)
        goto done;
    if (SLOT(record, r_head) == node) {
        Py_INCREF(Py_None);
        Py_SETREF(SLOT(record, r_head), Py_None);
        PyObject *popped = PyObject_CallMethod(pending, "pop", "OO", uid, Py_None);
        if (popped == NULL)
            goto done;
        Py_DECREF(popped);
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    Py_XDECREF(version_arg);
    Py_XDECREF(target);
    Py_DECREF(record);
    return result;
}

/* ---- a tensor's node at its storage's newest version (engine/realize.py `_follow_storage`) ------- */

static PyObject *view_op, *follow_general;

static PyObject *configure_follow(PyObject *module, PyObject *args) {
    PyObject *view, *general;
    if (!PyArg_ParseTuple(args, "OO:configure_follow", &view, &general))
        return NULL;
    keep(&view_op, view);
    keep(&follow_general, general);
    Py_RETURN_NONE;
}

static PyObject *follow_storage(PyObject *module, PyObject *node) {
    /* `node` itself when it is not storage or views its storage's newest version (the common cases);
       else engine/realize.py's `_follow_to_latest(node, base, spec)` decides (Python) */
    if (!ledger_configured() || follow_general == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "atensor.core._ccore's follow_storage is not configured");
        return NULL;
    }
    if (!PyObject_TypeCheck(node, node_type)) {
        PyErr_SetString(PyExc_TypeError, "follow_storage: a Node is needed");
        return NULL;
    }
    PyObject *base = node;
    while (SLOT(base, n_op) == view_op)
        base = PyTuple_GET_ITEM(SLOT(base, n_src), 0);
    PyObject *op = SLOT(base, n_op), *spec;
    if (op == buffer_op) {
        PyObject *arg = SLOT(base, n_arg);
        spec = PyTuple_GET_ITEM(arg, 0);
        PyObject *record = PyDict_GetItemWithError(records, SLOT(spec, s_uid));
        if (record == NULL && PyErr_Occurred())
            return NULL;
        PyObject *version = PyTuple_GET_ITEM(arg, 1);
        int current;
        if (record == NULL) {
            static PyObject *zero;
            if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL)
                return NULL;
            if ((current = PyObject_RichCompareBool(version, zero, Py_EQ)) < 0)
                return NULL;
        } else {
            current = SLOT(record, r_head) == Py_None;
            if (current && (current = PyObject_RichCompareBool(SLOT(record, r_version), version, Py_EQ)) < 0)
                return NULL;
        }
        if (current) {
            Py_INCREF(node);
            return node;
        }
    } else if (op == assign_op) {
        PyObject *storage = PyTuple_GET_ITEM(SLOT(base, n_src), 0);
        while (SLOT(storage, n_op) == assign_op)
            storage = PyTuple_GET_ITEM(SLOT(storage, n_src), 0);
        spec = PyTuple_GET_ITEM(SLOT(storage, n_arg), 0);
        PyObject *record = PyDict_GetItemWithError(records, SLOT(spec, s_uid));
        if (record == NULL && PyErr_Occurred())
            return NULL;
        if (record != NULL && SLOT(record, r_head) == base) {  /* still the buffer's newest (pending) */
            Py_INCREF(node);
            return node;
        }
    } else {
        Py_INCREF(node);
        return node;
    }
    PyObject *call[3] = {node, base, spec};
    return PyObject_Vectorcall(follow_general, call, 3, NULL);
}

/* ---- the inline-size check of a realize ------------------------------------------------------- */

static PyObject *small_graph(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    /* small_graph(nodes, limit, has_entry) -> bool: engine/realize.py's `_small` */
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "small_graph(nodes, limit, has_entry)");
        return NULL;
    }
    if (!configured())
        return NULL;
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    PyObject *fn = args[2], *table = dict_of_get(fn);
    PyObject *stack = PySequence_List(args[0]), *seen = PySet_New(NULL), *result = NULL;
    if (stack == NULL || seen == NULL)
        goto done;
    while (PyList_GET_SIZE(stack)) {
        Py_ssize_t top = PyList_GET_SIZE(stack) - 1;
        PyObject *node = PyList_GET_ITEM(stack, top);
        Py_INCREF(node);
        if (PyList_SetSlice(stack, top, top + 1, NULL) < 0) {
            Py_DECREF(node);
            goto done;
        }
        if (!PyObject_TypeCheck(node, node_type)) {
            Py_DECREF(node);
            PyErr_SetString(PyExc_TypeError, "small_graph: nodes must be Nodes");
            goto done;
        }
        int known_node = PySet_Contains(seen, node);
        if (known_node < 0 || (!known_node && PySet_Add(seen, node) < 0)) {
            Py_DECREF(node);
            goto done;
        }
        if (known_node) {
            Py_DECREF(node);
            continue;
        }
        if (PySet_GET_SIZE(seen) > limit) {
            Py_DECREF(node);
            result = Py_False;
            Py_INCREF(result);
            goto done;
        }
        int has = SLOT(node, n_op) == buffer_op ? 1 : has_value(node, table, fn);
        if (has == 0) {  /* neither a buffer nor a realized value: what it reads is computed too */
            PyObject *src = SLOT(node, n_src);
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(src) && has == 0; i++)
                has = PyList_Append(stack, PyTuple_GET_ITEM(src, i)) < 0 ? -1 : 0;
        }
        Py_DECREF(node);
        if (has < 0)
            goto done;
    }
    result = Py_True;
    Py_INCREF(result);
done:
    Py_XDECREF(stack);
    Py_XDECREF(seen);
    return result;
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
    {"configure_ledger", configure_ledger, METH_VARARGS,
     "configure_ledger(Record, records, new_record, values, pending): the ledger's tables (atensor/ledger does it)."},
    {"commit_assign_locked", (PyCFunction)(void (*)(void))commit_assign_locked, METH_FASTCALL,
     "commit_assign_locked(node, spec): atensor.ledger.commit_assign_locked."},
    {"set_value_locked", (PyCFunction)(void (*)(void))set_value_locked, METH_FASTCALL,
     "set_value_locked(node, target): atensor.ledger.set_value_locked."},
    {"configure_follow", configure_follow, METH_VARARGS,
     "configure_follow(VIEW, follow_to_latest): engine/realize.py's general case (it does it)."},
    {"follow_storage", follow_storage, METH_O, "follow_storage(node) -> Node: engine/realize.py's _follow_storage."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "atensor.core._ccore",
    "The compiled core of atensor's hot host-path objects (see atensor/core/__init__.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__ccore(void) {
    return PyModule_Create(&module_def);
}
