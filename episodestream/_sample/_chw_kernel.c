/*
 * episodestream._sample._chw_kernel: a decoded RGB frame, (H, W, 3) uint8 as FFmpeg lays it out, written
 * into batch memory as (3, H, W) uint8, or float32 divided by 255 (LeRobot's `frames / 255.0`).
 *
 * Why C: the work is a de-interleave (every third byte to one plane). numpy and PyTorch do it with
 * a scalar strided loop, about one byte per cycle, a tenth of the cost of decoding the frame. A
 * compiler vectorises this loop with byte shuffles, several times faster, which shows end to end in
 * EpisodeLoader's float32 rows (docs/benchmarks.md). No library this project uses exposes such a loop.
 *
 * The division is IEEE float32 division of the exact float value of each byte, as numpy's and
 * PyTorch's are: bit for bit the same result (tests check every byte value); do not build it with
 * -ffast-math. Built with the package where a C compiler is present (setuptools' optional
 * extension: a failed build leaves it out); without it episodestream/_sample/chw.py does the same in numpy.
 * The caller guarantees src and dst do not overlap (restrict); chw.py checks it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* An AVX2 copy of each loop beside the baseline's (SSE2 cannot shuffle bytes well), picked at load
 * time: GCC with glibc's ifunc on x86-64 Linux. An AVX-512 (x86-64-v4) copy was slower on this
 * project's AMD EPYC machines, so there is none. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__)
#define PER_ISA __attribute__((target_clones("avx2", "default")))
#else
#define PER_ISA
#endif

#if defined(_MSC_VER) && !defined(__clang__)
#define restrict __restrict /* MSVC knows C99's restrict only under /std:c11 */
#endif

PER_ISA static void planes_float32(const uint8_t *restrict rgb, float *restrict r, float *restrict g,
                                   float *restrict b, Py_ssize_t pixels) {
    const float max = 255.0f;
    for (Py_ssize_t i = 0; i < pixels; i++) {
        r[i] = (float)rgb[3 * i] / max;
        g[i] = (float)rgb[3 * i + 1] / max;
        b[i] = (float)rgb[3 * i + 2] / max;
    }
}

PER_ISA static void planes_uint8(const uint8_t *restrict rgb, uint8_t *restrict r, uint8_t *restrict g,
                                 uint8_t *restrict b, Py_ssize_t pixels) {
    for (Py_ssize_t i = 0; i < pixels; i++) {
        r[i] = rgb[3 * i];
        g[i] = rgb[3 * i + 1];
        b[i] = rgb[3 * i + 2];
    }
}

/* One frame of rgb into the planes of dst's frame starting at value ``at`` (float32 / 255 or uint8). */
static void write_planes(const uint8_t *rgb, void *dst, Py_ssize_t at, int to_float32, Py_ssize_t pixels) {
    if (to_float32) {
        float *out = (float *)dst + at;
        planes_float32(rgb, out, out + pixels, out + 2 * pixels, pixels);
    } else {
        uint8_t *out = (uint8_t *)dst + at;
        planes_uint8(rgb, out, out + pixels, out + 2 * pixels, pixels);
    }
}

