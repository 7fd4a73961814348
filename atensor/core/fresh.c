/* A jit replay's fresh small result buffer in one step (hcq/device.py `fresh_small`): the spec's Buffer
   with a dead buffer's memory from the device's SmallPool (hcq/smallpool.py), counted in the device's
   bytes, and the spec's ledger record at its version (atensor/ledger `attach_new`, ledger.c here).

   Why C: a one-kernel awaited jit call makes one such buffer per call, and in Python its Buffer's
   eleven slot stores, the pool's take, the device's count and the record cost ~1.3 us of ~11 (Zen 5,
   bench/jit_replay.py); here they are slot stores, two dict probes and two lock round trips.

   And the way back: when the spec dies, the ledger's record callback (ledger.c `drop_record`, through the
   teller configure_fresh installs) gives the
   memory back to the pool here (`buffer_spec_died`: hcq/buffer.py `Buffer.spec_died` and hcq/smallpool.py
   `SmallPool.give`), ~0.75 us of three Python functions and a lock per call in Python.

   What stays Python (`python_fresh_small`, the specification, called from here): a pool with no dead
   memory of the size (fresh numpy memory) and a profile being taken (its memory events); a runtime that
   is not a plain Buffer, or memory that goes elsewhere than a SmallPool, is told through its own Python.
   Invariants
   kept as the Python keeps them: the pool's lists and the device's bytes change together under the
   pool's lock (the device's `_mem_lock`); the record is published under the ledger's lock; the spec is
   new (no record can exist: `attach_new`'s contract). */
#include "ccore.h"

static PyTypeObject *buffer_type, *pool_type;
static PyObject *make_lock, *collector, *python_fresh_small, *pool_give;
static PyObject *str_small, *str_active, *str_in_use, *str_peak, *str_give, *str_acquire, *str_release,
    *str_spec_died;
static PyObject *zero, *empty_tuple;
/* Buffer's slots, SmallPool's slots */
static Py_ssize_t b_uid, b_size, b_device, b_memory, b_writes, b_reads, b_clocks, b_inflight, b_failure,
    b_lock, b_address, b_release;
static Py_ssize_t p_free, p_kept, p_lock, p_owner, p_keep;

PyObject *configure_fresh(PyObject *module, PyObject *args) {
    PyObject *buffer, *pool, *lock, *profiler, *python;
    if (!PyArg_ParseTuple(args, "O!O!OOO:configure_fresh", &PyType_Type, &buffer, &PyType_Type, &pool, &lock,
                          &profiler, &python))
        return NULL;
    PyObject *give_fn = PyObject_GetAttrString(pool, "give");  /* SmallPool.give, the plain function */
    if (give_fn == NULL)
        return NULL;
    Py_XSETREF(pool_give, give_fn);
    PyTypeObject *bt = (PyTypeObject *)buffer, *pt = (PyTypeObject *)pool;
    if (slot_offset(bt, "uid", &b_uid) || slot_offset(bt, "size", &b_size)
            || slot_offset(bt, "device", &b_device)
            || slot_offset(bt, "memory", &b_memory) || slot_offset(bt, "writes", &b_writes)
            || slot_offset(bt, "reads", &b_reads) || slot_offset(bt, "clocks", &b_clocks)
            || slot_offset(bt, "inflight", &b_inflight) || slot_offset(bt, "failure", &b_failure)
            || slot_offset(bt, "_lock", &b_lock) || slot_offset(bt, "_address", &b_address)
            || slot_offset(bt, "release", &b_release) || slot_offset(pt, "_free", &p_free)
            || slot_offset(pt, "kept_bytes", &p_kept) || slot_offset(pt, "_lock", &p_lock)
            || slot_offset(pt, "owner", &p_owner) || slot_offset(pt, "keep_bytes", &p_keep))
        return NULL;
    if (str_small == NULL && ((str_small = PyUnicode_InternFromString("_small")) == NULL
            || (str_active = PyUnicode_InternFromString("_active")) == NULL
            || (str_in_use = PyUnicode_InternFromString("bytes_in_use")) == NULL
            || (str_peak = PyUnicode_InternFromString("peak_bytes")) == NULL
            || (str_give = PyUnicode_InternFromString("give")) == NULL
            || (str_acquire = PyUnicode_InternFromString("acquire")) == NULL
            || (str_release = PyUnicode_InternFromString("release")) == NULL
            || (str_spec_died = PyUnicode_InternFromString("spec_died")) == NULL
            || (zero = PyLong_FromLong(0)) == NULL || (empty_tuple = PyTuple_New(0)) == NULL))
        return NULL;
    keep((PyObject **)&buffer_type, buffer);
    ledger_tell_runtime_died(buffer_spec_died);
    keep((PyObject **)&pool_type, pool);
    keep(&make_lock, lock);
    keep(&collector, profiler);
    keep(&python_fresh_small, python);
    Py_RETURN_NONE;
}

