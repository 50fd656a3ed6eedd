/* load_checks: one C pass over a long column of a trace document, answering "fine" or "look again".

   ckpt_viz.trace.fastcheck wraps these (see its NOTE [ Checks in C ]). Each function returns True
   only when the Python check it stands in front of would pass; False means "not sure": the caller
   then runs the Python check, which raises its own message or passes. So an error is always the
   Python path's error, word for word, and these functions never raise for a bad value (only for
   wrong arguments, a TypeError). They read the objects only: no reference is taken or dropped
   except on the results (the counts list of index_counts).

   Exact types throughout, as the Python checks test `type(v) is int`: a bool is not an int, a
   subclass of int (none comes out of a JSON parser) makes a column "not sure".
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* v as a long long in *out; 0 when v does not fit (then it is out of any range we test). */
static int as_i64(PyObject *v, long long *out) {
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = x;
    return 1;
}

static int take_list(PyObject *obj, const char *name) {
    if (!PyList_CheckExact(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a list", name);
        return 0;
    }
    return 1;
}

/* ints(column, low, high_inclusive, none_ok): every item an int with low <= v <= high (None too when
   none_ok). Stands for check_types(column, {int} or {int, None}) then check_range(column, low, high + 1). */
static PyObject *ints(PyObject *self, PyObject *args) {
    PyObject *column;
    long long low, high;
    int none_ok;
    if (!PyArg_ParseTuple(args, "OLLp", &column, &low, &high, &none_ok) || !take_list(column, "ints"))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(column);
    PyObject **items = PySequence_Fast_ITEMS(column);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = items[i];
        long long x;
        if (v == Py_None && none_ok)
            continue;
        if (!PyLong_CheckExact(v) || !as_i64(v, &x) || x < low || x > high)
            Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* index_counts(column, size): how many times each index 0 .. size - 1 occurs, as a list of size ints;
   None unless every item is an int from 0 to size - 1. Stands for _check_indexes(..., counted=True). */
static PyObject *index_counts(PyObject *self, PyObject *args) {
    PyObject *column;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "On", &column, &size) || !take_list(column, "index_counts"))
        return NULL;
    if (size < 0 || size > PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(Py_ssize_t) - 1)
        Py_RETURN_NONE;
    Py_ssize_t *counts = PyMem_Calloc((size_t)size + 1, sizeof(Py_ssize_t));
    if (counts == NULL)
        return PyErr_NoMemory();
    Py_ssize_t n = PyList_GET_SIZE(column);
    PyObject **items = PySequence_Fast_ITEMS(column);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = items[i];
        long long x;
        if (!PyLong_CheckExact(v) || !as_i64(v, &x) || x < 0 || x >= size) {
            PyMem_Free(counts);
            Py_RETURN_NONE;
        }
        counts[x]++;
    }
    PyObject *result = PyList_New(size);
    for (Py_ssize_t k = 0; result != NULL && k < size; k++) {
        PyObject *count = PyLong_FromSsize_t(counts[k]);
        if (count == NULL) {
            Py_CLEAR(result);
            break;
        }
        PyList_SET_ITEM(result, k, count); /* steals the reference */
    }
    PyMem_Free(counts);
    return result;
}

/* times(deltas): every item an int of 0 or more and their sum below 2**63. Stands for check_types(deltas,
   {int}) then check_times (whose quick test is exactly this; other columns it checks one time at a time). */
