/* packrec: a recording's events packed for its trace file in one pass, in C (NOTE [ C speed-ups ] in
 * ckpt_viz/cext.py; NOTE [ Saving fast ] in ckpt_viz/trace/document.py, rule 5).
 *
 * pack(flat, size, max_contexts[, head]) reads the first `size` values of a RecordedEvents' flat list (each
 * event's fields after seq, in events.ROW_FIELDS order: NOTE [ Lazy events ] in ckpt_viz/trace/rows.py), after
 * those of `head` (the same of the Events a read has built already), and returns
 * what ckpt_viz/trace/document.py and packed.py make of those fields, the reference:
 *   (t_ns_delta, context, context_table, handle_id, session_id, tags, data)
 *   - t_ns_delta: document._deltas(t_ns), every t_ns an int (the check_types of the save);
 *   - context, context_table: columns._intern of (kind, mode, phase, site, thread_id) (numbered in order of
 *     first appearance, by equality), the column as packed.pack_runs(indexes=True) packs it;
 *   - handle_id, session_id: packed.pack_runs(column);
 *   - tags: packed.pack_runs(column, objects=True) when that gives runs (document._tags numbers their values);
 *   - data: packed._by_context(...) when pack_data would take it and it succeeds.
 * A part that is a 1-tuple (column,) is one this file leaves to the Python (a value of another type than the
 * usual ones, data that is not stored by context, tags that are not runs): the column, for the Python to pack.
 * None for the whole (the Python does all of it, and raises its errors) when there are fewer than 64 events
 * or a t_ns or a context field is of another type than the usual exact int, str or None. So no Python code
 * runs here (only comparisons and hashes of exact ints, strs and None), and every result is the Python's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define WIDTH 10 /* events.ROW_FIELDS */
enum { T_NS, KIND, HANDLE_ID, MODE, PHASE, SESSION_ID, TAGS, SITE, THREAD_ID, DATA };

/* packed.pack_runs's constants: a column shorter than SHORT is never packed; the quick look counts the
 * changes among the first HEAD values and gives up above HEAD_CHANGES. */
#define SHORT 64
#define HEAD 1024
#define HEAD_CHANGES 512

/* The events: those of `head` (the fields of the Events a read has built already), then those of `flat`. */
typedef struct { PyObject *head, *flat; Py_ssize_t nhead; } Source;

/* Field f of event i (borrowed); the lists are read again each time, never through a stale array. */
static inline PyObject *ITEM(const Source *s, Py_ssize_t i, int f)
{
    return i < s->nhead ? PyList_GET_ITEM(s->head, i * WIDTH + f) : PyList_GET_ITEM(s->flat, (i - s->nhead) * WIDTH + f);
}

/* ---------------------------------------------------------------- runs (packed.pack_runs) */

enum { LIVE, COLUMN, DEFER };              /* still packable; the plain column; pack_runs decides (Python) */
enum { V_NONE, V_INT, V_BOOL, V_STR, V_ODD };

typedef struct {
    int state;
    int by_identity;      /* tags: a run is one object (pack_runs(objects=True)) */
    Py_ssize_t n, limit;  /* events; the most runs that pack (n // 2) */
    Py_ssize_t head, head_changes;
    Py_ssize_t *starts, nruns;
    PyObject **firsts;    /* borrowed: each run's first value (kept here: the flat list is not read again) */
    PyObject *first;      /* borrowed (the flat list holds it): the value that opened the current run */
    int first_kind, numbers_first, has_int, has_bool;
} Runs;

static int value_kind(PyObject *v)
{
    if (v == Py_None)
        return V_NONE;
    if (PyLong_CheckExact(v))
        return V_INT;
    if (PyBool_Check(v))
        return V_BOOL;
    if (PyUnicode_CheckExact(v))
        return V_STR;
    return V_ODD;
}

