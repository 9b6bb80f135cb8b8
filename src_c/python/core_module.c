/*
 * core_module.c - the Python binding hpcdl._core over the C API.
 *
 * Buffers arrive as raw addresses (ints) that hpcdl.comm took from numpy
 * arrays or torch tensors after validating dtype, contiguity and device, so
 * the binding stays zero-copy and framework-free. The MPI_Comm comes from
 * mpi4py's C API. Every collective releases the GIL while C works; errors
 * become MismatchError, ValueError or CoreError carrying the core's message.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <mpi4py/mpi4py.h>
#include "hpcdl.h"

static PyObject *CoreError, *MismatchError;

typedef struct {
    PyObject_HEAD
    hpcdl_ctx *ctx;
} ContextObject;

// ----------------------------------------------------------------------------
// helpers

static PyObject *raise_rc(int rc, const char *msg) {
    PyObject *type = rc == HPCDL_ERR_MISMATCH ? MismatchError
                     : rc == HPCDL_ERR_ARG    ? PyExc_ValueError
                                              : CoreError;
    PyErr_SetString(type, msg && *msg ? msg : "hpcdl core call failed");
    return NULL;
}

static hpcdl_ctx *get_ctx(ContextObject *self) {
    if (!self->ctx) PyErr_SetString(CoreError, "hpcdl context is closed (after shutdown())");
    return self->ctx;
}

static void *as_ptr(unsigned long long v) { return (void *)(uintptr_t)v; }

// counts: a sequence of ints of length size -> malloc'd size_t array
static size_t *seq_to_counts(PyObject *seq, int size) {
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
        raise_rc(rc, hpcdl_last_error());
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
    if (rc != HPCDL_OK) return raise_rc(rc, hpcdl_last_error());
    Py_RETURN_NONE;
}

static PyObject *Context_topology(ContextObject *self, PyObject *noargs) {
    hpcdl_ctx *c = get_ctx(self);
    if (!c) return NULL;
    return Py_BuildValue("(iiiiii)", hpcdl_rank(c), hpcdl_size(c), hpcdl_local_rank(c),
                         hpcdl_local_size(c), hpcdl_cross_rank(c), hpcdl_cross_size(c));
}

static PyObject *Context_allreduce(ContextObject *self, PyObject *args) {
    unsigned long long s, r, count;
    int d, op, algo, rc;
    if (!PyArg_ParseTuple(args, "KKKiii", &s, &r, &count, &d, &op, &algo)) return NULL;
    hpcdl_ctx *c = get_ctx(self);
    if (!c) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = hpcdl_allreduce(c, as_ptr(s), as_ptr(r), (size_t)count, d, op, algo);
    Py_END_ALLOW_THREADS
    if (rc != HPCDL_OK) return raise_rc(rc, hpcdl_last_error());
    Py_RETURN_NONE;
}

// The fast path for numpy arrays (and anything with the buffer protocol):
// dtype, count and contiguity straight from the buffer, no Python-level
// bookkeeping. Small messages keep the GIL: releasing it costs more than the
// collective itself.
static int buffer_dtype(const Py_buffer *v) {
    const char *f = v->format ? v->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    switch (*f) {
    case 'f': return v->itemsize == 4 ? HPCDL_FLOAT32 : -1;
    case 'd': return v->itemsize == 8 ? HPCDL_FLOAT64 : -1;
    case 'e': return v->itemsize == 2 ? HPCDL_FLOAT16 : -1;
    case 'i': case 'l': case 'q':
        return v->itemsize == 4 ? HPCDL_INT32 : v->itemsize == 8 ? HPCDL_INT64 : -1;
    default: return -1;
    }
}

static int get_array(PyObject *obj, Py_buffer *v, const char *what) {
    if (PyObject_GetBuffer(obj, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a writable C-contiguous array of float32, "
                     "float64, float16, int32 or int64", what);
        return -1;
    }
    if (buffer_dtype(v) < 0) {
        PyErr_Format(PyExc_TypeError, "%s has an unsupported dtype (format '%s'); hpcdl "
                     "supports float32, float64, float16, int32, int64", what,
                     v->format ? v->format : "B");
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

static PyObject *Context_allreduce_array(ContextObject *self, PyObject *args) {
    PyObject *send_obj, *recv_obj;
    int op, algo, rc;
    if (!PyArg_ParseTuple(args, "OOii", &send_obj, &recv_obj, &op, &algo)) return NULL;
    hpcdl_ctx *c = get_ctx(self);
    if (!c) return NULL;
    Py_buffer sv, rv;
    if (get_array(send_obj, &sv, "send buffer") < 0) return NULL;
    int in_place = recv_obj == Py_None || recv_obj == send_obj;
    if (!in_place && get_array(recv_obj, &rv, "recv buffer") < 0) {
        PyBuffer_Release(&sv);
        return NULL;
    }
    int d = buffer_dtype(&sv);
    size_t count = (size_t)(sv.len / sv.itemsize);
    if (!in_place && (buffer_dtype(&rv) != d || rv.len != sv.len)) {
        PyBuffer_Release(&sv);
        PyBuffer_Release(&rv);
        return PyErr_Format(PyExc_ValueError, "allreduce: send and recv buffers differ in "
                            "dtype or size");
    }
    void *recv = in_place ? sv.buf : rv.buf;
    if (sv.len < (1 << 16)) {
        rc = hpcdl_allreduce(c, sv.buf, recv, count, d, op, algo);
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = hpcdl_allreduce(c, sv.buf, recv, count, d, op, algo);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&sv);
    if (!in_place) PyBuffer_Release(&rv);
    if (rc != HPCDL_OK) return raise_rc(rc, hpcdl_last_error());
    Py_INCREF(in_place ? send_obj : recv_obj);
    return in_place ? send_obj : recv_obj;
}

static PyObject *Context_reduce_scatter(ContextObject *self, PyObject *args) {
    unsigned long long s, r;
    PyObject *counts_obj;
    int d, op, algo, rc;
    if (!PyArg_ParseTuple(args, "KKOiii", &s, &r, &counts_obj, &d, &op, &algo)) return NULL;
    hpcdl_ctx *c = get_ctx(self);
    if (!c) return NULL;
    size_t *counts = seq_to_counts(counts_obj, hpcdl_size(c));
    if (!counts) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = hpcdl_reduce_scatter(c, as_ptr(s), as_ptr(r), counts, d, op, algo);
    Py_END_ALLOW_THREADS
    PyMem_Free(counts);
    if (rc != HPCDL_OK) return raise_rc(rc, hpcdl_last_error());
    Py_RETURN_NONE;
}

static PyObject *Context_allgatherv(ContextObject *self, PyObject *args) {
    unsigned long long s, r;
    PyObject *counts_obj;
    int d, algo, rc;
    if (!PyArg_ParseTuple(args, "KKOii", &s, &r, &counts_obj, &d, &algo)) return NULL;
    hpcdl_ctx *c = get_ctx(self);
    if (!c) return NULL;
    size_t *counts = seq_to_counts(counts_obj, hpcdl_size(c));
    if (!counts) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = hpcdl_allgatherv(c, as_ptr(s), as_ptr(r), counts, d, algo);
    Py_END_ALLOW_THREADS
    PyMem_Free(counts);
    if (rc != HPCDL_OK) return raise_rc(rc, hpcdl_last_error());
    Py_RETURN_NONE;
}

static PyObject *Context_broadcast(ContextObject *self, PyObject *args) {
    unsigned long long b, count;
    int d, root, algo, rc;
    if (!PyArg_ParseTuple(args, "KKiii", &b, &count, &d, &root, &algo)) return NULL;
    hpcdl_ctx *c = get_ctx(self);
    if (!c) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = hpcdl_broadcast(c, as_ptr(b), (size_t)count, d, root, algo);
    Py_END_ALLOW_THREADS
    if (rc != HPCDL_OK) return raise_rc(rc, hpcdl_last_error());
    Py_RETURN_NONE;
}

static PyObject *Context_report_invalid(ContextObject *self, PyObject *args) {
    const char *what;
    int nsig, rc;
    if (!PyArg_ParseTuple(args, "si", &what, &nsig)) return NULL;
    hpcdl_ctx *c = get_ctx(self);
    if (!c) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = hpcdl_report_invalid(c, what, nsig);
    Py_END_ALLOW_THREADS
    if (rc != HPCDL_OK) return raise_rc(rc, hpcdl_last_error());
    Py_RETURN_NONE;
}

static PyObject *Context_allreduce_async(ContextObject *self, PyObject *args) {
    unsigned long long s, r, count;
    int d, op, algo, rc;
    const char *name;
    if (!PyArg_ParseTuple(args, "KKKiiis", &s, &r, &count, &d, &op, &algo, &name)) return NULL;
    hpcdl_ctx *c = get_ctx(self);
    if (!c) return NULL;
    hpcdl_handle h = 0;
    rc = hpcdl_allreduce_async(c, as_ptr(s), as_ptr(r), (size_t)count, d, op, algo, name, &h);
    if (rc != HPCDL_OK) return raise_rc(rc, hpcdl_last_error());
    return PyLong_FromLongLong(h);
}

static PyObject *Context_reduce_scatter_async(ContextObject *self, PyObject *args) {
    unsigned long long s, r;
    PyObject *counts_obj;
    int d, op, algo;
    const char *name;
    if (!PyArg_ParseTuple(args, "KKOiiis", &s, &r, &counts_obj, &d, &op, &algo, &name))
        return NULL;
    hpcdl_ctx *c = get_ctx(self);
    if (!c) return NULL;
    size_t *counts = seq_to_counts(counts_obj, hpcdl_size(c));
    if (!counts) return NULL;
    hpcdl_handle h = 0;
    int rc = hpcdl_reduce_scatter_async(c, as_ptr(s), as_ptr(r), counts, d, op, algo, name, &h);
    PyMem_Free(counts);
    if (rc != HPCDL_OK) return raise_rc(rc, hpcdl_last_error());
    return PyLong_FromLongLong(h);
}

static PyObject *Context_allgatherv_async(ContextObject *self, PyObject *args) {
    unsigned long long s, r;
    PyObject *counts_obj;
    int d, algo;
    const char *name;
    if (!PyArg_ParseTuple(args, "KKOiis", &s, &r, &counts_obj, &d, &algo, &name)) return NULL;
    hpcdl_ctx *c = get_ctx(self);
    if (!c) return NULL;
    size_t *counts = seq_to_counts(counts_obj, hpcdl_size(c));
    if (!counts) return NULL;
    hpcdl_handle h = 0;
    int rc = hpcdl_allgatherv_async(c, as_ptr(s), as_ptr(r), counts, d, algo, name, &h);
    PyMem_Free(counts);
    if (rc != HPCDL_OK) return raise_rc(rc, hpcdl_last_error());
    return PyLong_FromLongLong(h);
}

static PyObject *Context_broadcast_async(ContextObject *self, PyObject *args) {
    unsigned long long b, count;
    int d, root, algo;
    const char *name;
    if (!PyArg_ParseTuple(args, "KKiiis", &b, &count, &d, &root, &algo, &name)) return NULL;
    hpcdl_ctx *c = get_ctx(self);
    if (!c) return NULL;
    hpcdl_handle h = 0;
    int rc = hpcdl_broadcast_async(c, as_ptr(b), (size_t)count, d, root, algo, name, &h);
    if (rc != HPCDL_OK) return raise_rc(rc, hpcdl_last_error());
    return PyLong_FromLongLong(h);
}

static PyObject *Context_async_invalid(ContextObject *self, PyObject *args) {
    const char *what, *name;
    if (!PyArg_ParseTuple(args, "ss", &what, &name)) return NULL;
    hpcdl_ctx *c = get_ctx(self);
    if (!c) return NULL;
    hpcdl_handle h = 0;
    int rc = hpcdl_async_invalid(c, what, name, &h);
    if (rc != HPCDL_OK) return raise_rc(rc, hpcdl_last_error());
    return PyLong_FromLongLong(h);
}

static PyObject *Context_poll(ContextObject *self, PyObject *args) {
    long long h;
    if (!PyArg_ParseTuple(args, "L", &h)) return NULL;
    hpcdl_ctx *c = get_ctx(self);
    if (!c) return NULL;
    int rc = hpcdl_poll(c, h);
    if (rc < 0) return raise_rc(rc, hpcdl_last_error());
    return PyBool_FromLong(rc);
}

static PyObject *Context_wait(ContextObject *self, PyObject *args) {
    long long h;
    if (!PyArg_ParseTuple(args, "L", &h)) return NULL;
    hpcdl_ctx *c = get_ctx(self);
    if (!c) return NULL;
    char err[1024];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = hpcdl_wait(c, h, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc != HPCDL_OK) return raise_rc(rc, *err ? err : hpcdl_last_error());
    Py_RETURN_NONE;
}

static PyObject *Context_timeline_drain(ContextObject *self, PyObject *noargs) {
    hpcdl_ctx *c = get_ctx(self);
    if (!c) return NULL;
    PyObject *out = PyList_New(0);
    hpcdl_timeline_rec recs[256];
    size_t n;
    while (out && (n = hpcdl_timeline_drain(c, recs, 256)) > 0) {
        for (size_t i = 0; i < n; i++) {
            hpcdl_timeline_rec *r = &recs[i];
            PyObject *t = Py_BuildValue("(LsKsddddi)", (long long)r->handle, r->name,
                                        (unsigned long long)r->bytes,
                                        hpcdl_algo_name((hpcdl_algo)r->algo), r->t_submit,
                                        r->t_start, r->t_agreed, r->t_end, r->status);
            if (!t || PyList_Append(out, t) < 0) {
                Py_XDECREF(t);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(t);
        }
    }
    return out;
}

static PyObject *Context_shared_alloc(ContextObject *self, PyObject *args) {
    unsigned long long bytes;
    if (!PyArg_ParseTuple(args, "K", &bytes)) return NULL;
    hpcdl_ctx *c = get_ctx(self);
    if (!c) return NULL;
    void *p = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = hpcdl_shared_alloc(c, (size_t)bytes, &p);
    Py_END_ALLOW_THREADS
    if (rc != HPCDL_OK) return raise_rc(rc, hpcdl_last_error());
    // the memory outlives the context (freed by MPI_Finalize), so a view is safe
    return PyMemoryView_FromMemory(p, (Py_ssize_t)bytes, PyBUF_WRITE);
}

static PyObject *Context_set_check(ContextObject *self, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    hpcdl_ctx *c = get_ctx(self);
    if (!c) return NULL;
    hpcdl_set_check(c, on);
    Py_RETURN_NONE;
}

static PyObject *Context_set_chunk_bytes(ContextObject *self, PyObject *args) {
    unsigned long long b;
    if (!PyArg_ParseTuple(args, "K", &b)) return NULL;
    hpcdl_ctx *c = get_ctx(self);
    if (!c) return NULL;
    hpcdl_set_chunk_bytes(c, (size_t)b);
    Py_RETURN_NONE;
}

static PyObject *Context_choose_algo(ContextObject *self, PyObject *args) {
    unsigned long long b;
    if (!PyArg_ParseTuple(args, "K", &b)) return NULL;
    hpcdl_ctx *c = get_ctx(self);
    if (!c) return NULL;
    return PyUnicode_FromString(hpcdl_algo_name(hpcdl_choose_algo(c, (size_t)b)));
}

static PyMethodDef Context_methods[] = {
    {"close", (PyCFunction)Context_close, METH_NOARGS, "Collective: free communicators, shared memory, engine."},
    {"topology", (PyCFunction)Context_topology, METH_NOARGS, "(rank, size, local_rank, local_size, cross_rank, cross_size)"},
    {"allreduce", (PyCFunction)Context_allreduce, METH_VARARGS, "allreduce(send, recv, count, dtype, op, algo)"},
    {"allreduce_array", (PyCFunction)Context_allreduce_array, METH_VARARGS, "allreduce_array(send, recv_or_None, op, algo) -> recv: buffer-protocol fast path"},
    {"reduce_scatter", (PyCFunction)Context_reduce_scatter, METH_VARARGS, "reduce_scatter(send, recv, counts, dtype, op, algo)"},
    {"allgatherv", (PyCFunction)Context_allgatherv, METH_VARARGS, "allgatherv(send, recv, counts, dtype, algo)"},
    {"broadcast", (PyCFunction)Context_broadcast, METH_VARARGS, "broadcast(buf, count, dtype, root, algo)"},
    {"report_invalid", (PyCFunction)Context_report_invalid, METH_VARARGS, "report_invalid(what, nsig)"},
    {"allreduce_async", (PyCFunction)Context_allreduce_async, METH_VARARGS, "allreduce_async(send, recv, count, dtype, op, algo, name) -> handle"},
    {"reduce_scatter_async", (PyCFunction)Context_reduce_scatter_async, METH_VARARGS, "reduce_scatter_async(send, recv, counts, dtype, op, algo, name) -> handle"},
    {"allgatherv_async", (PyCFunction)Context_allgatherv_async, METH_VARARGS, "allgatherv_async(send, recv, counts, dtype, algo, name) -> handle"},
    {"broadcast_async", (PyCFunction)Context_broadcast_async, METH_VARARGS, "broadcast_async(buf, count, dtype, root, algo, name) -> handle"},
    {"async_invalid", (PyCFunction)Context_async_invalid, METH_VARARGS, "async_invalid(what, name) -> handle"},
    {"poll", (PyCFunction)Context_poll, METH_VARARGS, "poll(handle) -> bool"},
    {"wait", (PyCFunction)Context_wait, METH_VARARGS, "wait(handle)"},
    {"timeline_drain", (PyCFunction)Context_timeline_drain, METH_NOARGS, "list of (handle, name, bytes, algo, t_submit, t_start, t_agreed, t_end, status)"},
    {"shared_alloc", (PyCFunction)Context_shared_alloc, METH_VARARGS, "shared_alloc(bytes) -> memoryview in node shared memory (collective over the node)"},
    {"set_check", (PyCFunction)Context_set_check, METH_VARARGS, "set_check(bool)"},
    {"set_chunk_bytes", (PyCFunction)Context_set_chunk_bytes, METH_VARARGS, "set_chunk_bytes(int)"},
    {"choose_algo", (PyCFunction)Context_choose_algo, METH_VARARGS, "choose_algo(bytes) -> name"},
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

static PyObject *mod_reduce_local(PyObject *m, PyObject *args) {
    unsigned long long o, a, b, count;
    int d, op;
    if (!PyArg_ParseTuple(args, "KKKKii", &o, &a, &b, &count, &d, &op)) return NULL;
    if ((unsigned)d >= HPCDL_NUM_DTYPES || (unsigned)op >= HPCDL_NUM_OPS)
        return raise_rc(HPCDL_ERR_ARG, "reduce_local: dtype or op out of range");
    Py_BEGIN_ALLOW_THREADS
    hpcdl_reduce_local(as_ptr(o), as_ptr(a), as_ptr(b), (size_t)count, d, op);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"built_with_cuda", mod_built_with_cuda, METH_NOARGS, "True if the core was compiled with CUDA."},
    {"mpi_cuda_aware", mod_mpi_cuda_aware, METH_NOARGS, "True if the MPI library is CUDA-aware."},
    {"reduce_local", mod_reduce_local, METH_VARARGS, "reduce_local(out, a, b, count, dtype, op)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef core_module = {PyModuleDef_HEAD_INIT, "hpcdl._core",
                                         "hpcdl's C collectives core.", -1, module_methods};

PyMODINIT_FUNC PyInit__core(void) {
    if (import_mpi4py() < 0) return NULL;
    if (PyType_Ready(&ContextType) < 0) return NULL;
    PyObject *m = PyModule_Create(&core_module);
    if (!m) return NULL;
    CoreError = PyErr_NewException("hpcdl._core.CoreError", PyExc_RuntimeError, NULL);
    MismatchError = PyErr_NewException("hpcdl._core.MismatchError", CoreError, NULL);
    Py_INCREF(&ContextType);
    PyModule_AddObject(m, "Context", (PyObject *)&ContextType);
    PyModule_AddObject(m, "CoreError", CoreError);
    Py_INCREF(MismatchError);
    PyModule_AddObject(m, "MismatchError", MismatchError);
    PyModule_AddIntConstant(m, "VERSION_MAJOR", HPCDL_VERSION_MAJOR);
    PyModule_AddIntConstant(m, "VERSION_MINOR", HPCDL_VERSION_MINOR);
    return m;
}
