/*
 * collectives.c - the Context's collectives in the Python binding: blocking
 * ones (the GIL released while C works; numpy arrays straight from the
 * buffer protocol), asynchronous ones through the engine (a handle to poll
 * or wait on), and the engine's timeline records.
 *
 * Buffers arrive as raw addresses (ints) that hpcdl.comm took from numpy
 * arrays or torch tensors after validating dtype, contiguity and device.
 */
#include "binding.h"

// ----------------------------------------------------------------------------
// blocking collectives

// device, stream (optional, last): where the buffers live, as hpcdl.comm
// knows it (hpcdl_mem: -1 host, else the GPU, and the producer's
// cudaStream_t); device -2 (left out) lets the core ask CUDA.
static const hpcdl_mem *mem_of(hpcdl_mem *m, int device, unsigned long long stream) {
    m->device = device;
    m->stream = hpcdl_py_ptr(stream);
    return device == -2 ? NULL : m;
}

PyObject *hpcdl_py_allreduce(ContextObject *self, PyObject *args) {
    unsigned long long s, r, count, stream = 0;
    int d, op, algo, rc, device = -2;
    if (!PyArg_ParseTuple(args, "KKKiii|iK", &s, &r, &count, &d, &op, &algo, &device, &stream))
        return NULL;
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    hpcdl_mem m;
    const hpcdl_mem *mem = mem_of(&m, device, stream);
    Py_BEGIN_ALLOW_THREADS
    rc = hpcdl_allreduce_mem(c, hpcdl_py_ptr(s), hpcdl_py_ptr(r), (size_t)count, d, op, algo,
                             mem);
    Py_END_ALLOW_THREADS
    if (rc != HPCDL_OK) return hpcdl_py_raise(rc, hpcdl_last_error());
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

PyObject *hpcdl_py_allreduce_array(ContextObject *self, PyObject *args) {
    PyObject *send_obj, *recv_obj;
    int op, algo, rc;
    if (!PyArg_ParseTuple(args, "OOii", &send_obj, &recv_obj, &op, &algo)) return NULL;
    hpcdl_ctx *c = hpcdl_py_ctx(self);
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
    const hpcdl_mem host = {-1, NULL}; // a buffer-protocol array: never ask CUDA
    if (sv.len < (1 << 16)) {
        rc = hpcdl_allreduce_mem(c, sv.buf, recv, count, d, op, algo, &host);
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = hpcdl_allreduce_mem(c, sv.buf, recv, count, d, op, algo, &host);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&sv);
    if (!in_place) PyBuffer_Release(&rv);
    if (rc != HPCDL_OK) return hpcdl_py_raise(rc, hpcdl_last_error());
    Py_INCREF(in_place ? send_obj : recv_obj);
    return in_place ? send_obj : recv_obj;
}

PyObject *hpcdl_py_reduce_scatter(ContextObject *self, PyObject *args) {
    unsigned long long s, r;
    PyObject *counts_obj;
    int d, op, algo, rc;
    if (!PyArg_ParseTuple(args, "KKOiii", &s, &r, &counts_obj, &d, &op, &algo)) return NULL;
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    size_t *counts = hpcdl_py_counts(counts_obj, hpcdl_size(c));
    if (!counts) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = hpcdl_reduce_scatter(c, hpcdl_py_ptr(s), hpcdl_py_ptr(r), counts, d, op, algo);
    Py_END_ALLOW_THREADS
    PyMem_Free(counts);
    if (rc != HPCDL_OK) return hpcdl_py_raise(rc, hpcdl_last_error());
    Py_RETURN_NONE;
}

PyObject *hpcdl_py_allgatherv(ContextObject *self, PyObject *args) {
    unsigned long long s, r;
    PyObject *counts_obj;
    int d, algo, rc;
    if (!PyArg_ParseTuple(args, "KKOii", &s, &r, &counts_obj, &d, &algo)) return NULL;
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    size_t *counts = hpcdl_py_counts(counts_obj, hpcdl_size(c));
    if (!counts) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = hpcdl_allgatherv(c, hpcdl_py_ptr(s), hpcdl_py_ptr(r), counts, d, algo);
    Py_END_ALLOW_THREADS
    PyMem_Free(counts);
    if (rc != HPCDL_OK) return hpcdl_py_raise(rc, hpcdl_last_error());
    Py_RETURN_NONE;
}

PyObject *hpcdl_py_broadcast(ContextObject *self, PyObject *args) {
    unsigned long long b, count;
    int d, root, algo, rc;
    if (!PyArg_ParseTuple(args, "KKiii", &b, &count, &d, &root, &algo)) return NULL;
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = hpcdl_broadcast(c, hpcdl_py_ptr(b), (size_t)count, d, root, algo);
    Py_END_ALLOW_THREADS
    if (rc != HPCDL_OK) return hpcdl_py_raise(rc, hpcdl_last_error());
    Py_RETURN_NONE;
}

PyObject *hpcdl_py_report_invalid(ContextObject *self, PyObject *args) {
    const char *what;
    int nsig, rc;
    if (!PyArg_ParseTuple(args, "si", &what, &nsig)) return NULL;
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = hpcdl_report_invalid(c, what, nsig);
    Py_END_ALLOW_THREADS
    if (rc != HPCDL_OK) return hpcdl_py_raise(rc, hpcdl_last_error());
    Py_RETURN_NONE;
}

// ----------------------------------------------------------------------------
// asynchronous collectives: queued to the engine thread, a handle back

PyObject *hpcdl_py_allreduce_async(ContextObject *self, PyObject *args) {
    unsigned long long s, r, count, stream = 0;
    int d, op, algo, rc, device = -2;
    const char *name;
    if (!PyArg_ParseTuple(args, "KKKiiis|iK", &s, &r, &count, &d, &op, &algo, &name, &device,
                          &stream))
        return NULL;
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    hpcdl_handle h = 0;
    hpcdl_mem m;
    rc = hpcdl_allreduce_mem_async(c, hpcdl_py_ptr(s), hpcdl_py_ptr(r), (size_t)count, d, op,
                                   algo, mem_of(&m, device, stream), name, &h);
    if (rc != HPCDL_OK) return hpcdl_py_raise(rc, hpcdl_last_error());
    return PyLong_FromLongLong(h);
}

PyObject *hpcdl_py_reduce_scatter_async(ContextObject *self, PyObject *args) {
    unsigned long long s, r;
    PyObject *counts_obj;
    int d, op, algo;
    const char *name;
    if (!PyArg_ParseTuple(args, "KKOiiis", &s, &r, &counts_obj, &d, &op, &algo, &name))
        return NULL;
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    size_t *counts = hpcdl_py_counts(counts_obj, hpcdl_size(c));
    if (!counts) return NULL;
    hpcdl_handle h = 0;
    int rc = hpcdl_reduce_scatter_async(c, hpcdl_py_ptr(s), hpcdl_py_ptr(r), counts, d, op, algo, name, &h);
    PyMem_Free(counts);
    if (rc != HPCDL_OK) return hpcdl_py_raise(rc, hpcdl_last_error());
    return PyLong_FromLongLong(h);
}

PyObject *hpcdl_py_allgatherv_async(ContextObject *self, PyObject *args) {
    unsigned long long s, r;
    PyObject *counts_obj;
    int d, algo;
    const char *name;
    if (!PyArg_ParseTuple(args, "KKOiis", &s, &r, &counts_obj, &d, &algo, &name)) return NULL;
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    size_t *counts = hpcdl_py_counts(counts_obj, hpcdl_size(c));
    if (!counts) return NULL;
    hpcdl_handle h = 0;
    int rc = hpcdl_allgatherv_async(c, hpcdl_py_ptr(s), hpcdl_py_ptr(r), counts, d, algo, name, &h);
    PyMem_Free(counts);
    if (rc != HPCDL_OK) return hpcdl_py_raise(rc, hpcdl_last_error());
    return PyLong_FromLongLong(h);
}

PyObject *hpcdl_py_broadcast_async(ContextObject *self, PyObject *args) {
    unsigned long long b, count;
    int d, root, algo;
    const char *name;
    if (!PyArg_ParseTuple(args, "KKiiis", &b, &count, &d, &root, &algo, &name)) return NULL;
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    hpcdl_handle h = 0;
    int rc = hpcdl_broadcast_async(c, hpcdl_py_ptr(b), (size_t)count, d, root, algo, name, &h);
    if (rc != HPCDL_OK) return hpcdl_py_raise(rc, hpcdl_last_error());
    return PyLong_FromLongLong(h);
}

PyObject *hpcdl_py_async_invalid(ContextObject *self, PyObject *args) {
    const char *what, *name;
    if (!PyArg_ParseTuple(args, "ss", &what, &name)) return NULL;
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    hpcdl_handle h = 0;
    int rc = hpcdl_async_invalid(c, what, name, &h);
    if (rc != HPCDL_OK) return hpcdl_py_raise(rc, hpcdl_last_error());
    return PyLong_FromLongLong(h);
}

// ----------------------------------------------------------------------------
// handles and the timeline

PyObject *hpcdl_py_poll(ContextObject *self, PyObject *args) {
    long long h;
    if (!PyArg_ParseTuple(args, "L", &h)) return NULL;
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    int rc = hpcdl_poll(c, h);
    if (rc < 0) return hpcdl_py_raise(rc, hpcdl_last_error());
    return PyBool_FromLong(rc);
}

PyObject *hpcdl_py_wait(ContextObject *self, PyObject *args) {
    long long h;
    if (!PyArg_ParseTuple(args, "L", &h)) return NULL;
    hpcdl_ctx *c = hpcdl_py_ctx(self);
    if (!c) return NULL;
    char err[1024];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = hpcdl_wait(c, h, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc != HPCDL_OK) return hpcdl_py_raise(rc, *err ? err : hpcdl_last_error());
    Py_RETURN_NONE;
}

// The engine's records of finished operations, oldest first.
PyObject *hpcdl_py_timeline_drain(ContextObject *self, PyObject *noargs) {
    hpcdl_ctx *c = hpcdl_py_ctx(self);
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
