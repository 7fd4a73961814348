/* The node table (graph/node.py `Node.make`, `_known`, `_publish`) and BufferSpec creation: see ccore.c. */
#include "ccore.h"

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

PyObject *publish(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
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

PyObject *make(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
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

PyObject *known(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
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

PyObject *new_spec(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
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

PyObject *last_uid(PyObject *module, PyObject *unused) {
    return PyLong_FromLongLong(spec_uid);
}

