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

/* Many frames in one call: rows of src (N, H, W, 3) into frames of dst (M, 3, H, W), by pairs
 * (src row, dst frame) of an int64 buffer. One call per decoded file and batch array releases the
 * GIL once for all of a decode group's frames: with many decode threads every release and retake is a
 * hand-off between threads, which per frame serialises them (docs/benchmarks.md, issue 26). */
static PyObject *hwc_to_chw_rows(PyObject *module, PyObject *args) {
    PyObject *src_obj, *dst_obj, *pairs_obj;
    if (!PyArg_ParseTuple(args, "OOO:hwc_to_chw_rows", &src_obj, &dst_obj, &pairs_obj)) {
        return NULL;
    }
    Py_buffer src, dst, pairs;
    if (PyObject_GetBuffer(src_obj, &src, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(dst_obj, &dst, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (PyObject_GetBuffer(pairs_obj, &pairs, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&dst);
        PyBuffer_Release(&src);
        return NULL;
    }
    PyObject *result = NULL;
    const char *src_format = src.format ? src.format : "B";
    const char *dst_format = dst.format ? dst.format : "B";
    const char *pairs_format = pairs.format ? pairs.format : "B";
    int to_float32 = dst.itemsize == 4 && dst_format[0] == 'f' && dst_format[1] == '\0';
    int to_uint8 = dst.itemsize == 1 && dst_format[0] == 'B' && dst_format[1] == '\0';
    Py_ssize_t rows = src.ndim == 4 ? src.shape[0] : -1;
    Py_ssize_t frame_bytes = src.ndim == 4 ? src.shape[1] * src.shape[2] * src.shape[3] : 0;
    Py_ssize_t frames = dst.ndim >= 1 && frame_bytes ? dst.len / dst.itemsize / frame_bytes : 0;
    Py_ssize_t count = pairs.len / 8 / 2;
    if (src.itemsize != 1 || src_format[0] != 'B' || src_format[1] != '\0' || src.ndim != 4 || src.shape[3] != 3) {
        PyErr_Format(PyExc_ValueError, "hwc_to_chw_rows: src must be contiguous (N, H, W, 3) uint8, got format %s, "
                     "itemsize %zd, %d dimensions", src_format, src.itemsize, src.ndim);
    } else if (!to_float32 && !to_uint8) {
        PyErr_Format(PyExc_ValueError, "hwc_to_chw_rows: dst must be contiguous float32 or uint8, got format %s, "
                     "itemsize %zd", dst_format, dst.itemsize);
    } else if (frames * frame_bytes * dst.itemsize != dst.len) {
        PyErr_Format(PyExc_ValueError, "hwc_to_chw_rows: dst holds %zd values, not whole frames of %zd",
                     dst.len / dst.itemsize, frame_bytes);
    } else if (pairs.itemsize != 8 || (pairs_format[0] != 'q' && pairs_format[0] != 'l') || pairs.len % 16 != 0) {
        PyErr_Format(PyExc_ValueError, "hwc_to_chw_rows: pairs must be contiguous int64 (src row, dst frame) pairs, "
                     "got format %s, itemsize %zd, %zd bytes", pairs_format, pairs.itemsize, pairs.len);
    } else {
        const int64_t *pair = (const int64_t *)pairs.buf;
        Py_ssize_t bad = -1;
        for (Py_ssize_t i = 0; i < count; i++) {
            if (pair[2 * i] < 0 || pair[2 * i] >= rows || pair[2 * i + 1] < 0 || pair[2 * i + 1] >= frames) {
                bad = i;
                break;
            }
        }
        if (bad >= 0) {
            PyErr_Format(PyExc_IndexError, "hwc_to_chw_rows: pair %zd (src row %lld, dst frame %lld) is outside "
                         "src's %zd rows or dst's %zd frames", bad, (long long)pair[2 * bad],
                         (long long)pair[2 * bad + 1], rows, frames);
        } else {
            const uint8_t *rgb = (const uint8_t *)src.buf;
            Py_ssize_t pixels = frame_bytes / 3;
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t i = 0; i < count; i++) {
                write_planes(rgb + pair[2 * i] * frame_bytes, dst.buf, pair[2 * i + 1] * frame_bytes, to_float32,
                             pixels);
            }
            Py_END_ALLOW_THREADS
            result = Py_None;
            Py_INCREF(result);
        }
    }
    PyBuffer_Release(&pairs);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    return result;
}

static PyMethodDef methods[] = {
    {"hwc_to_chw", hwc_to_chw, METH_VARARGS,
     "hwc_to_chw(src, dst): contiguous (H, W, 3) uint8 into contiguous (3, H, W) uint8, or float32 / 255."},
    {"hwc_to_chw_rows", hwc_to_chw_rows, METH_VARARGS,
     "hwc_to_chw_rows(src, dst, pairs): rows of contiguous (N, H, W, 3) uint8 into frames of contiguous "
     "(M, 3, H, W) uint8 or float32 / 255, by int64 (src row, dst frame) pairs."},
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
