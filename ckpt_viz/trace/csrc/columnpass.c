/* columnpass: passes over one column of a million events, for the app's first page (APP's file).
 *
 * Built by ckpt_viz.cext (NOTE [ C speed-ups ]). Each function has a Python twin that is the reference
 * (ckpt_viz/trace/columnpass.py) and is used where this module is missing. On anything unusual (an
 * argument that is not a list, a value that is not a small int, an index out of range) a function
 * returns None and the Python twin redoes the work, so errors are always the Python ones.
 *
 *   rows(shape, shapes)          i -> how many events before i have the same shape id as i (ids < shapes)
 *   gather(tables, keys, rows)   i -> tables[keys[i]][rows[i]] (each table a list, or bytes)
 *   take(table, where)           i -> table[where[i]]
 *   run_starts(column)           the index of every run's first event (a run: equal consecutive values)
 *   identity_counts(column)      [(value, count), ...] for each distinct object, in order of first sight
 *   run_signatures(starts, n, a, b)  per run (starts[k] up to the next start, or n): the number of the
 *                                first run whose (a[run], b[run]) pair equals its own
 *   shifted(column, k)           i -> column[i] + k (ints that fit in 63 bits)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define MAX_SHAPES 65536  /* shape ids at most this many: more, and Python does it */
#define MAX_DISTINCT 256  /* identity_counts: more distinct objects, and Python does it */

/* A small non-negative int below `limit`, or -1. */
static Py_ssize_t small_index(PyObject *v, Py_ssize_t limit) {
    if (!PyLong_CheckExact(v)) return -1;
    int overflow = 0;
    long x = PyLong_AsLongAndOverflow(v, &overflow);
    if (overflow || x < 0 || x >= limit) {
        PyErr_Clear();
        return -1;
    }
    return (Py_ssize_t)x;
}

