/* Token ids from a Python list as little-endian int32, for the block hashes (hashing.py).
 *
 * array("I", list) spends ~10 ns a token in generic per-item machinery; this loop reads each
 * exact int directly. It accepts only the plain case (exact ints in [0, 2**31 - 1]) and returns
 * the index of the first item it does not, so the caller's checked Python path handles (and
 * names) everything else: bools, int subclasses, negative or too large ids, non-ints.
 * Called through ctypes.PyDLL: the GIL is held throughout.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Items [start, start + n) of seq into out[0, n); -1 when all are plain ids, else the offset
 * (from start) of the first that is not. The caller clamps start and n to the sequence. */
Py_ssize_t dic_list_to_i32(PyObject *seq, Py_ssize_t start, Py_ssize_t n, int32_t *out) {
    if (!PyList_CheckExact(seq) && !PyTuple_CheckExact(seq))
        return 0;
    if (start < 0 || n < 0 || start + n > PySequence_Fast_GET_SIZE(seq))
        return 0;
    PyObject **items = PySequence_Fast_ITEMS(seq) + start;
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject *v = items[i];
        if (!PyLong_CheckExact(v))
            return i;
        long x;
#if PY_VERSION_HEX >= 0x030C0000
        if (PyUnstable_Long_IsCompact((PyLongObject *)v)) {
            x = (long)PyUnstable_Long_CompactValue((PyLongObject *)v);
        } else
#else
        /* 3.10/3.11: an int of one 30-bit digit (ids below 2**30) is read in place. */
        if (Py_SIZE(v) == 0) {
            x = 0;
        } else if (Py_SIZE(v) == 1) {
            x = (long)((PyLongObject *)v)->ob_digit[0];
        } else
#endif
        {
            int overflow = 0;
            x = PyLong_AsLongAndOverflow(v, &overflow);
            if (overflow)
                return i;
        }
        if (x < 0 || x > INT32_MAX)
            return i;
        out[i] = (int32_t)x; /* x86/ARM Linux are little-endian; big-endian hosts skip this */
    }
    return -1;
}