static int runs_init(Runs *r, Py_ssize_t n, int by_identity)
{
    memset(r, 0, sizeof *r);
    r->by_identity = by_identity;
    r->n = n;
    r->limit = n / 2;
    r->head = n < HEAD ? n : HEAD;
    r->starts = PyMem_Malloc((r->limit + 2) * sizeof(Py_ssize_t));
    r->firsts = PyMem_Malloc((r->limit + 2) * sizeof(PyObject *));
    if (r->starts == NULL || r->firsts == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Event i's value v (borrowed). -1 on an error (set). */
static int runs_see(Runs *r, Py_ssize_t i, PyObject *v)
{
    int kind = V_ODD, same;
    if (r->state == DEFER || (r->state == COLUMN && i >= r->head))
        return 0;
    if (i > 0 && v == r->first) /* the usual: the value of the event before, its type already seen */
        goto seen;
    if (!r->by_identity) {
        kind = value_kind(v);
        if (kind == V_ODD) { /* pack_runs would compare it (its quick look reads the whole head): Python */
            r->state = DEFER;
            return 0;
        }
        r->has_int |= kind == V_INT;
        r->has_bool |= kind == V_BOOL;
    }
    if (r->state == COLUMN) /* decided, but the head is still looked at for odd values */
        return 0;
    if (i == 0 || r->by_identity) {
        same = 0;
    } else {
        int numbers = (kind == V_INT || kind == V_BOOL) && (r->first_kind == V_INT || r->first_kind == V_BOOL);
        if (numbers || (kind == V_STR && r->first_kind == V_STR)) {
            same = PyObject_RichCompareBool(r->first, v, Py_EQ); /* groupby's test; C-level for these types */
            if (same < 0)
                return -1;
        } else {
            same = 0; /* None against anything else, a string against a number */
        }
    }
    if (!same) {
        if (i > 0 && i < r->head)
            r->head_changes++;
        if (r->nruns == r->limit) /* one run more than pack_runs takes */
            r->state = COLUMN;
        else
            r->firsts[r->nruns] = v, r->starts[r->nruns++] = i;
        r->first = v;
        r->first_kind = kind;
        r->numbers_first |= kind == V_INT || kind == V_BOOL;
    }
seen:
    if (i == r->head - 1 && r->head_changes > HEAD_CHANGES)
        r->state = COLUMN;
    return 0;
}

/* The plain column of field f, a new list. */
static PyObject *column_of(const Source *events, Py_ssize_t n, int f)
{
    PyObject *column = PyList_New(n);
    if (column == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = ITEM(events, i, f);
        Py_INCREF(v);
        PyList_SET_ITEM(column, i, v);
    }
    return column;
}

/* {"values": [...], "runs": [...]} of runs r; values[j] is value(r, j, source) (a new reference). */
static PyObject *runs_dict(Runs *r, PyObject *(*value)(Runs *, Py_ssize_t, void *), void *source)
{
    PyObject *values = PyList_New(r->nruns), *lengths = PyList_New(r->nruns), *out = NULL;
    if (values == NULL || lengths == NULL)
        goto done;
    for (Py_ssize_t j = 0; j < r->nruns; j++) {
        Py_ssize_t end = j + 1 < r->nruns ? r->starts[j + 1] : r->n;
        PyObject *v = value(r, j, source);
        PyObject *length = v != NULL ? PyLong_FromSsize_t(end - r->starts[j]) : NULL;
        if (length == NULL) {
            Py_XDECREF(v);
            goto done;
        }
        PyList_SET_ITEM(values, j, v);
        PyList_SET_ITEM(lengths, j, length);
    }
    out = Py_BuildValue("{sOsO}", "values", values, "runs", lengths);
done:
    Py_XDECREF(values);
    Py_XDECREF(lengths);
    return out;
}

static PyObject *first_value(Runs *r, Py_ssize_t j, void *source)
{
    (void)source;
    Py_INCREF(r->firsts[j]);
    return r->firsts[j];
}

static PyObject *index_value(Runs *r, Py_ssize_t j, void *index)
{
    return PyLong_FromLong(((int32_t *)index)[r->starts[j]]);
}

/* A run column's part of the result: pack_runs's answer, or (column,) for the Python to pack. */
static PyObject *runs_result(Runs *r, const Source *events, int field)
{
    PyObject *column;
    if (r->state == LIVE && !(r->numbers_first && r->has_int && r->has_bool)) /* True == 1 would merge */
        return runs_dict(r, first_value, NULL);
    column = column_of(events, r->n, field);
    if (column == NULL || r->state != DEFER)
        return column;
    return Py_BuildValue("(N)", column);
}

/* ---------------------------------------------------------------- contexts (columns._intern) */

/* Contexts seen, by the identity of their first four values and the value of thread_id (the bus makes a new
 * int object per event): a cache in front of the dict that numbers them by equality (same objects, or equal
 * ints, same entry: a dict compares by identity first). Open addressing, grown to CAP. */
typedef struct { PyObject *f[5]; int32_t k; } Slot; /* f[4]: thread_id's value, as a pointer-sized word */
#define CAP (1 << 16)

typedef struct {
    Slot *slots;
    size_t size, used;
    PyObject *numbering; /* (kind, mode, phase, site, thread_id) -> index, as columns._intern's defaultdict */
    PyObject *table;     /* the tuples in order of first appearance */
} Contexts;

static size_t slot_hash(PyObject **f)
{
    uintptr_t h = 0;
    for (int j = 0; j < 5; j++)
        h = (h ^ ((uintptr_t)f[j] >> 4)) * (uintptr_t)0x9E3779B97F4A7C15ull;
    return (size_t)(h ^ (h >> 29));
}

static Slot *slot_find(Slot *slots, size_t size, PyObject **f)
{
    size_t at = slot_hash(f) & (size - 1);
    for (;;) {
        Slot *s = &slots[at];
        if (s->f[0] == NULL || (s->f[0] == f[0] && s->f[1] == f[1] && s->f[2] == f[2] && s->f[3] == f[3]
                                && s->f[4] == f[4]))
            return s;
        at = (at + 1) & (size - 1);
    }
}

static int contexts_grow(Contexts *c)
{
    size_t size = c->size * 2;
    Slot *slots = PyMem_Calloc(size, sizeof(Slot));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t at = 0; at < c->size; at++)
        if (c->slots[at].f[0] != NULL)
            *slot_find(slots, size, c->slots[at].f) = c->slots[at];
    PyMem_Free(c->slots);
    c->slots = slots;
    c->size = size;
    return 0;
}

/* The index of the context of fields f (borrowed), -1 on an error (set). */
static int32_t context_index(Contexts *c, PyObject **f)
{
    PyObject *key, *found, *word[5] = {f[0], f[1], f[2], f[3], NULL};
    int overflow;
    long long thread = PyLong_AsLongLongAndOverflow(f[4], &overflow);
    int cached = !overflow && sizeof(long long) == sizeof(PyObject *);
    Slot *s = NULL;
    int32_t k;
    if (cached) {
        word[4] = (PyObject *)(intptr_t)thread;
        s = slot_find(c->slots, c->size, word);
        if (s->f[0] != NULL)
            return s->k;
    }
    key = PyTuple_Pack(5, f[0], f[1], f[2], f[3], f[4]);
    if (key == NULL)
        return -1;
    found = PyDict_GetItemWithError(c->numbering, key); /* hashes and == of exact str, int, None only */
    if (found != NULL) {
        k = (int32_t)PyLong_AsLong(found);
    } else if (PyErr_Occurred() || PyList_GET_SIZE(c->table) >= INT32_MAX) {
        if (!PyErr_Occurred()) /* never NULL without an exception (pack's n is at most INT32_MAX anyway) */
            PyErr_SetString(PyExc_OverflowError, "pack: more than 2**31 - 1 contexts");
        Py_DECREF(key);
        return -1;
    } else {
        PyObject *number = PyLong_FromSsize_t(PyList_GET_SIZE(c->table));
        k = (int32_t)PyList_GET_SIZE(c->table);
        if (number == NULL || PyDict_SetItem(c->numbering, key, number) < 0 || PyList_Append(c->table, key) < 0) {
            Py_XDECREF(number);
            Py_DECREF(key);
            return -1;
        }
        Py_DECREF(number);
    }
    Py_DECREF(key);
    if (cached && c->used * 2 < c->size) { /* remember these objects (past CAP, the dict alone numbers them) */
        memcpy(s->f, word, sizeof s->f);
        s->k = k;
        c->used++;
        if (c->used * 2 >= c->size && c->size < CAP && contexts_grow(c) < 0)
            return -1;
    }
    return k;
}

/* ---------------------------------------------------------------- data by context (packed._by_context) */

typedef struct {
    PyObject *keys;    /* the keys of the context's first data, in order (a list), or NULL: no event yet */
    PyObject *columns; /* one list of values per key */
} Shape;

/* Add event data d (borrowed) to its context's columns: 1 done, 0 not stored by context (the same result as
 * _by_context's None, without looking further), -1 on an error (set). */
static int data_add(Shape *shape, PyObject *d)
{
    Py_ssize_t pos = 0, j = 0, count;
    PyObject *key, *value;
    if (!PyDict_CheckExact(d))
        return 0;
    count = PyDict_GET_SIZE(d);
    if (shape->keys == NULL) { /* the context's first event: its keys, each an exact str (_str_keys) */
        shape->keys = PyList_New(count);
        shape->columns = PyList_New(count);
        if (shape->keys == NULL || shape->columns == NULL)
            return -1;
        for (Py_ssize_t c = 0; c < count; c++) {
            PyObject *column = PyList_New(0);
            if (column == NULL)
                return -1;
            PyList_SET_ITEM(shape->columns, c, column);
        }
        while (PyDict_Next(d, &pos, &key, &value)) {
            if (!PyUnicode_CheckExact(key))
                return 0;
            Py_INCREF(key);
            PyList_SET_ITEM(shape->keys, j++, key);
        }
        pos = j = 0;
    }
    if (count != PyList_GET_SIZE(shape->keys))
        return 0;
    /* The same keys in the same order; a key that is not the very same str object must be an equal str. */
    while (PyDict_Next(d, &pos, &key, &value)) {
        PyObject *name = PyList_GET_ITEM(shape->keys, j);
        if (key != name && !(PyUnicode_CheckExact(key) && PyUnicode_Compare(key, name) == 0))
            return 0;
        if (PyList_Append(PyList_GET_ITEM(shape->columns, j), value) < 0)
            return -1;
        j++;
    }
    return 1;
}

/* {"keys": [...], "shape": "context", "values": [...]} (steals nothing). */
static PyObject *data_dict(Shape *shapes, Py_ssize_t count)
{
    PyObject *keys = PyList_New(count), *values = PyList_New(count), *out = NULL;
    if (keys == NULL || values == NULL)
        goto done;
    for (Py_ssize_t k = 0; k < count; k++) { /* every context has an event, so its keys */
        Py_INCREF(shapes[k].keys);
        PyList_SET_ITEM(keys, k, shapes[k].keys);
        Py_INCREF(shapes[k].columns);
        PyList_SET_ITEM(values, k, shapes[k].columns);
    }
    out = Py_BuildValue("{sOsssO}", "keys", keys, "shape", "context", "values", values);
done:
    Py_XDECREF(keys);
    Py_XDECREF(values);
    return out;
}

/* ---------------------------------------------------------------- t_ns (document._deltas) */

/* t_ns[i] - t_ns[i - 1] (t_ns[0] itself for i == 0), a new reference. */
static PyObject *delta(PyObject *now, PyObject *before, long long *last, int *last_ok)
{
    int overflow;
    long long value = PyLong_AsLongLongAndOverflow(now, &overflow), out; /* an exact int: no error */
    int ok = !overflow;
    if (before == NULL) {
        *last = value, *last_ok = ok;
        Py_INCREF(now);
        return now;
    }
    if (ok && *last_ok && !__builtin_sub_overflow(value, *last, &out)) {
        *last = value;
        return PyLong_FromLongLong(out);
    }
    *last = value, *last_ok = ok;
    return PyNumber_Subtract(now, before);
}

/* deltas(t_ns): document._deltas(t_ns) where every value is an exact int (check_types' test), else None. */
static PyObject *deltas(PyObject *self, PyObject *values)
{
    Py_ssize_t n;
    PyObject *out;
    long long last = 0;
    int last_ok = 0;
    (void)self;
    if (!PyList_CheckExact(values)) {
        PyErr_SetString(PyExc_TypeError, "deltas: expected a list");
        return NULL;
    }
    n = PyList_GET_SIZE(values);
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyLong_CheckExact(PyList_GET_ITEM(values, i)))
            Py_RETURN_NONE;
    out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *step = delta(PyList_GET_ITEM(values, i), i ? PyList_GET_ITEM(values, i - 1) : NULL, &last, &last_ok);
        if (step == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, step);
    }
    return out;
}