static PyObject *times(PyObject *self, PyObject *column) {
    if (!PyList_CheckExact(column)) { /* the int64 buffer split_times made (an array('q')) */
        Py_buffer view;
        if (PyObject_GetBuffer(column, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
            return NULL;
        int fine = view.format != NULL && strcmp(view.format, "q") == 0 && view.itemsize == 8;
        long long sum = 0;
        const long long *x = view.buf;
        for (Py_ssize_t i = 0; fine && i < view.len / 8; i++) {
            fine = x[i] >= 0 && x[i] <= LLONG_MAX - sum;
            sum += fine ? x[i] : 0;
        }
        PyBuffer_Release(&view);
        return PyBool_FromLong(fine);
    }
    Py_ssize_t n = PyList_GET_SIZE(column);
    PyObject **items = PySequence_Fast_ITEMS(column);
    long long sum = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        long long x;
        if (!PyLong_CheckExact(items[i]) || !as_i64(items[i], &x) || x < 0 || x > LLONG_MAX - sum)
            Py_RETURN_FALSE;
        sum += x;
    }
    Py_RETURN_TRUE;
}

/* runs(runs, count): every item an int from 1 to count, adding up to count. Stands for check_runs' checks of
   the run lengths (types, range, sum). */
static PyObject *runs(PyObject *self, PyObject *args) {
    PyObject *column, *count_obj;
    if (!PyArg_ParseTuple(args, "OO", &column, &count_obj) || !take_list(column, "runs"))
        return NULL;
    long long count, sum = 0;
    if (!PyLong_CheckExact(count_obj) || !as_i64(count_obj, &count))
        Py_RETURN_FALSE;
    Py_ssize_t n = PyList_GET_SIZE(column);
    PyObject **items = PySequence_Fast_ITEMS(column);
    for (Py_ssize_t i = 0; i < n; i++) {
        long long x;
        if (!PyLong_CheckExact(items[i]) || !as_i64(items[i], &x) || x < 1 || x > count || x > count - sum)
            Py_RETURN_FALSE;
        sum += x;
    }
    return PyBool_FromLong(sum == count);
}

enum { K_INT = 1, K_NONE = 2, K_STR = 4, K_BOOL = 8, K_FLOAT = 16, K_DICT = 32, K_LIST = 64 };

/* kinds(column, mask): every item of an exact type the mask allows (K_* above); a float only when finite.
   Stands for check_types(column, <the types>) and, for floats, check_numbers. */
static PyObject *kinds(PyObject *self, PyObject *args) {
    PyObject *column;
    int mask;
    if (!PyArg_ParseTuple(args, "Oi", &column, &mask) || !take_list(column, "kinds"))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(column);
    PyObject **items = PySequence_Fast_ITEMS(column);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = items[i];
        PyTypeObject *t = Py_TYPE(v);
        int kind = t == &PyLong_Type ? K_INT : v == Py_None ? K_NONE : t == &PyUnicode_Type ? K_STR
                 : t == &PyBool_Type ? K_BOOL : t == &PyFloat_Type ? K_FLOAT : t == &PyDict_Type ? K_DICT
                 : t == &PyList_Type ? K_LIST : 0;
        if (!(kind & mask) || (kind == K_FLOAT && !isfinite(PyFloat_AS_DOUBLE(v))))
            Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* finite(column): no item is a float that is NaN or infinite. Stands for check_numbers. */
static PyObject *finite_column(PyObject *self, PyObject *column) {
    if (!take_list(column, "finite"))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(column);
    PyObject **items = PySequence_Fast_ITEMS(column);
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyFloat_CheckExact(items[i]) && !isfinite(PyFloat_AS_DOUBLE(items[i])))
            Py_RETURN_FALSE;
    Py_RETURN_TRUE;
}

/* by_stage(stages, categories): every item a dict of dicts, each of those keyed by strings in the set
   `categories` with ints from 0 to 2**63-1. Stands for check_types(stages, {dict}) and _check_by_stage.
   The dicts are borrowed: the set must hold exact strings only (fastcheck checks), so that a lookup runs no
   Python code (an __eq__ that changed the dicts walked here would have them read after they are freed). */
static PyObject *by_stage(PyObject *self, PyObject *args) {
    PyObject *column, *categories;
    if (!PyArg_ParseTuple(args, "OO", &column, &categories) || !take_list(column, "by_stage"))
        return NULL;
    if (!PyAnySet_CheckExact(categories)) {
        PyErr_SetString(PyExc_TypeError, "by_stage: expected a set of categories");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(column);
    PyObject **items = PySequence_Fast_ITEMS(column);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *stages = items[i], *stage, *reading;
        Py_ssize_t at = 0;
        if (!PyDict_CheckExact(stages))
            Py_RETURN_FALSE;
        while (PyDict_Next(stages, &at, &stage, &reading)) {
            PyObject *category, *nbytes;
            Py_ssize_t at2 = 0;
            if (!PyDict_CheckExact(reading))
                Py_RETURN_FALSE;
            while (PyDict_Next(reading, &at2, &category, &nbytes)) {
                long long x;
                if (!PyUnicode_CheckExact(category) || !PyLong_CheckExact(nbytes) || !as_i64(nbytes, &x) || x < 0)
                    Py_RETURN_FALSE;
                int known = PySet_Contains(categories, category);
                if (known != 1) {
                    PyErr_Clear(); /* -1: cannot happen for a str, but "not sure" is always safe */
                    Py_RETURN_FALSE;
                }
            }
        }
    }
    Py_RETURN_TRUE;
}

/* unpack(values, runs): the list of values[i] repeated runs[i] times; None unless both are lists of one length
   and every run an int of 0 or more. Stands for unpack_runs (one pass, no iterator per run). */
static PyObject *unpack(PyObject *self, PyObject *args) {
    PyObject *values, *lengths;
    if (!PyArg_ParseTuple(args, "OO", &values, &lengths) || !take_list(values, "unpack") || !take_list(lengths, "unpack"))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(values), total = 0;
    if (PyList_GET_SIZE(lengths) != n)
        Py_RETURN_NONE;
    PyObject **items = PySequence_Fast_ITEMS(values), **runs = PySequence_Fast_ITEMS(lengths);
    for (Py_ssize_t i = 0; i < n; i++) {
        long long x;
        if (!PyLong_CheckExact(runs[i]) || !as_i64(runs[i], &x) || x < 0 || x > PY_SSIZE_T_MAX / 8 - total)
            Py_RETURN_NONE;
        total += (Py_ssize_t)x;
    }
    PyObject *result = PyList_New(total);
    if (result == NULL)
        return NULL;
    /* PyList_New can collect, and a finalizer change either list: read them again, and fill no more than total
       places (a run changed meanwhile, or any other change: None, and unpack_runs does it). */
    Py_ssize_t left = total;
    int usual = PyList_GET_SIZE(values) == n && PyList_GET_SIZE(lengths) == n;
    items = PySequence_Fast_ITEMS(values), runs = PySequence_Fast_ITEMS(lengths);
    PyObject **to = PySequence_Fast_ITEMS(result);
    for (Py_ssize_t i = 0; usual && i < n; i++) {
        PyObject *v = items[i];
        long long run;
        usual = PyLong_CheckExact(runs[i]) && as_i64(runs[i], &run) && run >= 0 && run <= left;
        for (Py_ssize_t j = 0; usual && j < run; j++) {
            Py_INCREF(v); /* one reference per place it fills */
            *to++ = v;
        }
        left -= usual ? (Py_ssize_t)run : 0;
    }
    if (!usual || left != 0) { /* the places not filled are NULL: the list frees only those it holds */
        Py_DECREF(result);
        Py_RETURN_NONE;
    }
    return result;
}

/* ---------------------------------------------------------------- find_ints
   The document's events.columns.t_ns_delta and context (a million ints each) read here instead of by the
   JSON parser: NOTE [ Checks in C ], rule 4, in ckpt_viz/trace/fastcheck.py.
   Only the part of the text before the column is scanned (its structure: strings, nesting); the column
   must be a JSON array of integers that fit in 64 bits, else NULL ("not sure", the caller parses as usual). */

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

/* p at an opening quote: the position after the closing one (a quote after an even run of backslashes). */
static const char *skip_string(const char *p, const char *end) {
    const char *content = ++p;
    while (p < end) {
        const char *q = memchr(p, '"', (size_t)(end - p));
        if (q == NULL)
            return NULL;
        const char *r = q;
        while (r > content && r[-1] == '\\')
            r--;
        if ((q - r) % 2 == 0)
            return q + 1;
        p = q + 1;
    }
    return NULL;
}

/* The position after the JSON value at p (exact for valid JSON; a parser checks the whole text later). */
static const char *skip_value(const char *p, const char *end) {
    int depth = 0;
    do {
        p = skip_ws(p, end);
        if (p >= end)
            return NULL;
        char c = *p;
        if (c == '"') {
            if ((p = skip_string(p, end)) == NULL)
                return NULL;
        } else if (c == '[' || c == '{') {
            depth++, p++;
        } else if (c == ']' || c == '}' || c == ',' || c == ':') {
            if (depth == 0)
                return NULL;
            depth -= c == ']' || c == '}';
            p++;
        } else {
            while (p < end && *p != ',' && *p != ']' && *p != '}' && *p != ' ' && *p != '\n' && *p != '\t'
                   && *p != '\r' && *p != ':' && *p != '[' && *p != '{' && *p != '"')
                p++;
        }
    } while (depth > 0);
    return p;
}

typedef struct { long long *items; Py_ssize_t n, cap; } Ints;

/* p at '[': a JSON array of integers into out; the position after ']', or NULL. */
static const char *read_ints(const char *p, const char *end, Ints *out) {
    p = skip_ws(p + 1, end);
    if (p < end && *p == ']')
        return p + 1;
    for (;;) {
        int negative = p < end && *p == '-';
        p += negative;
        if (p >= end || *p < '0' || *p > '9')
            return NULL;
        unsigned long long x = 0;
        if (*p == '0') {
            p++;
        } else {
            for (; p < end && *p >= '0' && *p <= '9'; p++) {
                if (x > (ULLONG_MAX - 9) / 10)
                    return NULL;
                x = x * 10 + (unsigned)(*p - '0');
            }
        }
        if (x > (unsigned long long)LLONG_MAX || (p < end && (*p == '.' || *p == 'e' || *p == 'E'
                                                              || (*p >= '0' && *p <= '9'))))
            return NULL; /* too big, a fraction or exponent (a float), or a leading zero (not JSON) */
        if (out->n == out->cap)
            return NULL; /* cannot happen: find made room for every int before the first ']' */
        out->items[out->n++] = negative ? -(long long)x : (long long)x;
        p = skip_ws(p, end);
        if (p < end && *p == ',') {
            p = skip_ws(p + 1, end);
            continue;
        }
        return p < end && *p == ']' ? p + 1 : NULL;
    }
}

static const char *const PATH[] = {"events", "columns"};

/* A column of events.columns to read as ints: its name, its ints, where its array starts and stops. */
typedef struct { const char *name; Ints ints; const char *start, *stop; int tried; } Wanted;

/* p at '[': read the array into want (room for every int it can hold, at least 2 bytes each but the last). */
static const char *read_wanted(const char *p, const char *end, Wanted *want) {
    const char *close = memchr(p, ']', (size_t)(end - p));
    if (close == NULL)
        return NULL;
    want->ints.cap = (close - p) / 2 + 1;
    if ((want->ints.items = PyMem_Malloc((size_t)want->ints.cap * sizeof(long long))) == NULL)
        return NULL;
    const char *stop = read_ints(p, end, &want->ints);
    if (stop != NULL)
        want->start = p, want->stop = stop;
    return stop;
}

/* p at the value of the object at PATH[level - 1] (the document when level is 0): descend to PATH[level]; in
   events.columns (level 2) read each wanted column that is an array of ints. How many were looked at. */
static int find(const char *p, const char *end, int level, Wanted *wanted, int n_wanted) {
    int found = 0;
    p = skip_ws(p, end);
    if (p >= end || *p != '{')
        return 0;
    p = skip_ws(p + 1, end);
    while (p < end && *p == '"' && found < n_wanted) {
        const char *key = p + 1, *after = skip_string(p, end);
        if (after == NULL)
            return found;
        size_t length = (size_t)(after - 1 - key);
        p = skip_ws(after, end);
        if (p >= end || *p != ':')
            return found;
        p = skip_ws(p + 1, end);
        if (level < 2) {
            if (length == strlen(PATH[level]) && memcmp(key, PATH[level], length) == 0)
                return find(p, end, level + 1, wanted, n_wanted);
        } else {
            for (int w = 0; w < n_wanted; w++) {
                if (!wanted[w].tried && length == strlen(wanted[w].name) && memcmp(key, wanted[w].name, length) == 0
                    && p < end && *p == '[') {
                    wanted[w].tried = 1; /* once: a repeated key is the parser's to resolve (the placeholder rule) */
                    const char *stop = read_wanted(p, end, &wanted[w]);
                    if (stop != NULL) {
                        found++, p = stop;
                        goto next;
                    }
                    PyMem_Free(wanted[w].ints.items); /* not all ints: the parser reads this column */
                    wanted[w].ints.items = NULL, wanted[w].ints.n = 0;
                    found++; /* done with it either way */
                    break;
                }
            }
        }
        if ((p = skip_value(p, end)) == NULL)
            return found;
    next:
        p = skip_ws(p, end);
        if (p >= end || *p != ',')
            return found;
        p = skip_ws(p + 1, end);
    }
    return found;
}

/* find_ints(text): {name: (start, stop, the ints as int64 bytes)} for events.columns.t_ns_delta and
   events.columns.context, each where it is a JSON array of ints that fit in 64 bits. */
static PyObject *find_ints(PyObject *self, PyObject *arg) {
    Py_buffer text;
    if (PyObject_GetBuffer(arg, &text, PyBUF_SIMPLE) < 0)
        return NULL;
    const char *begin = text.buf, *end = begin + text.len;
    Wanted wanted[2] = {{"t_ns_delta", {NULL, 0, 0}, NULL, NULL, 0}, {"context", {NULL, 0, 0}, NULL, NULL, 0}};
    find(begin, end, 0, wanted, 2);
    PyObject *result = PyDict_New();
    for (int w = 0; result != NULL && w < 2; w++) {
        if (wanted[w].start == NULL)
            continue;
        PyObject *found = Py_BuildValue("nny#", (Py_ssize_t)(wanted[w].start - begin), (Py_ssize_t)(wanted[w].stop - begin),
                                        (const char *)wanted[w].ints.items,
                                        wanted[w].ints.n * (Py_ssize_t)sizeof(long long));
        if (found == NULL || PyDict_SetItemString(result, wanted[w].name, found) < 0)
            Py_CLEAR(result);
        Py_XDECREF(found);
    }
    for (int w = 0; w < 2; w++)
        PyMem_Free(wanted[w].ints.items);
    PyBuffer_Release(&text);
    return result;
}

/* int_list(int64 bytes): the list of those ints (small ones are shared objects, so a list of indexes costs
   little more than its pointers). */
static PyObject *int_list(PyObject *self, PyObject *arg) {
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t n = data.len / (Py_ssize_t)sizeof(long long);
    const long long *x = data.buf;
    PyObject *result = PyList_New(n);
    for (Py_ssize_t i = 0; result != NULL && i < n; i++) {
        PyObject *v = PyLong_FromLongLong(x[i]);
        if (v == NULL)
            Py_CLEAR(result);
        else
            PyList_SET_ITEM(result, i, v);
    }
    PyBuffer_Release(&data);
    return result;
}

/* ---------------------------------------------------------------- find_stages
   memory.columns.by_stage kept as its text until read (NOTE [ Checks in C ], rule 5): the text must be
   an array of {stage: {category: int}} objects whose stage names are plain printable ASCII (no escapes),
   whose categories are exactly one of the known ones and whose ints are 0 to 2**63-1: what the Python
   checks pass, in a form any JSON parser reads to the same objects. */

/* p at '"': the position after a string of printable ASCII without escapes, or NULL. */
static const char *plain_string(const char *p, const char *end) {
    for (p++; p < end && *p != '"'; p++)
        if (*p < 0x20 || *p > 0x7e || *p == '\\')
            return NULL;
    return p < end ? p + 1 : NULL;
}

/* p at '{': an object of `item` members ("name": value), each read by item; the position after '}', or NULL. */
typedef const char *(*Member)(const char *p, const char *end, PyObject *categories);

static const char *object_of(const char *p, const char *end, PyObject *categories, Member item) {
    p = skip_ws(p + 1, end);
    if (p < end && *p == '}')
        return p + 1;
    for (;;) {
        if (p >= end || *p != '"' || (p = item(p, end, categories)) == NULL)
            return NULL;
        p = skip_ws(p, end);
        if (p < end && *p == '}')
            return p + 1;
        if (p >= end || *p != ',')
            return NULL;
        p = skip_ws(p + 1, end);
    }
}

static const char *reading(const char *p, const char *end, PyObject *categories) { /* "category": int */
    const char *name = p + 1, *after = plain_string(p, end);
    if (after == NULL)
        return NULL;
    int known = 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(categories) && !known; k++) {
        PyObject *c = PyTuple_GET_ITEM(categories, k);
        known = PyBytes_GET_SIZE(c) == after - 1 - name && memcmp(PyBytes_AS_STRING(c), name, (size_t)(after - 1 - name)) == 0;
    }
    p = skip_ws(after, end);
    if (!known || p >= end || *p != ':')
        return NULL;
    p = skip_ws(p + 1, end);
    if (p >= end || *p < '0' || *p > '9' || (*p == '0' && p + 1 < end && p[1] >= '0' && p[1] <= '9'))
        return NULL;
    unsigned long long x = 0;
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        if (x > (ULLONG_MAX - 9) / 10)
            return NULL;
        x = x * 10 + (unsigned)(*p - '0');
    }
    return x <= (unsigned long long)LLONG_MAX && p < end && *p != '.' && *p != 'e' && *p != 'E' ? p : NULL;
}

