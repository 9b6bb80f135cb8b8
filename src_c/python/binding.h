/*
 * binding.h - what the files of the Python binding (hpcdl._core) share: the
 * Context object, the error and argument helpers (core_module.c), and the
 * collectives' methods (collectives.c) that core_module.c lists on the type.
 */
#ifndef HPCDL_BINDING_H
#define HPCDL_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "hpcdl.h"

typedef struct {
    PyObject_HEAD
    hpcdl_ctx *ctx;
} ContextObject;

// ----------------------------------------------------------------------------
// helpers (core_module.c)

// Raises the exception for an hpcdl error code (MismatchError, ValueError or
// CoreError) with the core's message; returns NULL.
PyObject *hpcdl_py_raise(int rc, const char *msg);
// The open context, or NULL with CoreError set after close().
hpcdl_ctx *hpcdl_py_ctx(ContextObject *self);
// counts: a sequence of ints of length size -> a PyMem_Malloc'd size_t array,
// or NULL with an exception set.
size_t *hpcdl_py_counts(PyObject *seq, int size);

static inline void *hpcdl_py_ptr(unsigned long long v) { return (void *)(uintptr_t)v; }

// ----------------------------------------------------------------------------
// Context methods (collectives.c): blocking collectives release the GIL,
// asynchronous ones return a handle for poll / wait.

PyObject *hpcdl_py_allreduce(ContextObject *self, PyObject *args);
PyObject *hpcdl_py_allreduce_array(ContextObject *self, PyObject *args);
PyObject *hpcdl_py_reduce_scatter(ContextObject *self, PyObject *args);
PyObject *hpcdl_py_allgatherv(ContextObject *self, PyObject *args);
PyObject *hpcdl_py_broadcast(ContextObject *self, PyObject *args);
PyObject *hpcdl_py_report_invalid(ContextObject *self, PyObject *args);
PyObject *hpcdl_py_allreduce_async(ContextObject *self, PyObject *args);
PyObject *hpcdl_py_reduce_scatter_async(ContextObject *self, PyObject *args);
PyObject *hpcdl_py_allgatherv_async(ContextObject *self, PyObject *args);
PyObject *hpcdl_py_broadcast_async(ContextObject *self, PyObject *args);
PyObject *hpcdl_py_async_invalid(ContextObject *self, PyObject *args);
PyObject *hpcdl_py_poll(ContextObject *self, PyObject *args);
PyObject *hpcdl_py_wait(ContextObject *self, PyObject *args);
PyObject *hpcdl_py_timeline_drain(ContextObject *self, PyObject *args);

#endif // HPCDL_BINDING_H