/* ---------------------------------------------------------------- tags (document._number) */

/* The hash of tags d's content (keys, values and the values' types, in order), or -1 where a key is not an
 * exact str or a value not an exact int, str, bool or None (then document._number decides by its own rules). */
static Py_hash_t content_hash(PyObject *d)
{
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    Py_uhash_t h = (Py_uhash_t)PyDict_GET_SIZE(d) * 1000003u;
    while (PyDict_Next(d, &pos, &key, &value)) {
        int kind = value_kind(value);
        Py_hash_t hk, hv;
        if (!PyUnicode_CheckExact(key) || kind == V_ODD)
            return -1;
        hk = PyObject_Hash(key);
        hv = kind == V_NONE ? 0 : PyObject_Hash(value); /* str and int hashes: C, never fail */
        if (hk == -1 || hv == -1) {
            PyErr_Clear();
            return -1;
        }
        h = (h ^ (Py_uhash_t)hk) * 0x100000001B3u;
        h = (h ^ (Py_uhash_t)hv ^ (Py_uhash_t)kind) * 0x100000001B3u;
    }
    h ^= h >> 29; /* the low bits pick the slot: mix the high ones in */
    h *= 0xBF58476D1CE4E5B9u;
    h ^= h >> 32;
    return (Py_hash_t)(h & ((Py_uhash_t)-1 >> 2)); /* never -1 */
}