static const char *stage(const char *p, const char *end, PyObject *categories) { /* "stage": {readings} */
    if ((p = plain_string(p, end)) == NULL)
        return NULL;
    p = skip_ws(p, end);
    if (p >= end || *p != ':')
        return NULL;
    p = skip_ws(p + 1, end);
    return p < end && *p == '{' ? object_of(p, end, categories, reading) : NULL;
}

/* find_stages(text, at, categories): at is where the key "by_stage" starts; (start, stop, samples) of its
   array value when it has the form above, else None. categories: a tuple of bytes. */
static PyObject *find_stages(PyObject *self, PyObject *args) {
    Py_buffer text;
    Py_ssize_t at;
    PyObject *categories;
    if (!PyArg_ParseTuple(args, "y*nO!", &text, &at, &PyTuple_Type, &categories))
        return NULL;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(categories); k++)
        if (!PyBytes_CheckExact(PyTuple_GET_ITEM(categories, k))) {
            PyBuffer_Release(&text);
            PyErr_SetString(PyExc_TypeError, "find_stages: categories must be bytes");
            return NULL;
        }
    const char *begin = text.buf, *end = begin + text.len, *p = begin, *start;
    Py_ssize_t samples = 0;
    int fine = at >= 0 && at <= text.len - 10 && memcmp(p += at, "\"by_stage\"", 10) == 0; /* no at + 10: it
                                                                                             can overflow */
    if (fine) {
        p = skip_ws(p + 10, end);
        fine = p < end && *p == ':';
    }
    if (fine) {
        p = skip_ws(p + 1, end);
        fine = p < end && *p == '[';
    }
    start = p;
    if (fine) {
        p = skip_ws(p + 1, end);
        if (p < end && *p == ']') {
            p++;
        } else {
            for (;;) {
                if (p >= end || *p != '{' || (p = object_of(p, end, categories, stage)) == NULL) {
                    fine = 0;
                    break;
                }
                samples++;
                p = skip_ws(p, end);
                if (p < end && *p == ']') {
                    p++;
                    break;
                }
                if (p >= end || *p != ',') {
                    fine = 0;
                    break;
                }
                p = skip_ws(p + 1, end);
            }
        }
    }
    PyBuffer_Release(&text);
    if (!fine)
        Py_RETURN_NONE;
    return Py_BuildValue("nnn", (Py_ssize_t)(start - begin), (Py_ssize_t)(p - begin), samples);
}