static PyObject *hwc_to_chw(PyObject *module, PyObject *args) {
    PyObject *src_obj, *dst_obj;
    if (!PyArg_ParseTuple(args, "OO:hwc_to_chw", &src_obj, &dst_obj)) {
        return NULL;
    }
    Py_buffer src, dst;
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(dst_obj, &dst, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    PyObject *result = NULL;
    const char *src_format = src.format ? src.format : "B";
    const char *dst_format = dst.format ? dst.format : "B";
    Py_ssize_t pixels = src.len / 3;
    int to_float32 = dst.itemsize == 4 && dst_format[0] == 'f' && dst_format[1] == '\0';
    int to_uint8 = dst.itemsize == 1 && dst_format[0] == 'B' && dst_format[1] == '\0';
    if (src.itemsize != 1 || src_format[0] != 'B' || src_format[1] != '\0' || src.len % 3 != 0) {
        PyErr_Format(PyExc_ValueError, "hwc_to_chw: src must be contiguous uint8 RGB (a multiple of 3 bytes), "
                     "got format %s, itemsize %zd, %zd bytes", src_format, src.itemsize, src.len);
    } else if (!to_float32 && !to_uint8) {
        PyErr_Format(PyExc_ValueError, "hwc_to_chw: dst must be contiguous float32 or uint8, got format %s, "
                     "itemsize %zd", dst_format, dst.itemsize);
    } else if (dst.len != src.len * dst.itemsize) {
        PyErr_Format(PyExc_ValueError, "hwc_to_chw: dst holds %zd values, src %zd", dst.len / dst.itemsize, src.len);
    } else {
        const uint8_t *rgb = (const uint8_t *)src.buf;
        /* The decode threads call this concurrently: the loop needs no Python object. */
        Py_BEGIN_ALLOW_THREADS
        write_planes(rgb, dst.buf, 0, to_float32, pixels);
        Py_END_ALLOW_THREADS
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    return result;
}

/* Rows of src (N, H, W, 3) into frames of dst (M, 3, H, W), by pairs (src row, dst frame) of an int64
 * buffer: one decoded file's frames into one batch array. Its buffers are held from ``rows_job_open``
 * (which checks them) to ``rows_job_close``; ``rows_job_write`` touches no Python object. */
typedef struct {
    Py_buffer src, dst, pairs;
    Py_ssize_t count, frame_bytes;
    int to_float32;
} RowsJob;

static void rows_job_close(RowsJob *job) {
    PyBuffer_Release(&job->pairs);
    PyBuffer_Release(&job->dst);
    PyBuffer_Release(&job->src);
}

static int rows_job_open(RowsJob *job, PyObject *src_obj, PyObject *dst_obj, PyObject *pairs_obj) {
    if (PyObject_GetBuffer(src_obj, &job->src, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    if (PyObject_GetBuffer(dst_obj, &job->dst, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&job->src);
        return -1;
    }
    if (PyObject_GetBuffer(pairs_obj, &job->pairs, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&job->dst);
        PyBuffer_Release(&job->src);
        return -1;
    }
    Py_buffer *src = &job->src, *dst = &job->dst, *pairs = &job->pairs;
    const char *src_format = src->format ? src->format : "B";
    const char *dst_format = dst->format ? dst->format : "B";
    const char *pairs_format = pairs->format ? pairs->format : "B";
    int to_float32 = dst->itemsize == 4 && dst_format[0] == 'f' && dst_format[1] == '\0';
    int to_uint8 = dst->itemsize == 1 && dst_format[0] == 'B' && dst_format[1] == '\0';
    Py_ssize_t rows = src->ndim == 4 ? src->shape[0] : -1;
    Py_ssize_t frame_bytes = src->ndim == 4 ? src->shape[1] * src->shape[2] * src->shape[3] : 0;
    Py_ssize_t frames = dst->ndim >= 1 && frame_bytes ? dst->len / dst->itemsize / frame_bytes : 0;
    Py_ssize_t count = pairs->len / 8 / 2;
    if (src->itemsize != 1 || src_format[0] != 'B' || src_format[1] != '\0' || src->ndim != 4 || src->shape[3] != 3) {
        PyErr_Format(PyExc_ValueError, "hwc_to_chw_rows: src must be contiguous (N, H, W, 3) uint8, got format %s, "
                     "itemsize %zd, %d dimensions", src_format, src->itemsize, src->ndim);
    } else if (!to_float32 && !to_uint8) {
        PyErr_Format(PyExc_ValueError, "hwc_to_chw_rows: dst must be contiguous float32 or uint8, got format %s, "
                     "itemsize %zd", dst_format, dst->itemsize);
    } else if (frames * frame_bytes * dst->itemsize != dst->len) {
        PyErr_Format(PyExc_ValueError, "hwc_to_chw_rows: dst holds %zd values, not whole frames of %zd",
                     dst->len / dst->itemsize, frame_bytes);
    } else if (pairs->itemsize != 8 || (pairs_format[0] != 'q' && pairs_format[0] != 'l') || pairs->len % 16 != 0) {
        PyErr_Format(PyExc_ValueError, "hwc_to_chw_rows: pairs must be contiguous int64 (src row, dst frame) pairs, "
                     "got format %s, itemsize %zd, %zd bytes", pairs_format, pairs->itemsize, pairs->len);
    } else {
        const int64_t *pair = (const int64_t *)pairs->buf;
        for (Py_ssize_t i = 0; i < count; i++) {
            if (pair[2 * i] < 0 || pair[2 * i] >= rows || pair[2 * i + 1] < 0 || pair[2 * i + 1] >= frames) {
                PyErr_Format(PyExc_IndexError, "hwc_to_chw_rows: pair %zd (src row %lld, dst frame %lld) is outside "
                             "src's %zd rows or dst's %zd frames", i, (long long)pair[2 * i],
                             (long long)pair[2 * i + 1], rows, frames);
                rows_job_close(job);
                return -1;
            }
        }
        job->count = count;
        job->frame_bytes = frame_bytes;
        job->to_float32 = to_float32;
        return 0;
    }
    rows_job_close(job);
    return -1;
}

static void rows_job_write(const RowsJob *job) {
    const uint8_t *rgb = (const uint8_t *)job->src.buf;
    const int64_t *pair = (const int64_t *)job->pairs.buf;
    Py_ssize_t pixels = job->frame_bytes / 3;
    for (Py_ssize_t i = 0; i < job->count; i++) {
        write_planes(rgb + pair[2 * i] * job->frame_bytes, job->dst.buf, pair[2 * i + 1] * job->frame_bytes,
                     job->to_float32, pixels);
    }
}

/* Many frames in one call: one job (see RowsJob). One call per decoded file and batch array releases
 * the GIL once for all of a decode group's frames: with many decode threads every release and retake
 * is a hand-off between threads, which per frame serialises them (docs/benchmarks.md, issue 26). */
static PyObject *hwc_to_chw_rows(PyObject *module, PyObject *args) {
    PyObject *src_obj, *dst_obj, *pairs_obj;
    if (!PyArg_ParseTuple(args, "OOO:hwc_to_chw_rows", &src_obj, &dst_obj, &pairs_obj)) {
        return NULL;
    }
    RowsJob job;
    if (rows_job_open(&job, src_obj, dst_obj, pairs_obj) < 0) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    rows_job_write(&job);
    Py_END_ALLOW_THREADS
    rows_job_close(&job);
    Py_RETURN_NONE;
}

/* A decode group's jobs, every camera's and batch's, in one call that releases the GIL once: each
 * release costs a decode thread a wait behind the other threads to take the GIL back (context
 * switches, measured in docs/benchmarks.md), and a group has a job per camera. All jobs are checked
 * before any frame is written. */
static PyObject *hwc_to_chw_jobs(PyObject *module, PyObject *args) {
    PyObject *jobs_obj;
    if (!PyArg_ParseTuple(args, "O:hwc_to_chw_jobs", &jobs_obj)) {
        return NULL;
    }
    PyObject *jobs_seq = PySequence_Fast(jobs_obj, "hwc_to_chw_jobs: jobs must be a sequence of (src, dst, pairs)");
    if (jobs_seq == NULL) {
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(jobs_seq);
    RowsJob *jobs = PyMem_Calloc(count > 0 ? (size_t)count : 1, sizeof(RowsJob));
    if (jobs == NULL) {
        Py_DECREF(jobs_seq);
        return PyErr_NoMemory();
    }
    Py_ssize_t opened = 0;
    for (; opened < count; opened++) {
        PyObject *item = PySequence_Fast_GET_ITEM(jobs_seq, opened);
        PyObject *src_obj, *dst_obj, *pairs_obj;
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "OOO:hwc_to_chw_jobs", &src_obj, &dst_obj, &pairs_obj)) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_TypeError, "hwc_to_chw_jobs: job %zd must be a tuple (src, dst, pairs)", opened);
            }
            break;
        }
        if (rows_job_open(&jobs[opened], src_obj, dst_obj, pairs_obj) < 0) {
            break;
        }
    }
    if (opened == count) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < count; i++) {
            rows_job_write(&jobs[i]);
        }
        Py_END_ALLOW_THREADS
    }
    for (Py_ssize_t i = 0; i < opened; i++) {
        rows_job_close(&jobs[i]);
    }
    PyMem_Free(jobs);
    Py_DECREF(jobs_seq);
    if (opened < count) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"hwc_to_chw", hwc_to_chw, METH_VARARGS,
     "hwc_to_chw(src, dst): contiguous (H, W, 3) uint8 into contiguous (3, H, W) uint8, or float32 / 255."},
    {"hwc_to_chw_rows", hwc_to_chw_rows, METH_VARARGS,
     "hwc_to_chw_rows(src, dst, pairs): rows of contiguous (N, H, W, 3) uint8 into frames of contiguous "
     "(M, 3, H, W) uint8 or float32 / 255, by int64 (src row, dst frame) pairs."},
    {"hwc_to_chw_jobs", hwc_to_chw_jobs, METH_VARARGS,
     "hwc_to_chw_jobs(jobs): hwc_to_chw_rows(src, dst, pairs) for each (src, dst, pairs) of jobs, every job "
     "checked first, all written with the GIL released once."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_chw_kernel",
    "Decoded RGB frames into planar batch memory (see episodestream/_sample/chw.py).", -1, methods,
};

PyMODINIT_FUNC PyInit__chw_kernel(void) {
    PyObject *m = PyModule_Create(&module);
#ifdef Py_GIL_DISABLED
    /* No state and no Python objects touched without the GIL: safe on free-threaded builds. */
    if (m != NULL && PyUnstable_Module_SetGIL(m, Py_MOD_GIL_NOT_USED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#endif
    return m;
}