static PyObject *rows(PyObject *self, PyObject *args) {
    PyObject *shape;
    Py_ssize_t shapes;
    if (!PyArg_ParseTuple(args, "On", &shape, &shapes)) return NULL;
    if (!PyList_CheckExact(shape) || shapes < 0 || shapes > MAX_SHAPES) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(shape);
    Py_ssize_t *counts = PyMem_Calloc(shapes + 1, sizeof(Py_ssize_t));
    PyObject **ints = PyMem_Calloc(n + 1, sizeof(PyObject *));  /* one int object per row number, shared */
    PyObject *out = counts == NULL || ints == NULL ? NULL : PyList_New(n);
    Py_ssize_t made = 0, i = 0;
    if (out != NULL && PyList_GET_SIZE(shape) != n)  /* PyList_New can collect: a finalizer changed shape */
        n = -1;  /* not sure: Python does it */
    for (; out != NULL && i < n; i++) {
        Py_ssize_t k = small_index(PyList_GET_ITEM(shape, i), shapes);
        if (k < 0) break;  /* an unusual id: Python redoes it */
        Py_ssize_t row = counts[k]++;
        if (ints[row] == NULL) {
            if ((ints[row] = PyLong_FromSsize_t(row)) == NULL) break;
            made = row + 1 > made ? row + 1 : made;
        }
        Py_INCREF(ints[row]);
        PyList_SET_ITEM(out, i, ints[row]);  /* steals the reference just taken */
    }
    for (Py_ssize_t j = 0; j < made; j++) Py_XDECREF(ints[j]);  /* the cache's own references */
    int failed = PyErr_Occurred() != NULL || counts == NULL || ints == NULL;
    PyMem_Free(ints);
    PyMem_Free(counts);
    if (out != NULL && i == n) return out;
    if (out != NULL) {  /* the items not yet set are NULL: the list frees only those it holds */
        Py_DECREF(out);
    }
    if (failed) return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *gather(PyObject *self, PyObject *args) {
    PyObject *tables, *keys, *where;
    if (!PyArg_ParseTuple(args, "OOO", &tables, &keys, &where)) return NULL;
    if (!PyList_CheckExact(tables) || !PyList_CheckExact(keys) || !PyList_CheckExact(where) ||
        PyList_GET_SIZE(keys) != PyList_GET_SIZE(where))
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    /* Read only after PyList_New, which can collect (a finalizer may have changed any of the lists). */
    Py_ssize_t m = PyList_GET_SIZE(tables);
    int usual = PyList_GET_SIZE(keys) == n && PyList_GET_SIZE(where) == n;
    for (Py_ssize_t t = 0; usual && t < m; t++) {  /* lists, or bytes (read as ints) */
        PyObject *table = PyList_GET_ITEM(tables, t);
        usual = PyList_CheckExact(table) || PyBytes_CheckExact(table);
    }
    if (!usual) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t k = small_index(PyList_GET_ITEM(keys, i), m);
        PyObject *table = k < 0 ? NULL : PyList_GET_ITEM(tables, k);
        int bytes = table != NULL && PyBytes_CheckExact(table);
        Py_ssize_t size = table == NULL ? 0 : bytes ? PyBytes_GET_SIZE(table) : PyList_GET_SIZE(table);
        Py_ssize_t j = table == NULL ? -1 : small_index(PyList_GET_ITEM(where, i), size);
        if (j < 0) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        PyObject *v;
        if (bytes) {
            v = PyLong_FromLong((unsigned char)PyBytes_AS_STRING(table)[j]);  /* as bytes[j] reads */
            if (v == NULL) {
                Py_DECREF(out);
                return NULL;
            }
        } else {
            v = PyList_GET_ITEM(table, j);
            Py_INCREF(v);
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

static PyObject *take(PyObject *self, PyObject *args) {
    PyObject *table, *where;
    if (!PyArg_ParseTuple(args, "OO", &table, &where)) return NULL;
    if (!PyList_CheckExact(table) || !PyList_CheckExact(where)) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(where);
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    Py_ssize_t m = PyList_GET_SIZE(table);  /* after PyList_New, which can collect (a finalizer may change them) */
    if (PyList_GET_SIZE(where) != n) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t j = small_index(PyList_GET_ITEM(where, i), m);
        if (j < 0) {  /* a negative index, out of range or not an int: Python does it */
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        PyObject *v = PyList_GET_ITEM(table, j);
        Py_INCREF(v);
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

static PyObject *run_starts(PyObject *self, PyObject *column) {
    if (!PyList_CheckExact(column)) Py_RETURN_NONE;
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    PyObject *last = NULL;  /* borrowed: the list is not changed while we walk it (no Python code runs ...) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(column); i++) {
        PyObject *v = PyList_GET_ITEM(column, i);
        int same = 0;
        if (last != NULL) {
            if (v == last) same = 1;
            else if (v != Py_None && !PyLong_CheckExact(v)) same = -2;  /* its own __eq__ may say it equals */
            else if (last != Py_None && !PyLong_CheckExact(last)) same = -2;  /* ... None: Python does it */
            else if ((v == Py_None) != (last == Py_None)) same = 0;
            else same = PyObject_RichCompareBool(v, last, Py_EQ);  /* two exact ints */
            if (same == -2) {  /* but for ints and None: any other value, and Python does it */
                Py_DECREF(out);
                Py_RETURN_NONE;
            }
            if (same < 0) {
                PyErr_Clear();
                Py_DECREF(out);
                Py_RETURN_NONE;
            }
        }
        if (!same) {
            PyObject *at = PyLong_FromSsize_t(i);
            if (at == NULL || PyList_Append(out, at) < 0) {
                Py_XDECREF(at);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(at);
        }
        last = v;
    }
    return out;
}

static PyObject *identity_counts(PyObject *self, PyObject *column) {
    if (!PyList_CheckExact(column)) Py_RETURN_NONE;
    PyObject *seen[MAX_DISTINCT], *out = NULL;
    Py_ssize_t counts[MAX_DISTINCT];
    Py_ssize_t distinct = 0, last = -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(column); i++) {
        PyObject *v = PyList_GET_ITEM(column, i);
        if (last >= 0 && seen[last] == v) {  /* the same object as the last one: the common case */
            counts[last]++;
            continue;
        }
        Py_ssize_t k = 0;
        while (k < distinct && seen[k] != v) k++;
        if (k == distinct) {
            if (distinct == MAX_DISTINCT) {
                out = Py_NewRef(Py_None);
                goto done;
            }
            seen[distinct] = Py_NewRef(v);  /* held: PyList_New and the pairs below can collect (a finalizer) */
            counts[distinct++] = 0;
        }
        counts[k]++;
        last = k;
    }
    out = PyList_New(distinct);
    for (Py_ssize_t k = 0; out != NULL && k < distinct; k++) {
        PyObject *pair = Py_BuildValue("(On)", seen[k], counts[k]);  /* a new reference to the value */
        if (pair == NULL)
            Py_CLEAR(out);  /* the items not yet set are NULL: the list frees only those it holds */
        else
            PyList_SET_ITEM(out, k, pair);
    }
done:
    for (Py_ssize_t k = 0; k < distinct; k++) Py_DECREF(seen[k]);
    return out;
}

/* Every item of `list` below `n` as a 64-bit int, into `out`; 0: an item that is not an exact int that fits. */
static int read_ints(PyObject *list, Py_ssize_t n, long long *out) {
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(list, i);
        if (!PyLong_CheckExact(v)) return 0;
        int overflow = 0;
        out[i] = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow || (out[i] == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

/* run_signatures: exact ints compare equal exactly when their values do, so two runs' (a, b) tuples are equal
 * exactly when their lengths and their 64-bit values are. Runs are found again through an open-addressing
 * table of each distinct pair's first run. */
static PyObject *run_signatures(PyObject *self, PyObject *args) {
    PyObject *starts, *a, *b;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OnOO", &starts, &n, &a, &b)) return NULL;
    if (!PyList_CheckExact(starts) || !PyList_CheckExact(a) || !PyList_CheckExact(b) || n < 0 ||
        PyList_GET_SIZE(a) < n || PyList_GET_SIZE(b) < n) Py_RETURN_NONE;
    Py_ssize_t runs = PyList_GET_SIZE(starts), size = 2;
    while (size < 2 * runs) size *= 2;
    Py_ssize_t *at = PyMem_Calloc(runs + 1, sizeof(Py_ssize_t));   /* run k: [at[k], at[k + 1]) */
    long long *x = PyMem_Calloc(n + 1, sizeof(long long)), *y = PyMem_Calloc(n + 1, sizeof(long long));
    Py_ssize_t *table = PyMem_Malloc(size * sizeof(Py_ssize_t));   /* a run, or -1 */
    Py_ssize_t *id = PyMem_Calloc(runs + 1, sizeof(Py_ssize_t));   /* run k -> its pair's first run */
    PyObject **ints = PyMem_Calloc(runs + 1, sizeof(PyObject *));  /* one int object per first run */
    PyObject *out = NULL;
    int usual = at != NULL && x != NULL && y != NULL && table != NULL && id != NULL && ints != NULL;
    for (Py_ssize_t k = 0; usual && k < runs; k++) {  /* starts: exact ints, increasing, below n */
        Py_ssize_t s = small_index(PyList_GET_ITEM(starts, k), n);
        usual = s >= 0 && (k == 0 || s > at[k - 1]);
        at[k] = s;
    }
    if (usual) {
        at[runs] = n;
        usual = read_ints(a, n, x) && read_ints(b, n, y);
    }
    if (usual) {
        for (Py_ssize_t j = 0; j < size; j++) table[j] = -1;
        for (Py_ssize_t k = 0; k < runs; k++) {
            Py_ssize_t s = at[k], len = at[k + 1] - s;
            unsigned long long h = 1469598103934665603ULL ^ (unsigned long long)len;
            for (Py_ssize_t i = s; i < s + len; i++) {
                h = (h ^ (unsigned long long)x[i]) * 1099511628211ULL;
                h = (h ^ (unsigned long long)y[i]) * 1099511628211ULL;
            }
            Py_ssize_t j = (Py_ssize_t)(h & (unsigned long long)(size - 1));
            for (;; j = (j + 1) & (size - 1)) {
                Py_ssize_t m = table[j];
                if (m < 0) {  /* a pair not seen before: its own number */
                    table[j] = k;
                    id[k] = k;
                    break;
                }
                Py_ssize_t t = at[m];
                if (at[m + 1] - t == len && memcmp(x + t, x + s, len * sizeof(long long)) == 0 &&
                    memcmp(y + t, y + s, len * sizeof(long long)) == 0) {
                    id[k] = id[m];
                    break;
                }
            }
        }
        out = PyList_New(runs);
    }
    for (Py_ssize_t k = 0; out != NULL && k < runs; k++) {
        PyObject **v = &ints[id[k]];
        if (*v == NULL && (*v = PyLong_FromSsize_t(id[k])) == NULL) {
            Py_CLEAR(out);  /* the items not yet set are NULL: the list frees only those it holds */
            break;
        }
        Py_INCREF(*v);
        PyList_SET_ITEM(out, k, *v);
    }
    for (Py_ssize_t j = 0; ints != NULL && j < runs; j++) Py_XDECREF(ints[j]);  /* the cache's references */
    int failed = usual && out == NULL;  /* out of memory, with an error set */
    int no_memory = !(at != NULL && x != NULL && y != NULL && table != NULL && id != NULL && ints != NULL);
    PyMem_Free(at); PyMem_Free(x); PyMem_Free(y); PyMem_Free(table); PyMem_Free(id); PyMem_Free(ints);
    if (no_memory) return PyErr_NoMemory();
    if (failed) return NULL;
    if (out == NULL) Py_RETURN_NONE;
    return out;
}

static PyObject *shifted(PyObject *self, PyObject *args) {
    PyObject *column;
    long long k;
    if (!PyArg_ParseTuple(args, "OL", &column, &k)) return NULL;
    const long long limit = 1LL << 62;  /* the values and k below it in size: a sum cannot overflow */
    if (!PyList_CheckExact(column) || k >= limit || k <= -limit) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(column);
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    if (PyList_GET_SIZE(column) != n) {  /* PyList_New can collect: a finalizer changed the column */
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(column, i);
        int overflow = 0;
        long long x = PyLong_CheckExact(v) ? PyLong_AsLongLongAndOverflow(v, &overflow) : limit;
        if (overflow || x >= limit || x <= -limit) {  /* not a plain int: Python does it */
            PyErr_Clear();
            Py_DECREF(out);  /* the items not yet set are NULL: the list frees only those it holds */
            Py_RETURN_NONE;
        }
        PyObject *sum = PyLong_FromLongLong(x + k);
        if (sum == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, sum);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"rows", rows, METH_VARARGS, "i -> how many events before i have shape[i]; None: let Python do it"},
    {"gather", gather, METH_VARARGS, "i -> tables[keys[i]][rows[i]]; None: let Python do it"},
    {"take", take, METH_VARARGS, "i -> table[where[i]]; None: let Python do it"},
    {"run_starts", run_starts, METH_O, "the first index of each run of equal values; None: let Python do it"},
    {"identity_counts", identity_counts, METH_O, "[(object, count)] in order of first sight; None: Python"},
    {"run_signatures", run_signatures, METH_VARARGS, "per run, its (a, b) slices' number; None: Python"},
    {"shifted", shifted, METH_VARARGS, "i -> column[i] + k; None: let Python do it"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "columnpass", NULL, -1, methods};

PyMODINIT_FUNC PyInit_columnpass(void) { return PyModule_Create(&module); }