/* ---------------------------------------------------------------- find_categories
   memory.bytes_by_category read here (NOTE [ Checks in C ], rule 6): an object of plain printable ASCII names
   (no escapes) to arrays of ints (64 bits) and nulls, read to the same dict of lists a JSON parser makes,
   except that an int equal to the one before it in its list is the same object (most categories repeat). */

/* p at '[': a list of ints and None, or NULL (not that form; no error set). */
static PyObject *int_or_null_list(const char **at, const char *end) {
    const char *p = skip_ws(*at + 1, end);
    PyObject *list = PyList_New(0), *last = NULL;
    long long last_value = 0;
    if (list == NULL)
        return NULL;
    if (p < end && *p == ']') {
        *at = p + 1;
        return list;
    }
    for (;;) {
        PyObject *item;
        if (end - p >= 4 && memcmp(p, "null", 4) == 0) {
            item = Py_NewRef(Py_None), p += 4;
        } else {
            int negative = p < end && *p == '-';
            p += negative;
            if (p >= end || *p < '0' || *p > '9' || (*p == '0' && p + 1 < end && p[1] >= '0' && p[1] <= '9'))
                goto not_this_form;
            unsigned long long x = 0;
            for (; p < end && *p >= '0' && *p <= '9'; p++) {
                if (x > (ULLONG_MAX - 9) / 10)
                    goto not_this_form;
                x = x * 10 + (unsigned)(*p - '0');
            }
            if (x > (unsigned long long)LLONG_MAX || (p < end && (*p == '.' || *p == 'e' || *p == 'E')))
                goto not_this_form;
            long long value = negative ? -(long long)x : (long long)x;
            item = last != NULL && value == last_value ? Py_NewRef(last) : PyLong_FromLongLong(value);
            if (item == NULL)
                goto not_this_form;
            last = item, last_value = value; /* borrowed: the list holds it */
        }
        if (PyList_Append(list, item) < 0) {
            Py_DECREF(item);
            goto not_this_form;
        }
        Py_DECREF(item);
        p = skip_ws(p, end);
        if (p < end && *p == ']') {
            *at = p + 1;
            return list;
        }
        if (p >= end || *p != ',')
            goto not_this_form;
        p = skip_ws(p + 1, end);
    }
not_this_form:
    Py_DECREF(list);
    PyErr_Clear();
    return NULL;
}