static int call_method(PyObject *obj, PyObject *name) {
    PyObject *done = PyObject_CallMethodNoArgs(obj, name);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* Under the pool's lock: pops a kept entry of `key` (a new reference) and counts `nbytes` in the owner's
   bytes and peak; NULL with no error when none is kept (nothing changed then). */
static PyObject *take_locked(PyObject *pool, PyObject *key, PyObject *nbytes) {
    PyObject *free = PyDict_GetItemWithError(SLOT(pool, p_free), key);
    if (free == NULL || !PyList_CheckExact(free) || PyList_GET_SIZE(free) == 0)
        return NULL;
    PyObject *owner = SLOT(pool, p_owner);
    PyObject *kept = PyNumber_Subtract(SLOT(pool, p_kept), nbytes);
    if (kept == NULL)
        return NULL;
    PyObject *in_use = NULL, *peak = NULL, *more = NULL;
    int failed = owner == Py_None ? 0 : -1;
    if (owner != Py_None && (in_use = PyObject_GetAttr(owner, str_in_use)) != NULL
            && (more = PyNumber_Add(in_use, nbytes)) != NULL
            && (peak = PyObject_GetAttr(owner, str_peak)) != NULL) {
        int above = PyObject_RichCompareBool(more, peak, Py_GT);
        failed = above < 0 || PyObject_SetAttr(owner, str_in_use, more) < 0
                 || (above && PyObject_SetAttr(owner, str_peak, more) < 0) ? -1 : 0;
    }
    Py_XDECREF(in_use);
    Py_XDECREF(peak);
    Py_XDECREF(more);
    if (failed) {  /* (an attribute of the owner missing: nothing was popped) */
        Py_DECREF(kept);
        return NULL;
    }
    Py_SETREF(SLOT(pool, p_kept), kept);
    Py_ssize_t last = PyList_GET_SIZE(free) - 1;
    PyObject *entry = PyList_GET_ITEM(free, last);
    Py_INCREF(entry);
    if (PyList_SetSlice(free, last, last + 1, NULL) < 0) {
        Py_DECREF(entry);
        return NULL;
    }
    return entry;
}

static void set_slot(PyObject *obj, Py_ssize_t offset, PyObject *value) {  /* takes a new reference */
    Py_XSETREF(SLOT(obj, offset), value);
}

PyObject *fresh_small(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    /* fresh_small(device, spec, version, key) -> Buffer: hcq/device.py's fresh_small */
    if (nargs != 4 || !PyObject_TypeCheck(args[1], spec_type) || !PyTuple_CheckExact(args[3])
            || PyTuple_GET_SIZE(args[3]) != 2) {
        PyErr_SetString(PyExc_TypeError,
                        "fresh_small(device, spec: BufferSpec, version, key: (nbytes, dtype))");
        return NULL;
    }
    if (buffer_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "atensor.core._ccore's fresh_small is not configured (hcq/device.py does it)");
        return NULL;
    }
    PyObject *device = args[0], *spec = args[1], *version = args[2], *key = args[3];
    PyObject *active = PyObject_GetAttr(collector, str_active);
    if (active == NULL)
        return NULL;
    int profiling = PyObject_IsTrue(active);
    Py_DECREF(active);
    if (profiling < 0)
        return NULL;
    PyObject *pool = profiling ? NULL : PyObject_GetAttr(device, str_small);
    if (pool == NULL && PyErr_Occurred())
        return NULL;
    PyObject *entry = NULL;
    if (pool != NULL && PyObject_TypeCheck(pool, pool_type)) {
        PyObject *lock = SLOT(pool, p_lock);
        if (call_method(lock, str_acquire) < 0) {
            Py_DECREF(pool);
            return NULL;
        }
        entry = take_locked(pool, key, PyTuple_GET_ITEM(key, 0));
        PyObject *type, *value, *trace;
        PyErr_Fetch(&type, &value, &trace);  /* the lock goes back whatever happened */
        int released = call_method(lock, str_release);
        if (type != NULL) {
            PyErr_Restore(type, value, trace);
            if (released == 0) {
                Py_XDECREF(entry);
                Py_DECREF(pool);
                return NULL;
            }
        }
        if (released < 0 || (entry != NULL && (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3))) {
            Py_XDECREF(entry);  /* (a malformed entry: a bug of the pool's) */
            Py_DECREF(pool);
            if (released == 0)
                PyErr_SetString(PyExc_TypeError,
                                "fresh_small: a SmallPool entry is not (key, view, address)");
            return NULL;
        }
    }
    if (entry == NULL) {  /* no dead memory of the size, or a profile: the Python path */
        Py_XDECREF(pool);
        return PyObject_Vectorcall(python_fresh_small, args, nargs, NULL);
    }
    PyObject *give = PyObject_GetAttr(pool, str_give);
    PyObject *release = give ? PyTuple_Pack(2, give, entry) : NULL;
    Py_XDECREF(give);
    PyObject *buf = release ? buffer_type->tp_alloc(buffer_type, 0) : NULL;
    PyObject *writes = buf ? PyDict_New() : NULL, *reads = writes ? PyDict_New() : NULL;
    PyObject *lock = reads ? PyObject_CallNoArgs(make_lock) : NULL;
    if (lock == NULL) {  /* the memory is not handed out: back to the pool (uncounted again) */
        Py_XDECREF(reads);
        Py_XDECREF(writes);
        Py_XDECREF(buf);
        Py_XDECREF(release);
        PyObject *type, *value, *trace;
        PyErr_Fetch(&type, &value, &trace);
        PyObject *back = PyObject_CallMethodOneArg(pool, str_give, entry);
        Py_XDECREF(back);
        PyErr_Restore(type, value, trace);
        Py_DECREF(entry);
        Py_DECREF(pool);
        return NULL;
    }
    Py_DECREF(pool);
    Py_INCREF(SLOT(spec, s_uid));
    set_slot(buf, b_uid, SLOT(spec, s_uid));
    Py_INCREF(SLOT(spec, s_size));
    set_slot(buf, b_size, SLOT(spec, s_size));
    Py_INCREF(SLOT(spec, s_device));
    set_slot(buf, b_device, SLOT(spec, s_device));
    Py_INCREF(PyTuple_GET_ITEM(entry, 1));
    set_slot(buf, b_memory, PyTuple_GET_ITEM(entry, 1));
    set_slot(buf, b_writes, writes);
    set_slot(buf, b_reads, reads);
    Py_INCREF(empty_tuple);
    set_slot(buf, b_clocks, empty_tuple);
    Py_INCREF(zero);
    set_slot(buf, b_inflight, zero);
    Py_INCREF(Py_None);
    set_slot(buf, b_failure, Py_None);
    set_slot(buf, b_lock, lock);
    Py_INCREF(PyTuple_GET_ITEM(entry, 2));
    set_slot(buf, b_address, PyTuple_GET_ITEM(entry, 2));
    set_slot(buf, b_release, release);
    Py_DECREF(entry);
    /* from here the Buffer owns the memory: if the record fails, dropping the Buffer does not give it back
       (nor does the Python path's), so the pool's count keeps it, as for any Buffer that never dies */
    if (attach_record(spec, buf, version) < 0) {
        Py_DECREF(buf);
        return NULL;
    }
    return buf;
}


