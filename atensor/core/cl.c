/* atensor/core/cl.c: a short OpenCL command launched, waited for and stamped in C, through the OpenCL
library pyopencl already loaded.

Why: a one-kernel jitted awaited call on a CL device (pocl, `x + 1` on 16 floats) went through ~12
pyopencl calls per call (the enqueue, which makes an Event object; a flush; one or two status reads;
the wait; two profiling reads), each a Python-level call of ~0.5-2 us wrapping a driver call of a
fraction of that, plus the queue's in-flight record and its poll around them. For a command the queue
knows to be short (hcq/cl_queue.py `run_here`: its work took at most SHORT_NS at its last run, the
queue is idle), all of it is one fixed sequence: enqueue each launch, flush, wait for the last event
with the GIL released (its status read in a loop for a bounded time first, `cl_spin`), read its
status and the stamps, release the events. `cl_enqueue` and `cl_finish` are that sequence in two
calls (the kernel objects' arguments are set, and the launch enqueued, under the program's lock; the
wait is outside it).

Which library: the one pyopencl linked (its wheel bundles an ICD loader, found by hcq/cl_native.py in
/proc/self/maps), opened with RTLD_NOLOAD, so the handles pyopencl exposes as `.int_ptr` (cl_command_queue,
cl_kernel) go to the same loader and driver that made them. No OpenCL header is needed: the six entry
points are declared here from the OpenCL 1.2 specification, and every handle is an opaque pointer.

What stays Python: everything that decides (which set of kernel objects holds the arguments, whether a
command is short, its publication); the pyopencl path (hcq/cl_queue.py `submit`) is the specification and
the fallback where this library is not opened (ATENSOR_CORE=python, no loader found).

Invariant: every event `cl_enqueue` returns is released exactly once, by `cl_finish` (the first and the
last; the launches between them are released as soon as the next is enqueued), or by `cl_release` when
a sequence of runners' launches (engine/cl_replay.py) keeps only its first first and its last last. */
#include "ccore.h"

#include <dlfcn.h>
#include <stdint.h>
#include <time.h>
#include <sched.h>

typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef uint64_t cl_ulong;

#define CL_EVENT_COMMAND_EXECUTION_STATUS 0x11D3
#define CL_PROFILING_COMMAND_START 0x1282
#define CL_PROFILING_COMMAND_END 0x1283
#define MAX_LAUNCHES 4096

static cl_int (*enqueue_nd_range)(void *, void *, cl_uint, const size_t *, const size_t *, const size_t *,
                                  cl_uint, void *const *, void **);
static cl_int (*flush_queue)(void *);
static cl_int (*wait_for_events)(cl_uint, void *const *);
static cl_int (*event_info)(void *, cl_uint, size_t, void *, size_t *);
static cl_int (*profiling_info)(void *, cl_uint, size_t, void *, size_t *);
static cl_int (*release_event)(void *);
static void *library;

/* cl_open(path) -> bool: resolves the entry points in the already loaded library at `path`. */
PyObject *cl_open(PyObject *module, PyObject *path) {
    if (!PyUnicode_Check(path)) {
        PyErr_SetString(PyExc_TypeError, "cl_open: the path of the loaded OpenCL library, a str");
        return NULL;
    }
    const char *name = PyUnicode_AsUTF8(path);
    if (name == NULL)
        return NULL;
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (lib == NULL)
        Py_RETURN_FALSE;
    void *found[6] = {dlsym(lib, "clEnqueueNDRangeKernel"), dlsym(lib, "clFlush"), dlsym(lib, "clWaitForEvents"),
                      dlsym(lib, "clGetEventInfo"), dlsym(lib, "clGetEventProfilingInfo"),
                      dlsym(lib, "clReleaseEvent")};
    for (int i = 0; i < 6; i++)
        if (found[i] == NULL) {
            dlclose(lib);
            Py_RETURN_FALSE;
        }
    *(void **)&enqueue_nd_range = found[0];
    *(void **)&flush_queue = found[1];
    *(void **)&wait_for_events = found[2];
    *(void **)&event_info = found[3];
    *(void **)&profiling_info = found[4];
    *(void **)&release_event = found[5];
    if (library != NULL && library != lib)
        dlclose(library);
    library = lib;
    Py_RETURN_TRUE;
}

static int opened(void) {
    if (library == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "atensor.core: no OpenCL library opened (cl_open)");
        return 0;
    }
    return 1;
}

static int as_size(PyObject *value, size_t *out) {
    *out = PyLong_AsSize_t(value);
    return *out == (size_t)-1 && PyErr_Occurred() ? -1 : 0;
}

/* cl_enqueue(queue, launches) -> (first event, last event): enqueues each (kernel, global size, local
   size) of `launches` on `queue` in order (1-D; a local size of 0 lets the driver choose), then flushes.
   The handles are ints; the caller owns both events (cl_finish releases them). An enqueue the driver
   refuses raises RuntimeError naming its error code, after waiting for the launches before it. */
