/*
 * core_module.c - the Python binding hpcdl._core over the C API: the module,
 * the Context type (creation from an mpi4py communicator, close, topology,
 * settings, the method table), the error and argument helpers, and the
 * module's functions. The collectives' methods are in collectives.c.
 *
 * Buffers arrive as raw addresses (ints) that hpcdl.comm took from numpy
 * arrays or torch tensors after validating dtype, contiguity and device, so
 * the binding stays zero-copy and framework-free. The MPI_Comm comes from
 * mpi4py's C API. Every collective releases the GIL while C works; errors
 * become MismatchError, ValueError or CoreError carrying the core's message.
 */
#include "binding.h" // first: Python.h
#include <mpi4py/mpi4py.h>

static PyObject *CoreError, *MismatchError, *RanksLostError;

// ----------------------------------------------------------------------------
// helpers

PyObject *hpcdl_py_raise(int rc, const char *msg) {
    PyObject *type = rc == HPCDL_ERR_MISMATCH      ? MismatchError
                     : rc == HPCDL_ERR_ARG         ? PyExc_ValueError
                     : rc == HPCDL_ERR_PROC_FAILED ? RanksLostError
                                                   : CoreError;
    PyErr_SetString(type, msg && *msg ? msg : "hpcdl core call failed");
    return NULL;
}

hpcdl_ctx *hpcdl_py_ctx(ContextObject *self) {
    if (!self->ctx) PyErr_SetString(CoreError, "hpcdl context is closed (after shutdown())");
    return self->ctx;
}

size_t *hpcdl_py_counts(PyObject *seq, int size) {
    PyObject *fast = PySequence_Fast(seq, "counts must be a sequence of ints");
    if (!fast) return NULL;
    if (PySequence_Fast_GET_SIZE(fast) != size) {
        PyErr_Format(PyExc_ValueError, "counts has %zd entries, need one per rank (%d)",
                     PySequence_Fast_GET_SIZE(fast), size);
        Py_DECREF(fast);
        return NULL;
    }
    size_t *c = PyMem_Malloc(sizeof(size_t) * (size_t)(size > 0 ? size : 1));
    for (int i = 0; c && i < size; i++) {
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
        if (v < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "counts must be >= 0");
            PyMem_Free(c);
            c = NULL;
            break;
        }
        c[i] = (size_t)v;
    }
    Py_DECREF(fast);
    if (!c && !PyErr_Occurred()) PyErr_NoMemory();
    return c;
}

// ----------------------------------------------------------------------------
// Context

static int Context_init(ContextObject *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"comm", "local_size", NULL};
    PyObject *comm_obj;
    int local_size = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|i", kwlist, &comm_obj, &local_size)) return -1;
    MPI_Comm *comm = PyMPIComm_Get(comm_obj);
    if (!comm) return -1;
    hpcdl_ctx *ctx = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = hpcdl_ctx_create(*comm, local_size, &ctx);
    Py_END_ALLOW_THREADS
    if (rc != HPCDL_OK) {
        hpcdl_py_raise(rc, hpcdl_last_error());
        return -1;
    }
    self->ctx = ctx;
    return 0;
}