/* ---- the memory's return when its spec dies (hcq/buffer.py `Buffer.spec_died`, hcq/smallpool.py `give`) */

static int profiling(void) {
    PyObject *active = PyObject_GetAttr(collector, str_active);
    if (active == NULL)
        return -1;
    int on = PyObject_IsTrue(active);
    Py_DECREF(active);
    return on;
}

/* Under the pool's lock: SmallPool.give's work (uncount the bytes, keep the entry when there is room) */
static int give_locked(PyObject *pool, PyObject *entry, PyObject *key, PyObject *nbytes) {
    PyObject *owner = SLOT(pool, p_owner);
    if (owner != Py_None) {
        PyObject *in_use = PyObject_GetAttr(owner, str_in_use);
        PyObject *less = in_use ? PyNumber_Subtract(in_use, nbytes) : NULL;
        Py_XDECREF(in_use);
        int failed = less == NULL || PyObject_SetAttr(owner, str_in_use, less) < 0;
        Py_XDECREF(less);
        if (failed)
            return -1;
    }
    PyObject *kept = PyNumber_Add(SLOT(pool, p_kept), nbytes);
    if (kept == NULL)
        return -1;
    int room = PyObject_RichCompareBool(kept, SLOT(pool, p_keep), Py_LE);
    if (room <= 0) {  /* full: the memory is freed with the entry */
        Py_DECREF(kept);
        return room;
    }
    PyObject *table = SLOT(pool, p_free);
    PyObject *free = PyDict_GetItemWithError(table, key);  /* borrowed */
    if (free == NULL) {
        if (PyErr_Occurred() || (free = PyList_New(0)) == NULL) {
            Py_DECREF(kept);
            return -1;
        }
        int failed = PyDict_SetItem(table, key, free);
        Py_DECREF(free);  /* (the table holds it) */
        if (failed) {
            Py_DECREF(kept);
            return -1;
        }
    }
    if (PyList_Append(free, entry) < 0) {
        Py_DECREF(kept);
        return -1;
    }
    Py_SETREF(SLOT(pool, p_kept), kept);
    return 0;
}