/* Tags a and b (exact dicts whose content_hash is not -1) equal as document._number's keys: the same keys
 * in the same order, equal values of the same types. */
static int same_content(PyObject *a, PyObject *b)
{
    Py_ssize_t pa = 0, pb = 0;
    PyObject *ka, *va, *kb, *vb;
    if (PyDict_GET_SIZE(a) != PyDict_GET_SIZE(b))
        return 0;
    while (PyDict_Next(a, &pa, &ka, &va) && PyDict_Next(b, &pb, &kb, &vb)) {
        int kind = value_kind(va);
        if ((ka != kb && PyUnicode_Compare(ka, kb) != 0) || kind != value_kind(vb))
            return 0;
        if (va != vb && (kind == V_NONE || kind == V_BOOL || PyObject_RichCompareBool(va, vb, Py_EQ) != 1))
            return 0;
    }
    return 1;
}

typedef struct { Py_hash_t hash; Py_ssize_t first, k; } Entry;

/* number_tags(tags): document._number(tags), (each dict's index, the first position of each distinct one),
 * by content; None where _number would look further (not a dict, a key or value of another type). */
static PyObject *number_tags(PyObject *self, PyObject *tags)
{
    Py_ssize_t n, size = 8, count = 0;
    Entry *entries;
    PyObject *indexes = NULL, *firsts = NULL, *result = NULL;
    int odd = 0;
    (void)self;
    if (!PyList_CheckExact(tags)) {
        PyErr_SetString(PyExc_TypeError, "number_tags: expected a list");
        return NULL;
    }
    n = PyList_GET_SIZE(tags);
    while (size < 2 * n)
        size *= 2;
    entries = PyMem_Malloc(size * sizeof(Entry));
    indexes = PyList_New(n);
    firsts = PyList_New(0);
    if (entries == NULL || indexes == NULL || firsts == NULL) {
        if (entries == NULL)
            PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t at = 0; at < size; at++)
        entries[at].first = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyList_GET_ITEM(tags, i), *k;
        Py_hash_t h = PyDict_CheckExact(d) ? content_hash(d) : -1;
        Entry *e;
        if (h == -1) {
            odd = 1;
            goto done;
        }
        for (size_t at = (size_t)h & (size - 1);; at = (at + 1) & (size - 1)) {
            e = &entries[at];
            if (e->first < 0 || (e->hash == h && same_content(PyList_GET_ITEM(tags, e->first), d)))
                break;
        }
        if (e->first < 0) { /* a new one */
            PyObject *position = PyLong_FromSsize_t(i);
            if (position == NULL || PyList_Append(firsts, position) < 0) {
                Py_XDECREF(position);
                goto done;
            }
            Py_DECREF(position);
            e->hash = h, e->first = i, e->k = count++;
        }
        k = PyLong_FromSsize_t(e->k);
        if (k == NULL)
            goto done;
        PyList_SET_ITEM(indexes, i, k);
    }
    result = PyTuple_Pack(2, indexes, firsts);