static void Context_dealloc(ContextObject *self) {
    // No collective teardown here: a garbage-collected context may be freed
    // on one rank only. close() is the collective way; MPI_Finalize cleans up.
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Context_close(ContextObject *self, PyObject *noargs) {
    if (!self->ctx) Py_RETURN_NONE;
    int rc;
    hpcdl_ctx *ctx = self->ctx;
    self->ctx = NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = hpcdl_ctx_destroy(ctx);
    Py_END_ALLOW_THREADS
    if (rc != HPCDL_OK) return hpcdl_py_raise(rc, hpcdl_last_error());
    Py_RETURN_NONE;
}

// revoke(why): marks the context lost and revokes its communicators (a
// recovery the caller starts); local.
static PyObject *Context_revoke(ContextObject *self, PyObject *args) {
    const char *why = NULL;
    if (!PyArg_ParseTuple(args, "|z", &why)) return NULL;
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    Py_BEGIN_ALLOW_THREADS
    hpcdl_ctx_revoke(c, why);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

// abandon(): the local end of a lost context (no communication); the
// object is closed afterwards.
static PyObject *Context_abandon(ContextObject *self, PyObject *noargs) {
    hpcdl_ctx *ctx = self->ctx;
    self->ctx = NULL;
    if (!ctx) Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    hpcdl_ctx_abandon(ctx);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *Context_lost_ranks(ContextObject *self, PyObject *noargs) {
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    int ranks[16], n = hpcdl_lost_ranks(c, ranks, 16);
    PyObject *out = PyList_New(n);
    for (int i = 0; out && i < n; i++) PyList_SET_ITEM(out, i, PyLong_FromLong(ranks[i]));
    return out;
}

static PyObject *Context_is_lost(ContextObject *self, PyObject *noargs) {
    return PyBool_FromLong(self->ctx && hpcdl_ctx_is_lost(self->ctx));
}

static PyObject *Context_topology(ContextObject *self, PyObject *noargs) {
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    return Py_BuildValue("(iiiiii)", hpcdl_rank(c), hpcdl_size(c), hpcdl_local_rank(c),
                         hpcdl_local_size(c), hpcdl_cross_rank(c), hpcdl_cross_size(c));
}

static PyObject *Context_shared_alloc(ContextObject *self, PyObject *args) {
    unsigned long long bytes;
    if (!PyArg_ParseTuple(args, "K", &bytes)) return NULL;
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    void *p = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = hpcdl_shared_alloc(c, (size_t)bytes, &p);
    Py_END_ALLOW_THREADS
    if (rc != HPCDL_OK) return hpcdl_py_raise(rc, hpcdl_last_error());
    // the memory outlives the context (freed by MPI_Finalize), so a view is safe
    return PyMemoryView_FromMemory(p, (Py_ssize_t)bytes, PyBUF_WRITE);
}

static PyObject *Context_set_check(ContextObject *self, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    hpcdl_set_check(c, on);
    Py_RETURN_NONE;
}

// blocking(name) marks an outside collective's start for the stall
// inspector; blocking(None) its end.
static PyObject *Context_blocking(ContextObject *self, PyObject *args) {
    const char *name;
    if (!PyArg_ParseTuple(args, "z", &name)) return NULL;
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    if (name)
        hpcdl_blocking_begin(c, name);
    else
        hpcdl_blocking_end(c);
    Py_RETURN_NONE;
}

static PyObject *Context_set_chunk_bytes(ContextObject *self, PyObject *args) {
    unsigned long long b;
    if (!PyArg_ParseTuple(args, "K", &b)) return NULL;
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    hpcdl_set_chunk_bytes(c, (size_t)b);
    Py_RETURN_NONE;
}

static PyObject *Context_choose_algo(ContextObject *self, PyObject *args) {
    unsigned long long b;
    if (!PyArg_ParseTuple(args, "K", &b)) return NULL;
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    return PyUnicode_FromString(hpcdl_algo_name(hpcdl_choose_algo(c, (size_t)b)));
}

static PyMethodDef Context_methods[] = {
    {"close", (PyCFunction)Context_close, METH_NOARGS, "Collective: free communicators, shared memory, engine."},
    {"topology", (PyCFunction)Context_topology, METH_NOARGS, "(rank, size, local_rank, local_size, cross_rank, cross_size)"},
    {"allreduce", (PyCFunction)hpcdl_py_allreduce, METH_VARARGS, "allreduce(send, recv, count, dtype, op, algo[, device, stream])"},
    {"allreduce_array", (PyCFunction)hpcdl_py_allreduce_array, METH_VARARGS, "allreduce_array(send, recv_or_None, op, algo) -> recv: buffer-protocol fast path"},
    {"reduce_scatter", (PyCFunction)hpcdl_py_reduce_scatter, METH_VARARGS, "reduce_scatter(send, recv, counts, dtype, op, algo)"},
    {"allgatherv", (PyCFunction)hpcdl_py_allgatherv, METH_VARARGS, "allgatherv(send, recv, counts, dtype, algo)"},
    {"broadcast", (PyCFunction)hpcdl_py_broadcast, METH_VARARGS, "broadcast(buf, count, dtype, root, algo)"},
    {"report_invalid", (PyCFunction)hpcdl_py_report_invalid, METH_VARARGS, "report_invalid(what, nsig)"},
    {"allreduce_async", (PyCFunction)hpcdl_py_allreduce_async, METH_VARARGS, "allreduce_async(send, recv, count, dtype, op, algo, name[, device, stream]) -> handle"},
    {"reduce_scatter_async", (PyCFunction)hpcdl_py_reduce_scatter_async, METH_VARARGS, "reduce_scatter_async(send, recv, counts, dtype, op, algo, name) -> handle"},
    {"allgatherv_async", (PyCFunction)hpcdl_py_allgatherv_async, METH_VARARGS, "allgatherv_async(send, recv, counts, dtype, algo, name) -> handle"},
    {"broadcast_async", (PyCFunction)hpcdl_py_broadcast_async, METH_VARARGS, "broadcast_async(buf, count, dtype, root, algo, name) -> handle"},
    {"async_invalid", (PyCFunction)hpcdl_py_async_invalid, METH_VARARGS, "async_invalid(what, name) -> handle"},
    {"poll", (PyCFunction)hpcdl_py_poll, METH_VARARGS, "poll(handle) -> bool"},
    {"wait", (PyCFunction)hpcdl_py_wait, METH_VARARGS, "wait(handle)"},
    {"timeline_drain", (PyCFunction)hpcdl_py_timeline_drain, METH_NOARGS, "list of (handle, name, bytes, algo, t_submit, t_start, t_agreed, t_end, status)"},
    {"shared_alloc", (PyCFunction)Context_shared_alloc, METH_VARARGS, "shared_alloc(bytes) -> memoryview in node shared memory (collective over the node)"},
    {"set_check", (PyCFunction)Context_set_check, METH_VARARGS, "set_check(bool)"},
    {"set_chunk_bytes", (PyCFunction)Context_set_chunk_bytes, METH_VARARGS, "set_chunk_bytes(int)"},
    {"blocking", (PyCFunction)Context_blocking, METH_VARARGS, "blocking(name): an outside collective starts (for the stall inspector); blocking(None): it ended"},
    {"choose_algo", (PyCFunction)Context_choose_algo, METH_VARARGS, "choose_algo(bytes) -> name"},
    {"revoke", (PyCFunction)Context_revoke, METH_VARARGS, "revoke(why=None): local; marks the context lost and revokes its communicators (ULFM)"},
    {"abandon", (PyCFunction)Context_abandon, METH_NOARGS, "abandon(): local end of a lost context: threads stopped, memory freed, MPI objects left to MPI_Finalize"},
    {"is_lost", (PyCFunction)Context_is_lost, METH_NOARGS, "is_lost() -> True once a peer was lost (ULFM) or revoke() was called; False after close()"},
    {"lost_ranks", (PyCFunction)Context_lost_ranks, METH_NOARGS, "lost_ranks() -> the ranks this rank knows were lost (empty while none)"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject ContextType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hpcdl._core.Context",
    .tp_basicsize = sizeof(ContextObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Context(comm, local_size=0): hpcdl's collectives over an mpi4py communicator.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Context_init,
    .tp_dealloc = (destructor)Context_dealloc,
    .tp_methods = Context_methods,
};

// ----------------------------------------------------------------------------
// module functions

static PyObject *mod_built_with_cuda(PyObject *m, PyObject *noargs) {
    return PyBool_FromLong(hpcdl_built_with_cuda());
}

static PyObject *mod_mpi_cuda_aware(PyObject *m, PyObject *noargs) {
    return PyBool_FromLong(hpcdl_mpi_cuda_aware());
}

static PyObject *mod_built_with_ulfm(PyObject *m, PyObject *noargs) {
    return PyBool_FromLong(hpcdl_built_with_ulfm());
}

static PyObject *mod_exit_watchdog(PyObject *m, PyObject *args) {
    double seconds;
    if (!PyArg_ParseTuple(args, "d", &seconds)) return NULL;
    hpcdl_exit_watchdog(seconds);
    Py_RETURN_NONE;
}

static PyObject *mod_reduce_local(PyObject *m, PyObject *args) {
    unsigned long long o, a, b, count;
    int d, op;
    if (!PyArg_ParseTuple(args, "KKKKii", &o, &a, &b, &count, &d, &op)) return NULL;
    if ((unsigned)d >= HPCDL_NUM_DTYPES || (unsigned)op >= HPCDL_NUM_OPS)
        return hpcdl_py_raise(HPCDL_ERR_ARG, "reduce_local: dtype or op out of range");
    Py_BEGIN_ALLOW_THREADS
    hpcdl_reduce_local(hpcdl_py_ptr(o), hpcdl_py_ptr(a), hpcdl_py_ptr(b), (size_t)count, d, op);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"built_with_cuda", mod_built_with_cuda, METH_NOARGS, "True if the core was compiled with CUDA."},
    {"mpi_cuda_aware", mod_mpi_cuda_aware, METH_NOARGS, "True if the MPI library is CUDA-aware."},
    {"exit_watchdog", mod_exit_watchdog, METH_VARARGS, "exit_watchdog(seconds): after a lost rank, end the process (status 0) if MPI_Finalize has not returned by then"},
    {"built_with_ulfm", mod_built_with_ulfm, METH_NOARGS, "True if the core was compiled against an MPI with ULFM (fault tolerance)."},
    {"reduce_local", mod_reduce_local, METH_VARARGS, "reduce_local(out, a, b, count, dtype, op)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef core_module = {PyModuleDef_HEAD_INIT, "hpcdl._core",
                                         "hpcdl's C collectives core.", -1, module_methods};

PyMODINIT_FUNC PyInit__core(void) {
    if (import_mpi4py() < 0) return NULL;
    if (PyType_Ready(&ContextType) < 0) return NULL;
    PyObject *m = PyModule_Create(&core_module);
    if (!m) return NULL;
    /* the classes of hpcdl/comm/errors.py, so that naming them loads no MPI */
    PyObject *errors = PyImport_ImportModule("hpcdl.comm.errors");
    if (!errors) return NULL;
    CoreError = PyObject_GetAttrString(errors, "CoreError");
    MismatchError = PyObject_GetAttrString(errors, "MismatchError");
    RanksLostError = PyObject_GetAttrString(errors, "RanksLostError");
    Py_DECREF(errors);
    if (!CoreError || !MismatchError || !RanksLostError) return NULL;
    Py_INCREF(&ContextType);
    PyModule_AddObject(m, "Context", (PyObject *)&ContextType);
    PyModule_AddObject(m, "CoreError", CoreError);
    Py_INCREF(MismatchError);
    PyModule_AddObject(m, "MismatchError", MismatchError);
    Py_INCREF(RanksLostError);
    PyModule_AddObject(m, "RanksLostError", RanksLostError);
    PyModule_AddIntConstant(m, "VERSION_MAJOR", HPCDL_VERSION_MAJOR);
    PyModule_AddIntConstant(m, "VERSION_MINOR", HPCDL_VERSION_MINOR);
    return m;
}
