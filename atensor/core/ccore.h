/* atensor/core/ccore.h: what the compiled core's files share (ccore.c is the module and its
configuration; node.c the node table and BufferSpec; walk.c the graph walks; ledger.c the ledger's commit,
a new spec's record and the follow of a tensor's node; fresh.c a jit replay's fresh small result buffer).
See ccore.c for why each object lives in C. */
#ifndef ATENSOR_CCORE_H
#define ATENSOR_CCORE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* a __slots__ member of `obj` at the byte offset read from its member descriptor (borrowed) */
#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* the Python objects configure() is given (graph/node.py) and the slot offsets read from them */
extern PyTypeObject *node_type, *newnode_type, *spec_type;
extern PyObject *interned, *lock_acquire, *lock_release, *same_shape;
extern PyObject *multi_op, *buffer_op, *assign_op, *bool_dtype, *str_shape, *str_mask, *make_general;
extern long long spec_uid;
extern Py_ssize_t n_op, n_dtype, n_src, n_arg, n_shape, n_device;
extern Py_ssize_t s_uid, s_device, s_size, s_dtype;

/* ccore.c */
int slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *offset);
void keep(PyObject **where, PyObject *value);
/* `lock.acquire` and `lock.release`, bound, into *acquire and *release (their old values released); -1 on error */
int lock_methods(PyObject *lock, PyObject **acquire, PyObject **release);
int configured(void);
PyObject *configure(PyObject *module, PyObject *args);

/* node.c */
PyObject *make(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *known(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *publish(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *new_spec(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *last_uid(PyObject *module, PyObject *unused);

/* walk.c */
PyObject *dict_of_get(PyObject *fn);
int has_value(PyObject *node, PyObject *table, PyObject *fn);
PyObject *walk_key(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *small_graph(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *configure_storages(PyObject *module, PyObject *args);
PyObject *storages(PyObject *module, PyObject *captured);
PyObject *capture(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* ledger.c */
PyObject *configure_ledger(PyObject *module, PyObject *args);
PyObject *commit_assign_locked(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *set_value_locked(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *configure_follow(PyObject *module, PyObject *args);
PyObject *follow_storage(PyObject *module, PyObject *node);
PyObject *configure_attach(PyObject *module, PyObject *args);
int attach_record(PyObject *spec, PyObject *runtime, PyObject *version);
PyObject *attach_new(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *drop_record_c(PyObject *module, PyObject *record);
/* installs how drop_record tells a dead spec's runtime (NULL: its `spec_died()`) */
void ledger_tell_runtime_died(int (*teller)(PyObject *runtime));

/* fresh.c */
PyObject *configure_fresh(PyObject *module, PyObject *args);
PyObject *fresh_small(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
int buffer_spec_died(PyObject *runtime);

/* cl.c */
PyObject *cl_open(PyObject *module, PyObject *path);
PyObject *cl_enqueue(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *cl_finish(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *cl_release(PyObject *module, PyObject *event);
PyObject *cl_spin(PyObject *module, PyObject *ns);

#endif