/* find_categories(text, at): at is where the key "bytes_by_category" starts; (start, stop, {name: list}) of its
   object value when it has the form above, else None. */
static PyObject *find_categories(PyObject *self, PyObject *args) {
    Py_buffer text;
    Py_ssize_t at;
    if (!PyArg_ParseTuple(args, "y*n", &text, &at))
        return NULL;
    const char *begin = text.buf, *end = begin + text.len, *p = begin, *start = NULL;
    static const char KEY[] = "\"bytes_by_category\"";
    PyObject *found = NULL, *result = NULL;
    if (at < 0 || at > text.len - (Py_ssize_t)(sizeof KEY - 1) || memcmp(p += at, KEY, sizeof KEY - 1) != 0)
        goto done;
    p = skip_ws(p + sizeof KEY - 1, end);
    if (p >= end || *p != ':')
        goto done;
    start = p = skip_ws(p + 1, end);
    if (p >= end || *p != '{' || (found = PyDict_New()) == NULL)
        goto done;
    p = skip_ws(p + 1, end);
    if (p < end && *p == '}') {
        p++;
    } else {
        for (;;) {
            const char *name = p + 1, *after = p < end && *p == '"' ? plain_string(p, end) : NULL;
            if (after == NULL)
                goto done;
            p = skip_ws(after, end);
            if (p >= end || *p != ':')
                goto done;
            p = skip_ws(p + 1, end);
            if (p >= end || *p != '[')
                goto done;
            PyObject *values = int_or_null_list(&p, end);
            PyObject *key = values != NULL ? PyUnicode_FromStringAndSize(name, after - 1 - name) : NULL;
            int stored = key != NULL && PyDict_SetItem(found, key, values) == 0;
            Py_XDECREF(key);
            Py_XDECREF(values);
            if (!stored)
                goto done;
            p = skip_ws(p, end);
            if (p < end && *p == '}') {
                p++;
                break;
            }
            if (p >= end || *p != ',')
                goto done;
            p = skip_ws(p + 1, end);
        }
    }
    result = Py_BuildValue("nnO", (Py_ssize_t)(start - begin), (Py_ssize_t)(p - begin), found);
done:
    Py_XDECREF(found);
    PyBuffer_Release(&text);
    PyErr_Clear(); /* anything unusual is "not sure": the parser reads it */
    return result != NULL ? result : Py_NewRef(Py_None);
}