PyObject *cl_enqueue(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "cl_enqueue(queue, launches): launches a tuple of (kernel, global, local)");
        return NULL;
    }
    if (!opened())
        return NULL;
    void *queue = PyLong_AsVoidPtr(args[0]);
    if (queue == NULL)
        return PyErr_Occurred() ? NULL : (PyErr_SetString(PyExc_ValueError, "cl_enqueue: a NULL queue"), NULL);
    PyObject *launches = args[1];
    Py_ssize_t count = PyTuple_GET_SIZE(launches);
    if (count < 1 || count > MAX_LAUNCHES) {
        PyErr_SetString(PyExc_ValueError, "cl_enqueue: 1 to 4096 launches");
        return NULL;
    }
    void *first = NULL, *last = NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *launch = PyTuple_GET_ITEM(launches, i);
        size_t global, local;
        void *kernel;
        if (!PyTuple_Check(launch) || PyTuple_GET_SIZE(launch) != 3) {
            PyErr_SetString(PyExc_TypeError, "cl_enqueue: each launch is (kernel, global, local)");
            goto failed;
        }
        kernel = PyLong_AsVoidPtr(PyTuple_GET_ITEM(launch, 0));
        if ((kernel == NULL && PyErr_Occurred()) || as_size(PyTuple_GET_ITEM(launch, 1), &global) < 0
                || as_size(PyTuple_GET_ITEM(launch, 2), &local) < 0)
            goto failed;
        void *event = NULL;
        cl_int err = enqueue_nd_range(queue, kernel, 1, NULL, &global, local ? &local : NULL, 0, NULL, &event);
        if (err != 0) {
            PyErr_Format(PyExc_RuntimeError, "clEnqueueNDRangeKernel failed with OpenCL error %d", (int)err);
            goto failed;
        }
        if (first == NULL)
            first = event;
        else if (last != first)
            release_event(last);  /* a launch between the first and the last: nobody reads it */
        last = event;
    }
    flush_queue(queue);
    return Py_BuildValue("(NN)", PyLong_FromVoidPtr(first), PyLong_FromVoidPtr(last));
failed:
    if (last != NULL) {  /* what was enqueued runs to its end before the error is raised */
        flush_queue(queue);
        Py_BEGIN_ALLOW_THREADS
        wait_for_events(1, &last);
        Py_END_ALLOW_THREADS
        if (last != first)
            release_event(last);
        release_event(first);
    }
    return NULL;
}

static long spin_ns = 0;  /* cl_spin(ns): how long cl_finish reads the status before it sleeps */

/* Whether `event` completed (or failed) within spin_ns, its status read in a loop, the core yielded
   after each read. Why: pocl's clWaitForEvents sleeps on a condition variable, and its wake-up took
   20-40 us against a tiny kernel's few microseconds, for a caller that waits at once (bench/opencl.py
   --round-trip, Zen 5 2 cores, pocl 3.1, quiet: a one-kernel jit call 53-76 -> 36-45 us, raw pyopencl
   33-47). Why the yield: on a busy machine the driver's worker that runs the kernel may need this core;
   with one other process busy on the 2 cores, a spin without it made the call slower than no spin
   (45-74 against 48-52 us), with it 45-46. */
static int spin_until_done(void *event) {
    if (spin_ns <= 0)
        return 0;
    struct timespec now, until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += spin_ns;
    until.tv_sec += until.tv_nsec / 1000000000L;
    until.tv_nsec %= 1000000000L;
    for (;;) {
        cl_int status = 1;
        if (event_info(event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL) != 0 || status <= 0)
            return 1;
        sched_yield();  /* the driver's worker that runs the kernel may need this core */
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > until.tv_sec || (now.tv_sec == until.tv_sec && now.tv_nsec >= until.tv_nsec))
            return 0;
    }
}

/* cl_spin(ns) -> None: sets how long cl_finish spins on the status before it sleeps (0: never). */
PyObject *cl_spin(PyObject *module, PyObject *ns) {
    long value = PyLong_AsLong(ns);
    if (value == -1 && PyErr_Occurred())
        return NULL;
    spin_ns = value < 0 ? 0 : value > 1000000 ? 1000000 : value;
    Py_RETURN_NONE;
}

/* cl_finish(first, last) -> (status, start, end): waits for `last` with the GIL released (its status read
   in a loop for up to cl_spin's time, then the driver's sleeping wait), then reads its
   status (0 complete, negative an error) and the stamps (the first's start, the last's end, on the
   device's clock; 0 when the driver has none) and releases both events. */
PyObject *cl_finish(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "cl_finish(first, last): the events cl_enqueue returned");
        return NULL;
    }
    if (!opened())
        return NULL;
    void *first = PyLong_AsVoidPtr(args[0]);
    void *last = first == NULL ? NULL : PyLong_AsVoidPtr(args[1]);
    if (last == NULL)
        return PyErr_Occurred() ? NULL : (PyErr_SetString(PyExc_ValueError, "cl_finish: a NULL event"), NULL);
    cl_int status = -1;
    cl_ulong start = 0, end = 0;
    Py_BEGIN_ALLOW_THREADS
    if (!spin_until_done(last))
        wait_for_events(1, &last);  /* its error, if any, is the status read next */
    if (event_info(last, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL) != 0)
        status = -1;
    if (status == 0 && (profiling_info(first, CL_PROFILING_COMMAND_START, sizeof start, &start, NULL) != 0
                        || profiling_info(last, CL_PROFILING_COMMAND_END, sizeof end, &end, NULL) != 0))
        start = end = 0;
    if (last != first)
        release_event(last);
    release_event(first);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(iKK)", (int)status, (unsigned long long)start, (unsigned long long)end);
}

/* cl_release(event): releases an event cl_enqueue returned that nobody will wait for (a launch in the
   middle of a sequence of runners' launches, engine/cl_replay.py). */
PyObject *cl_release(PyObject *module, PyObject *event) {
    if (!opened())
        return NULL;
    void *handle = PyLong_AsVoidPtr(event);
    if (handle == NULL)
        return PyErr_Occurred() ? NULL : (PyErr_SetString(PyExc_ValueError, "cl_release: a NULL event"), NULL);
    release_event(handle);
    Py_RETURN_NONE;
}