static int give_c(PyObject *pool, PyObject *entry) {
    int on = profiling();
    if (on < 0)
        return -1;
    if (on || !PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3
            || !PyTuple_CheckExact(PyTuple_GET_ITEM(entry, 0))
            || PyTuple_GET_SIZE(PyTuple_GET_ITEM(entry, 0)) != 2) {
        /* (its memory event, or its error) */
        PyObject *done = PyObject_CallMethodOneArg(pool, str_give, entry);
        Py_XDECREF(done);
        return done == NULL ? -1 : 0;
    }
    PyObject *key = PyTuple_GET_ITEM(entry, 0), *lock = SLOT(pool, p_lock);
    Py_INCREF(lock);
    if (call_method(lock, str_acquire) < 0) {
        Py_DECREF(lock);
        return -1;
    }
    int failed = give_locked(pool, entry, key, PyTuple_GET_ITEM(key, 0));
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    int released = call_method(lock, str_release);
    Py_DECREF(lock);
    if (type != NULL) {
        PyErr_Restore(type, value, trace);
        return -1;
    }
    return failed || released < 0 ? -1 : 0;
}

int buffer_spec_died(PyObject *runtime) {
    /* `runtime.spec_died()` (hcq/buffer.py), in C for a Buffer whose memory goes back to a SmallPool */
    if (buffer_type == NULL || Py_TYPE(runtime) != buffer_type) {
        PyObject *done = PyObject_CallMethodNoArgs(runtime, str_spec_died);
        Py_XDECREF(done);
        return done == NULL ? -1 : 0;
    }
#if PY_VERSION_HEX >= 0x030D0000
    int finalizing = Py_IsFinalizing();
#else
    int finalizing = _Py_IsFinalizing();
#endif
    PyObject *release = SLOT(runtime, b_release);
    if (release == NULL || release == Py_None || finalizing)  /* at exit the process gives everything back */
        return 0;
    Py_INCREF(release);
    Py_INCREF(Py_None);
    Py_XSETREF(SLOT(runtime, b_release), Py_None);
    int result;
    if (!PyTuple_CheckExact(release) || PyTuple_GET_SIZE(release) != 2) {
        PyErr_SetString(PyExc_TypeError, "Buffer.release is not (fn, arg)");
        result = -1;
    } else {
        PyObject *fn = PyTuple_GET_ITEM(release, 0), *arg = PyTuple_GET_ITEM(release, 1);
        if (PyMethod_Check(fn) && PyMethod_GET_FUNCTION(fn) == pool_give
                && Py_TYPE(PyMethod_GET_SELF(fn)) == pool_type) {
            result = give_c(PyMethod_GET_SELF(fn), arg);
        } else {
            PyObject *done = PyObject_CallOneArg(fn, arg);
            Py_XDECREF(done);
            result = done == NULL ? -1 : 0;
        }
    }
    Py_DECREF(release);
    return result;
}
