/* The storage ledger's commit (atensor/ledger `commit_assign_locked`, `set_value_locked`) and the follow
   of a tensor's node to its storage's newest version (engine/realize.py `_follow_storage`): see ccore.c. */
#include "ccore.h"

/* ---- the storage ledger's commit (atensor/ledger/__init__.py) ------------------------------------ */

static PyTypeObject *record_type;  /* ledger.Record (a weakref subclass with slots) */
static PyObject *records, *new_record, *values, *pending, *one;
static Py_ssize_t r_version, r_head;

PyObject *configure_ledger(PyObject *module, PyObject *args) {
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

PyObject *set_value_locked(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_value_locked(node, target)");
        return NULL;
    }
    if (!ledger_configured() || set_value(args[0], args[1]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *commit_assign_locked(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
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

/* ---- a new spec's record (atensor/ledger `attach_new`) ----------------------------------------- */

static PyObject *drop_record, *ledger_acquire, *ledger_release;

/* How a dead spec's runtime is told: `runtime.spec_died()`, unless a teller is installed (fresh.c installs
   `buffer_spec_died`, which does the same in C for an hcq Buffer): the ledger names no runtime's code. */
static int call_spec_died(PyObject *runtime) {
    PyObject *done = PyObject_CallMethod(runtime, "spec_died", NULL);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

static int (*runtime_died)(PyObject *runtime) = call_spec_died;

void ledger_tell_runtime_died(int (*teller)(PyObject *runtime)) {
    runtime_died = teller != NULL ? teller : call_spec_died;
}
static Py_ssize_t r_runtime, r_uid;

PyObject *configure_attach(PyObject *module, PyObject *args) {
    PyObject *lock, *drop;  /* `drop`: the callback of the records made here (the C drop_record) */
    if (!PyArg_ParseTuple(args, "OO:configure_attach", &lock, &drop))
        return NULL;
    if (!ledger_configured() || slot_offset(record_type, "runtime", &r_runtime)
            || slot_offset(record_type, "uid", &r_uid))
        return NULL;
    if (lock_methods(lock, &ledger_acquire, &ledger_release) < 0)
        return NULL;
    keep(&drop_record, drop);
    Py_RETURN_NONE;
}

PyObject *drop_record_c(PyObject *module, PyObject *record) {
    /* ledger._drop_record(record): a spec died; its record (and pending mark) goes, its runtime is told
       (through `runtime_died`: fresh.c's `buffer_spec_died` in C for an hcq Buffer, else its `spec_died()`) */
    if (!ledger_configured())
        return NULL;
    if (!PyObject_TypeCheck(record, record_type)) {
        PyErr_SetString(PyExc_TypeError, "drop_record: a ledger Record is needed");
        return NULL;
    }
    PyObject *uid = SLOT(record, r_uid);
    if (uid == NULL) {  /* (a record not filled in yet: nothing of it was published) */
        Py_RETURN_NONE;
    }
    /* held to the end: the weak reference's caller holds no reference to it while its callback runs, and
       popping the table's entry below drops the last one (a Python callback's frame holds its argument) */
    Py_INCREF(record);
    Py_INCREF(uid);
    int failed = 0;
    PyObject *tables[2] = {records, pending};
    for (int k = 0; k < 2 && !failed; k++) {
        PyObject *found = PyDict_GetItemWithError(tables[k], uid);
        if (found != NULL)
            failed = PyDict_DelItem(tables[k], uid) < 0;
        else
            failed = PyErr_Occurred() != NULL;
    }
    Py_DECREF(uid);
    PyObject *runtime = failed ? NULL : SLOT(record, r_runtime);
    Py_XINCREF(runtime);
    Py_DECREF(record);
    if (failed)
        return NULL;
    if (runtime == NULL || runtime == Py_None) {
        Py_XDECREF(runtime);
        Py_RETURN_NONE;
    }
    int done = runtime_died(runtime);
    Py_DECREF(runtime);
    if (done < 0)
        return NULL;
    Py_RETURN_NONE;
}

int attach_record(PyObject *spec, PyObject *runtime, PyObject *version) {
    /* ledger.attach_new(spec, runtime, version): the record of a new spec, published under the lock */
    if (drop_record == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "atensor.core._ccore's attach_new is not configured (atensor/ledger does it)");
        return -1;
    }
    PyObject *record = PyObject_CallFunctionObjArgs((PyObject *)record_type, spec, drop_record, NULL);
    if (record == NULL)
        return -1;
    Py_INCREF(version);
    Py_XSETREF(SLOT(record, r_version), version);
    Py_INCREF(Py_None);
    Py_XSETREF(SLOT(record, r_head), Py_None);
    Py_INCREF(runtime);
    Py_XSETREF(SLOT(record, r_runtime), runtime);
    PyObject *uid = SLOT(spec, s_uid);
    Py_INCREF(uid);
    Py_XSETREF(SLOT(record, r_uid), uid);
    PyObject *held = PyObject_CallNoArgs(ledger_acquire);
    if (held == NULL) {
        Py_DECREF(record);
        return -1;
    }
    Py_DECREF(held);
    int failed = PyDict_SetItem(records, uid, record);
    Py_DECREF(record);  /* (the table holds it) */
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    PyObject *released = PyObject_CallNoArgs(ledger_release);
    if (released == NULL) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(trace);
        return -1;
    }
    Py_DECREF(released);
    PyErr_Restore(type, value, trace);
    return failed ? -1 : 0;
}

PyObject *attach_new(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyObject_TypeCheck(args[0], spec_type)) {
        PyErr_SetString(PyExc_TypeError, "attach_new(spec: BufferSpec, runtime, version)");
        return NULL;
    }
    if (!ledger_configured() || attach_record(args[0], args[1], args[2]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* ---- a tensor's node at its storage's newest version (engine/realize.py `_follow_storage`) ------- */

static PyObject *view_op, *follow_general;

PyObject *configure_follow(PyObject *module, PyObject *args) {
    PyObject *view, *general;
    if (!PyArg_ParseTuple(args, "OO:configure_follow", &view, &general))
        return NULL;
    keep(&view_op, view);
    keep(&follow_general, general);
    Py_RETURN_NONE;
}

PyObject *follow_storage(PyObject *module, PyObject *node) {
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

