/* The graph walks: the schedule key walk (sched/cache.py `walk_key`) and the inline-size check
   (engine/realize.py `_small`): see ccore.c. */
#include "ccore.h"

#include <time.h>

/* ---- the schedule key walk ------------------------------------------------------------------- */

/* The dict behind `has_entry` when it is a dict's bound `get` (the ledger's `value_entry`), else NULL. */
PyObject *dict_of_get(PyObject *fn) {
    if (!PyCFunction_Check(fn))
        return NULL;
    PyObject *self = PyCFunction_GET_SELF(fn);
    PyMethodDef *def = ((PyCFunctionObject *)fn)->m_ml;
    if (self != NULL && PyDict_CheckExact(self) && strcmp(def->ml_name, "get") == 0)
        return self;
    return NULL;
}

/* 1 when the ledger may hold a value for `node` (has_entry(id(node)) is not None), 0 if not, -1 error */
int has_value(PyObject *node, PyObject *table, PyObject *fn) {
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

/* A walk over a big graph (a realize of 3,000 outputs: 18,000 nodes, 7-12 ms of CPU here) lets other
   threads take the GIL, as the interpreter lets them in the Python walk: held for the whole walk, the
   GIL kept the event loop's thread waiting (on a loaded machine, while this thread was descheduled
   holding it; tests/engine/test_async.py's gap test failed). The walk's state is its own and nodes are
   immutable, so another thread may run between any two steps, as it may in the Python walk.

   How often: at most once every YIELD_EVERY_NS, checked every YIELD_CHECK_NODES nodes. Not more often
   than the switch interval (0.5 ms while the dispatcher plans, hcq/gilshare.py): a thread waiting for
   the GIL asks its holder to hand it over only once its timed wait of one interval has run out, and
   every release wakes it and starts that wait again, so a release every 1,024 nodes (~0.4 ms) meant
   it never asked, and the holder, releasing and taking the GIL straight back, was never made to hand
   it over: a 1 ms ticker on the event loop's thread waited out whole walks (gaps of 8-53 ms for walks
   of 7-61 ms). Released every 1 ms, the waiter's request stands at the next release, which then hands
   the GIL over. */
#define YIELD_CHECK_NODES 256
#define YIELD_EVERY_NS 1000000LL

static long long now_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

static void yield_if_due(long long *last) {
    long long now = now_ns();
    if (now - *last < YIELD_EVERY_NS)
        return;
    Py_BEGIN_ALLOW_THREADS
    Py_END_ALLOW_THREADS
    *last = now_ns();
}

PyObject *walk_key(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
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
    long long last_yield = now_ns();
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
            if (++steps % YIELD_CHECK_NODES == 0)
                yield_if_due(&last_yield);
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

/* ---- the inline-size check of a realize ------------------------------------------------------- */

PyObject *small_graph(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
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


/* ---- the storages of a realize's tensors ------------------------------------------------------ */

/* engine/realize.py's Storage, its slots, VIEW and `_other_item` (configure_storages; realize.py does it) */
static PyTypeObject *storage_type;
static PyObject *storage_view_op, *other_item, *str_swap, *str_lazy;
static Py_ssize_t st_lazy, st_node, st_reaped;

PyObject *configure_storages(PyObject *module, PyObject *args) {
    PyObject *type, *view, *other;
    if (!PyArg_ParseTuple(args, "O!OO:configure_storages", &PyType_Type, &type, &view, &other))
        return NULL;
    if (slot_offset((PyTypeObject *)type, "lazy", &st_lazy) < 0 || slot_offset((PyTypeObject *)type, "_node", &st_node) < 0
            || slot_offset((PyTypeObject *)type, "reaped", &st_reaped) < 0)
        return NULL;
    if ((str_swap == NULL && (str_swap = PyUnicode_InternFromString("_swap")) == NULL)
            || (str_lazy == NULL && (str_lazy = PyUnicode_InternFromString("lazy")) == NULL))
        return NULL;
    keep((PyObject **)&storage_type, type);
    keep(&storage_view_op, view);
    keep(&other_item, other);
    Py_RETURN_NONE;
}

/* A new Storage of `lazy`, as `Storage(lazy)` makes it (its __init__ only sets these three slots), without
   the Python call: 0.17 us of the 0.38 us each tensor of a 3,000-output realize cost the event loop. */
static PyObject *new_storage(PyObject *lazy) {
    PyObject *storage = storage_type->tp_alloc(storage_type, 0);
    if (storage == NULL)
        return NULL;
    Py_INCREF(lazy);
    SLOT(storage, st_lazy) = lazy;
    Py_INCREF(Py_None);
    SLOT(storage, st_node) = Py_None;
    Py_INCREF(Py_False);
    SLOT(storage, st_reaped) = Py_False;
    return storage;
}

/* 1 when `swap` (a tensor's `_swap`, not None) is the Storage of `node` (the same tensor given twice), 0 if
   not, -1 on error */
static int storage_of_node(PyObject *swap, PyObject *node) {
    if (Py_IS_TYPE(swap, storage_type))
        return SLOT(swap, st_lazy) == node;
    PyObject *lazy = PyObject_GetAttr(swap, str_lazy);
    if (lazy == NULL)
        return -1;
    int same = lazy == node;
    Py_DECREF(lazy);
    return same;
}

static int append_pair(PyObject *list, PyObject *a, PyObject *b) {
    PyObject *pair = PyTuple_Pack(2, a, b);
    if (pair == NULL)
        return -1;
    int failed = PyList_Append(list, pair);
    Py_DECREF(pair);
    return failed;
}

PyObject *storages(PyObject *module, PyObject *captured) {
    /* storages(captured) -> (items, given): engine/realize.py's `_storages`, the per-tensor loop of a realize on
       the caller's thread (the event loop's); what is not a computed value or a view of a buffer goes to
       `_other_item` (Python) */
    if (!configured() || storage_type == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "atensor.core._ccore's storages is not configured");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(captured, "storages: captured must be a sequence of (tensor, node) pairs");
    if (seq == NULL)
        return NULL;
    PyObject *items = PyList_New(0), *given = PyList_New(0), *result = NULL;
    if (items == NULL || given == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2
                || !PyObject_TypeCheck(PyTuple_GET_ITEM(pair, 1), node_type)) {
            PyErr_SetString(PyExc_TypeError, "storages: captured must be (tensor, Node) pairs");
            goto done;
        }
        PyObject *t = PyTuple_GET_ITEM(pair, 0), *node = PyTuple_GET_ITEM(pair, 1);
        PyObject *swap = PyObject_GetAttr(t, str_swap);
        if (swap == NULL)
            goto done;
        int same = swap == Py_None ? 0 : storage_of_node(swap, node);
        if (same != 0) {  /* the same tensor given twice (or an error) */
            int failed = same < 0 || append_pair(items, node, swap);
            Py_DECREF(swap);
            if (failed)
                goto done;
            continue;
        }
        Py_DECREF(swap);
        PyObject *base = node;
        while (SLOT(base, n_op) == storage_view_op)
            base = PyTuple_GET_ITEM(SLOT(base, n_src), 0);
        PyObject *op = SLOT(base, n_op);
        if (op == buffer_op) {
            if (append_pair(items, node, Py_None) < 0)
                goto done;
        } else if (op == assign_op || SLOT(node, n_op) == multi_op) {
            PyObject *stack[4] = {t, node, items, given};
            PyObject *none = PyObject_Vectorcall(other_item, stack, 4, NULL);
            if (none == NULL)
                goto done;
            Py_DECREF(none);
        } else {
            PyObject *storage = new_storage(node);
            if (storage == NULL)
                goto done;
            int failed = PyObject_SetAttr(t, str_swap, storage) < 0 || append_pair(items, node, storage) < 0;
            Py_DECREF(storage);
            if (failed)
                goto done;
        }
    }
    result = PyTuple_Pack(2, items, given);
done:
    Py_DECREF(seq);
    Py_XDECREF(items);
    Py_XDECREF(given);
    return result;
}

/* ---- each tensor's node when a realize is issued ------------------------------------------------ */

static PyObject *str_node_attr, *str_private_node, *str_ctx;

/* 1 when `node`, a tensor's `_node` with no `_swap`, is what `Tensor.node` returns as it is: a computed value
   (or one view of one), no storage to follow (tensor/tensor.py's fast case) */
static int computed(PyObject *node) {
    if (!PyObject_TypeCheck(node, node_type))
        return 0;
    PyObject *base = SLOT(node, n_op) == storage_view_op ? PyTuple_GET_ITEM(SLOT(node, n_src), 0) : node;
    PyObject *op = SLOT(base, n_op);
    return op != buffer_op && op != assign_op && op != storage_view_op && op != multi_op;
}

PyObject *capture(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    /* capture(tensors, keep_graphs) -> [(tensor, node)]: tensor/tensor.py's `_capture` (configure_storages
       first: the VIEW op is its) */
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "capture(tensors, keep_graphs)");
        return NULL;
    }
    if (!configured() || storage_view_op == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "atensor.core._ccore's capture is not configured");
        return NULL;
    }
    if ((str_node_attr == NULL && (str_node_attr = PyUnicode_InternFromString("node")) == NULL)
            || (str_private_node == NULL && (str_private_node = PyUnicode_InternFromString("_node")) == NULL)
            || (str_ctx == NULL && (str_ctx = PyUnicode_InternFromString("_ctx")) == NULL))
        return NULL;
    int keep_graphs = PyObject_IsTrue(args[1]);
    if (keep_graphs < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(args[0], "capture: tensors must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject *captured = PyList_New(count);
    if (captured == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *swap = PyObject_GetAttr(t, str_swap);
        if (swap == NULL)
            goto fail;
        PyObject *node = swap == Py_None ? PyObject_GetAttr(t, str_private_node) : NULL;
        Py_DECREF(swap);
        if (node == NULL && PyErr_Occurred())
            goto fail;
        if (node == NULL || !computed(node)) {  /* the property's general case: a storage to follow */
            Py_XDECREF(node);
            if ((node = PyObject_GetAttr(t, str_node_attr)) == NULL)
                goto fail;
            if (!PyObject_TypeCheck(node, node_type)) {
                Py_DECREF(node);
                PyErr_SetString(PyExc_TypeError, "capture: a tensor's node must be a Node");
                goto fail;
            }
        }
        if (keep_graphs) {
            PyObject *base = node;
            while (SLOT(base, n_op) == storage_view_op)
                base = PyTuple_GET_ITEM(SLOT(base, n_src), 0);
            if ((SLOT(node, n_op) == multi_op || SLOT(base, n_op) != buffer_op) && PyObject_SetAttr(t, str_ctx, node) < 0) {
                Py_DECREF(node);
                goto fail;
            }
        }
        PyObject *pair = PyTuple_Pack(2, t, node);
        Py_DECREF(node);
        if (pair == NULL)
            goto fail;
        PyList_SET_ITEM(captured, i, pair);
    }
    Py_DECREF(seq);
    return captured;
fail:
    Py_DECREF(seq);
    Py_XDECREF(captured);
    return NULL;
}