static PyMethodDef methods[] = {
    {"unpack", unpack, METH_VARARGS, "unpack(values, runs) -> list or None"},
    {"find_ints", find_ints, METH_O, "find_ints(text) -> {column name: (start, stop, int64 bytes)}"},
    {"int_list", int_list, METH_O, "int_list(int64 bytes) -> list of int"},
    {"find_categories", find_categories, METH_VARARGS, "find_categories(text, at) -> (start, stop, dict) or None"},
    {"find_stages", find_stages, METH_VARARGS, "find_stages(text, at, categories) -> (start, stop, samples) or None"},
    {"ints", ints, METH_VARARGS, "ints(column, low, high_inclusive, none_ok) -> bool"},
    {"index_counts", index_counts, METH_VARARGS, "index_counts(column, size) -> list of counts or None"},
    {"times", times, METH_O, "times(deltas) -> bool"},
    {"runs", runs, METH_VARARGS, "runs(run_lengths, count) -> bool"},
    {"kinds", kinds, METH_VARARGS, "kinds(column, mask) -> bool"},
    {"finite", finite_column, METH_O, "finite(column) -> bool"},
    {"by_stage", by_stage, METH_VARARGS, "by_stage(stages, categories) -> bool"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "load_checks", "One C pass over a column: fine, or look again.",
                                    -1, methods};

PyMODINIT_FUNC PyInit_load_checks(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "INT", K_INT) < 0 || PyModule_AddIntConstant(m, "NONE", K_NONE) < 0
        || PyModule_AddIntConstant(m, "STR", K_STR) < 0 || PyModule_AddIntConstant(m, "BOOL", K_BOOL) < 0
        || PyModule_AddIntConstant(m, "FLOAT", K_FLOAT) < 0 || PyModule_AddIntConstant(m, "DICT", K_DICT) < 0
        || PyModule_AddIntConstant(m, "LIST", K_LIST) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