done:
    PyMem_Free(entries);
    Py_XDECREF(indexes);
    Py_XDECREF(firsts);
    if (odd)
        Py_RETURN_NONE;
    return result;
}

/* ---------------------------------------------------------------- pack */

static int is_str_or_none(PyObject *v)
{
    return v == Py_None || PyUnicode_CheckExact(v);
}

static PyObject *pack(PyObject *self, PyObject *args)
{
    PyObject *head = NULL, *flat, *deltas = NULL, *context = NULL, *handles = NULL, *sessions = NULL, *tags = NULL,
             *data = NULL, *result = NULL;
    Py_ssize_t size, max_contexts, n;
    Contexts contexts = {NULL, 0, 0, NULL, NULL};
    Runs handle_runs, session_runs, tag_runs, context_runs;
    Shape *shapes = NULL;
    int32_t *index = NULL;
    int data_ok = 1, whole = 1;
    long long last = 0;
    int last_ok = 0, gc_was_on;
    (void)self;
    Source source;
    if (!PyArg_ParseTuple(args, "O!nn|O!:pack", &PyList_Type, &flat, &size, &max_contexts, &PyList_Type, &head))
        return NULL;
    if (size < 0 || size % WIDTH || size > PyList_GET_SIZE(flat) || max_contexts < 0
        || (head != NULL && PyList_GET_SIZE(head) % WIDTH)) {
        PyErr_SetString(PyExc_ValueError, "pack: size must be a multiple of 10 within the list (and head's length)");
        return NULL;
    }
    source.head = head, source.flat = flat, source.nhead = head != NULL ? PyList_GET_SIZE(head) / WIDTH : 0;
    n = source.nhead + size / WIDTH;
    if (n < SHORT || n > INT32_MAX)
        Py_RETURN_NONE;
    if (max_contexts > n) /* n events have at most n contexts: the same result, and max_contexts + 1 cannot overflow */
        max_contexts = n;
    gc_was_on = PyGC_Disable(); /* no collection, so no finalizer (Python code) runs while items are borrowed */
    memset(&handle_runs, 0, sizeof handle_runs);
    memset(&session_runs, 0, sizeof session_runs);
    memset(&tag_runs, 0, sizeof tag_runs);
    memset(&context_runs, 0, sizeof context_runs);
    if (runs_init(&handle_runs, n, 0) < 0 || runs_init(&session_runs, n, 0) < 0 || runs_init(&tag_runs, n, 1) < 0
        || runs_init(&context_runs, n, 1) < 0)
        goto done;
    contexts.size = 1024;
    contexts.slots = PyMem_Calloc(contexts.size, sizeof(Slot));
    contexts.numbering = PyDict_New();
    contexts.table = PyList_New(0);
    shapes = PyMem_Calloc(max_contexts + 1, sizeof(Shape));
    index = PyMem_Malloc(n * sizeof(int32_t));
    deltas = PyList_New(n);
    if (contexts.slots == NULL || shapes == NULL || index == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (contexts.numbering == NULL || contexts.table == NULL || deltas == NULL)
        goto done;

    for (Py_ssize_t i = 0; i < n; i++) { /* the one pass over the events */
        PyObject *t = ITEM(&source, i, T_NS), *d, *f[5] = {ITEM(&source, i, KIND), ITEM(&source, i, MODE),
                                                        ITEM(&source, i, PHASE), ITEM(&source, i, SITE),
                                                        ITEM(&source, i, THREAD_ID)};
        int32_t k;
        if (!PyLong_CheckExact(t) || !PyUnicode_CheckExact(f[0]) || !is_str_or_none(f[1]) || !is_str_or_none(f[2])
            || !is_str_or_none(f[3]) || !PyLong_CheckExact(f[4])) {
            whole = 0; /* the Python checks it and says what is wrong */
            goto done;
        }
        PyObject *step = delta(t, i ? ITEM(&source, i - 1, T_NS) : NULL, &last, &last_ok);
        if (step == NULL)
            goto done;
        PyList_SET_ITEM(deltas, i, step);
        k = context_index(&contexts, f);
        if (k < 0)
            goto done;
        index[i] = k;
        /* the context column's runs: by index, handed over as an opaque token (k + 1) compared by identity */
        if (runs_see(&context_runs, i, (PyObject *)(intptr_t)(k + 1)) < 0
            || runs_see(&handle_runs, i, ITEM(&source, i, HANDLE_ID)) < 0
            || runs_see(&session_runs, i, ITEM(&source, i, SESSION_ID)) < 0
            || runs_see(&tag_runs, i, ITEM(&source, i, TAGS)) < 0)
            goto done;
        if (data_ok) {
            int added;
            d = ITEM(&source, i, DATA);
            if (k >= max_contexts) { /* more contexts than pack_data stores by context */
                data_ok = 0;
                continue;
            }
            added = data_add(&shapes[k], d);
            if (added < 0)
                goto done;
            data_ok = added;
        }
    }

    if (context_runs.state == LIVE) {
        context = runs_dict(&context_runs, index_value, index);
    } else {
        context = PyList_New(n);
        for (Py_ssize_t i = 0; context != NULL && i < n; i++) {
            PyObject *k = PyLong_FromLong(index[i]);
            if (k == NULL)
                Py_CLEAR(context);
            else
                PyList_SET_ITEM(context, i, k);
        }
    }
    if (context == NULL)
        goto done;
    handles = runs_result(&handle_runs, &source, HANDLE_ID);
    sessions = handles != NULL ? runs_result(&session_runs, &source, SESSION_ID) : NULL;
    if (sessions == NULL)
        goto done;
    if (tag_runs.state == LIVE) {
        tags = runs_dict(&tag_runs, first_value, NULL);
    } else {
        PyObject *column = column_of(&source, n, TAGS);
        tags = column != NULL ? Py_BuildValue("(N)", column) : NULL;
    }
    if (tags == NULL)
        goto done;
    if (data_ok) {
        data = data_dict(shapes, PyList_GET_SIZE(contexts.table));
    } else {
        PyObject *column = column_of(&source, n, DATA);
        data = column != NULL ? Py_BuildValue("(N)", column) : NULL;
    }
    if (data == NULL)
        goto done;
    result = PyTuple_Pack(7, deltas, context, contexts.table, handles, sessions, tags, data);

done:
    if (shapes != NULL) {
        for (Py_ssize_t k = 0; k <= max_contexts; k++) {
            Py_XDECREF(shapes[k].keys);
            Py_XDECREF(shapes[k].columns);
        }
        PyMem_Free(shapes);
    }
    PyMem_Free(index);
    PyMem_Free(contexts.slots);
    Py_XDECREF(contexts.numbering);
    Py_XDECREF(contexts.table);
    PyMem_Free(handle_runs.starts);
    PyMem_Free(handle_runs.firsts);
    PyMem_Free(session_runs.starts);
    PyMem_Free(session_runs.firsts);
    PyMem_Free(tag_runs.starts);
    PyMem_Free(tag_runs.firsts);
    PyMem_Free(context_runs.starts);
    PyMem_Free(context_runs.firsts);
    Py_XDECREF(deltas);
    Py_XDECREF(context);
    Py_XDECREF(handles);
    Py_XDECREF(sessions);
    Py_XDECREF(tags);
    Py_XDECREF(data);
    if (gc_was_on)
        PyGC_Enable();
    if (result == NULL && !whole && !PyErr_Occurred())
        Py_RETURN_NONE;
    return result;
}

static PyMethodDef methods[] = {
    {"pack", pack, METH_VARARGS,
     "pack(flat, size, max_contexts[, head]): a recording's columns for its trace file, or None (see the file's "
     "comment)"},
    {"deltas", deltas, METH_O, "deltas(t_ns): document._deltas(t_ns) where every value is an exact int; else None"},
    {"number_tags", number_tags, METH_O,
     "number_tags(tags): document._number(tags) where every tags dict has str keys and int, str, bool or None "
     "values; else None"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "packrec", NULL, -1, methods};

PyMODINIT_FUNC PyInit_packrec(void)
{
    return PyModule_Create(&module);
}
