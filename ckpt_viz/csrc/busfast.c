/* busfast: the bus's usual emit and the call-site walk, in C (NOTE [ C speed-ups ] in ckpt_viz/cext.py).
 *
 * The Python in ckpt_viz/bus.py (`_emit_row_py`, `_emit_for_py`) and ckpt_viz/sites.py (`call_site`) is the
 * reference. This module does what it does in the usual case only:
 *   - emit_row / emit_for: this context's scope is one open recording's channel (`Scope.sole._only_rows` is a
 *     (keep, seq_of) pair), no global subscriber, `scope` None or this context's own, a session id that is
 *     None, a str, an int or a float. It builds the same values tuple (t_ns from CLOCK_MONOTONIC, the clock of
 *     time.monotonic_ns; the thread ident of threading.get_ident), calls keep(values) and returns the same
 *     KeptRow (seq_of, values). Anything else goes, with the same arguments, to the Python emit_row.
 *   - current_scope: this context's own scope while its innermost channel is open; else the Python decides.
 *   - call sites: a walk over frames whose files are already in sites._skip_cache and whose (file, line) is
 *     already in sites._site_cache; at the first frame that is not, the Python call_site does the whole walk
 *     (and fills the caches), so both give the same answer.
 * Nothing here keeps state between calls except references to the bus's objects, given by `configure`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <time.h>

static PyObject *bus_dict;      /* ckpt_viz.bus.__dict__: _subscribers and _tagged are read there at each call */
static PyObject *scope_var;     /* bus._SCOPE (ContextVar, default None) */
static PyObject *tags_var;      /* bus._TAGS (ContextVar, default None) */
static PyObject *no_tags;       /* bus._NO_TAGS */
static PyTypeObject *kept_type; /* events.KeptRow, a tuple subclass without slots of its own */
static PyObject *py_emit_row;   /* bus._emit_row_py: the reference, and every case this file does not take */
static PyObject *py_call_site;  /* sites.call_site */
static PyObject *py_current_scope; /* bus._current_scope_py */
static PyObject *skip_cache;    /* sites._skip_cache: filename -> bool (skipped) */
static PyObject *site_cache;    /* sites._site_cache: (filename, line) -> "short/path.py:line" */
static PyObject *s_subscribers, *s_tagged, *s_sole, *s_only_rows, *s_handle_id, *s_mode, *s_phase,
    *s_session_id, *s_story, *s_add, *s_channels, *s_is_open, *s_emit_for_py;

#define MISS Py_NotImplemented /* "the Python path decides": never a real result here (not a new reference) */

/* The site of the first frame outside the skipped files, starting at `frame` (borrowed; NULL: none), as a new
 * reference (Py_None when every frame is skipped), or MISS (not a new reference) where a cache lacks an entry. */
static PyObject *site_from(PyFrameObject *frame)
{
    Py_XINCREF(frame);
    while (frame != NULL) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        PyObject *filename = code->co_filename;
        PyObject *hit = PyDict_GetItemWithError(skip_cache, filename); /* borrowed */
        if (hit == Py_False) {
            int line = PyFrame_GetLineNumber(frame);
            PyObject *number = line >= 0 ? PyLong_FromLong(line) : NULL;
            PyObject *key = number != NULL ? PyTuple_Pack(2, filename, number) : NULL;
            PyObject *site = key != NULL ? PyDict_GetItemWithError(site_cache, key) : NULL;
            Py_XINCREF(site);
            Py_XDECREF(key);
            Py_XDECREF(number);
            Py_DECREF(code);
            Py_DECREF(frame);
            PyErr_Clear(); /* an odd key or a failed lookup: the Python walk meets it again and decides */
            return site != NULL ? site : MISS;
        }
        Py_DECREF(code);
        if (hit != Py_True) { /* a file not seen yet (or an error): the Python walk */
            Py_DECREF(frame);
            PyErr_Clear();
            return MISS;
        }
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    Py_RETURN_NONE;
}

/* call_site(depth=2): as sites.call_site called from the same place (frame 1 is our caller). */
static PyObject *call_site(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long depth = 2;
    if (nargs > 1)
        return PyObject_Vectorcall(py_call_site, args, nargs, NULL); /* its own TypeError */
    if (nargs == 1) {
        depth = PyLong_Check(args[0]) ? PyLong_AsLong(args[0]) : -1;
        if (depth == -1 && PyErr_Occurred())
            PyErr_Clear();
        if (depth < 1)
            return PyObject_Vectorcall(py_call_site, args, nargs, NULL);
    }
    PyFrameObject *frame = PyEval_GetFrame(); /* borrowed: our caller, Python's frame 1 */
    Py_XINCREF(frame);
    for (long i = 1; i < depth && frame != NULL; i++) {
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    if (frame == NULL) /* not deep enough: Python raises its ValueError */
        return PyObject_Vectorcall(py_call_site, args, nargs, NULL);
    PyObject *site = site_from(frame);
    Py_DECREF(frame);
    if (site == MISS) {
        PyObject *fallback[1] = {NULL};
        fallback[0] = PyLong_FromLong(depth);
        if (fallback[0] == NULL)
            return NULL;
        site = PyObject_Vectorcall(py_call_site, fallback, 1, NULL);
        Py_DECREF(fallback[0]);
    }
    return site;
}

/* The fast path of emit_row for positional fields f[0..8] (kind, handle_id, mode, phase, session_id, site,
 * capture_site, data, scope): a new KeptRow, NULL with an exception set, or MISS (nothing done yet). */
static PyObject *emit_fast(PyObject *const *f)
{
    PyObject *kind = f[0], *session_id = f[4], *site = f[5], *scope = f[8];
    if (session_id != Py_None && !PyUnicode_Check(session_id) && !PyLong_Check(session_id)
        && !PyFloat_Check(session_id))
        return MISS; /* Python writes its repr() */
    PyObject *subscribers = PyDict_GetItemWithError(bus_dict, s_subscribers); /* borrowed */
    if (subscribers == NULL || !PyTuple_CheckExact(subscribers) || PyTuple_GET_SIZE(subscribers) != 0) {
        PyErr_Clear();
        return MISS;
    }
    PyObject *own;
    if (PyContextVar_Get(scope_var, NULL, &own) < 0)
        return NULL;
    if (own == Py_None || (scope != Py_None && scope != own)) {
        Py_DECREF(own);
        return MISS;
    }
    PyObject *sole = PyObject_GetAttr(own, s_sole);
    Py_DECREF(own);
    if (sole == NULL)
        return NULL;
    PyObject *positional = PyObject_GetAttr(sole, s_only_rows); /* (keep, seq_of), None once closed */
    Py_DECREF(sole);
    if (positional == NULL)
        return NULL;
    if (!PyTuple_CheckExact(positional) || PyTuple_GET_SIZE(positional) != 2) {
        Py_DECREF(positional);
        return MISS;
    }
    PyObject *tags = NULL;
    PyObject *tagged = PyDict_GetItemWithError(bus_dict, s_tagged); /* borrowed */
    int is_tagged = tagged != NULL ? PyObject_IsTrue(tagged) : (PyErr_Occurred() ? -1 : 0);
    if (is_tagged < 0)
        goto error;
    if (is_tagged) { /* (_TAGS.get() or _NO_TAGS) */
        if (PyContextVar_Get(tags_var, NULL, &tags) < 0)
            goto error;
        int some = PyObject_IsTrue(tags);
        if (some < 0)
            goto error;
        if (!some)
            Py_SETREF(tags, Py_NewRef(no_tags));
    } else {
        tags = Py_NewRef(no_tags);
    }
    if (site == Py_None) {
        int capture = PyObject_IsTrue(f[6]);
        if (capture < 0)
            goto error;
        if (capture) { /* the walk starts at our caller: Python's call_site() inside emit_row starts there too */
            site = site_from(PyEval_GetFrame());
            if (site == MISS) {
                PyObject *one = PyLong_FromLong(1);
                site = one != NULL ? PyObject_Vectorcall(py_call_site, &one, 1, NULL) : NULL;
                Py_XDECREF(one);
            }
            if (site == NULL)
                goto error;
        } else {
            Py_INCREF(site);
        }
    } else {
        Py_INCREF(site);
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now); /* what time.monotonic_ns reads on Linux */
    PyObject *values = PyTuple_New(10);
    PyObject *t_ns = PyLong_FromLongLong((long long)now.tv_sec * 1000000000LL + now.tv_nsec);
    PyObject *ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    if (values == NULL || t_ns == NULL || ident == NULL) {
        Py_XDECREF(values);
        Py_XDECREF(t_ns);
        Py_XDECREF(ident);
        Py_DECREF(site);
        goto error;
    }
    /* (t_ns, kind, handle_id, mode, phase, session_id, tags, site, thread, data): events.ROW_FIELDS */
    PyTuple_SET_ITEM(values, 0, t_ns);
    PyTuple_SET_ITEM(values, 1, Py_NewRef(kind));
    PyTuple_SET_ITEM(values, 2, Py_NewRef(f[1]));
    PyTuple_SET_ITEM(values, 3, Py_NewRef(f[2]));
    PyTuple_SET_ITEM(values, 4, Py_NewRef(f[3]));
    PyTuple_SET_ITEM(values, 5, Py_NewRef(session_id));
    PyTuple_SET_ITEM(values, 6, tags); /* the reference we hold moves into the tuple */
    PyTuple_SET_ITEM(values, 7, site);
    PyTuple_SET_ITEM(values, 8, ident);
    PyTuple_SET_ITEM(values, 9, Py_NewRef(f[7]));
    tags = NULL;
    PyObject *kept = PyObject_CallOneArg(PyTuple_GET_ITEM(positional, 0), values); /* one list.extend */
    if (kept == NULL) {
        Py_DECREF(values);
        goto error;
    }
    Py_DECREF(kept);
    PyObject *row = kept_type->tp_alloc(kept_type, 2); /* tuple.__new__(KeptRow, (seq_of, values)) */
    if (row == NULL) {
        Py_DECREF(values);
        goto error;
    }
    PyTuple_SET_ITEM(row, 0, Py_NewRef(PyTuple_GET_ITEM(positional, 1)));
    PyTuple_SET_ITEM(row, 1, values);
    Py_DECREF(positional);
    return row;
error:
    Py_XDECREF(tags);
    Py_DECREF(positional);
    return NULL;
}

/* emit_row(kind, handle_id, mode, phase, session_id, site, capture_site, data, scope=None) */
static PyObject *emit_row(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (kwnames != NULL || (nargs != 8 && nargs != 9))
        return PyObject_Vectorcall(py_emit_row, args, nargs, kwnames);
    PyObject *f[9] = {args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7],
                      nargs == 9 ? args[8] : Py_None};
    PyObject *row = emit_fast(f);
    return row != MISS ? row : PyObject_Vectorcall(py_emit_row, args, nargs, NULL);
}

/* emit_for(handle, kind, site, capture_site, data, scope=None): emit_row with the handle's id, mode, phase and
 * session id, then the event into the handle's debug story (`handle._story.add(event)`) when it has one. */
static PyObject *emit_for(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (kwnames != NULL) { /* fields by keyword (scope=...): the Python twin, which takes them as Python does */
        PyObject *twin = PyDict_GetItemWithError(bus_dict, s_emit_for_py); /* borrowed */
        if (twin == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "ckpt_viz.bus.emit_for: bus._emit_for_py is missing.\n"
                                                    "Tip: set CKPT_VIZ_CEXT=0 and report this.");
            return NULL;
        }
        Py_INCREF(twin);
        PyObject *row = PyObject_Vectorcall(twin, args, nargs, kwnames);
        Py_DECREF(twin);
        return row;
    }
    if (nargs != 5 && nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "ckpt_viz.bus.emit_for: takes (handle, kind, site, capture_site, data, "
                                         "scope=None).\nTip: pass the fields positionally.");
        return NULL;
    }
    PyObject *handle = args[0];
    PyObject *f[9] = {args[1], NULL, NULL, NULL, NULL, args[2], args[3], args[4], nargs == 6 ? args[5] : Py_None};
    PyObject *row = NULL, *story = NULL;
    if ((f[1] = PyObject_GetAttr(handle, s_handle_id)) == NULL || (f[2] = PyObject_GetAttr(handle, s_mode)) == NULL
        || (f[3] = PyObject_GetAttr(handle, s_phase)) == NULL
        || (f[4] = PyObject_GetAttr(handle, s_session_id)) == NULL)
        goto done;
    row = emit_fast(f);
    if (row == MISS)
        row = PyObject_Vectorcall(py_emit_row, f, 9, NULL);
    if (row == NULL)
        goto done;
    if ((story = PyObject_GetAttr(handle, s_story)) == NULL) {
        Py_CLEAR(row);
        goto done;
    }
    if (story != Py_None && row != Py_None) {
        PyObject *added = PyObject_CallMethodOneArg(story, s_add, row);
        if (added == NULL)
            Py_CLEAR(row);
        Py_XDECREF(added);
    }
done:
    Py_XDECREF(story);
    for (int i = 1; i < 5; i++)
        Py_XDECREF(f[i]);
    return row;
}

/* current_scope(): this context's own scope when its innermost channel is open (the usual case, as the Python
 * returns it first), else whatever the Python says (the launch context's scope, or the empty one). */
static PyObject *current_scope(PyObject *self, PyObject *unused)
{
    PyObject *own;
    if (PyContextVar_Get(scope_var, NULL, &own) < 0)
        return NULL;
    if (own != Py_None) {
        PyObject *channels = PyObject_GetAttr(own, s_channels);
        int innermost_open = 0;
        if (channels != NULL && PyTuple_CheckExact(channels) && PyTuple_GET_SIZE(channels) > 0) {
            PyObject *is_open = PyObject_GetAttr(PyTuple_GET_ITEM(channels, PyTuple_GET_SIZE(channels) - 1), s_is_open);
            innermost_open = is_open == Py_True;
            Py_XDECREF(is_open);
        }
        Py_XDECREF(channels);
        PyErr_Clear(); /* an odd scope: the Python meets it again and raises what it raises */
        if (innermost_open)
            return own;
    }
    Py_DECREF(own);
    return PyObject_CallNoArgs(py_current_scope);
}

/* configure(bus_dict, scope_var, tags_var, no_tags, KeptRow, emit_row_py, call_site_py, skip_cache, site_cache,
 *           current_scope_py) */
static PyObject *configure(PyObject *self, PyObject *args)
{
    PyObject *d, *sv, *tv, *nt, *kt, *er, *cs, *sk, *si, *cur;
    if (!PyArg_ParseTuple(args, "O!OOOO!OOO!O!O", &PyDict_Type, &d, &sv, &tv, &nt, &PyType_Type, &kt, &er, &cs,
                          &PyDict_Type, &sk, &PyDict_Type, &si, &cur))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)kt, &PyTuple_Type) || ((PyTypeObject *)kt)->tp_basicsize
        != PyTuple_Type.tp_basicsize) {
        PyErr_SetString(PyExc_TypeError, "busfast.configure: KeptRow must be a tuple subclass without slots.\n"
                                         "Tip: keep `__slots__ = ()` on EventRow and KeptRow.");
        return NULL;
    }
    Py_XSETREF(bus_dict, Py_NewRef(d));
    Py_XSETREF(scope_var, Py_NewRef(sv));
    Py_XSETREF(tags_var, Py_NewRef(tv));
    Py_XSETREF(no_tags, Py_NewRef(nt));
    Py_XSETREF(kept_type, (PyTypeObject *)Py_NewRef(kt));
    Py_XSETREF(py_emit_row, Py_NewRef(er));
    Py_XSETREF(py_call_site, Py_NewRef(cs));
    Py_XSETREF(skip_cache, Py_NewRef(sk));
    Py_XSETREF(site_cache, Py_NewRef(si));
    Py_XSETREF(py_current_scope, Py_NewRef(cur));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS, "Give the module the bus's objects (once, from ckpt_viz.bus)."},
    {"emit_row", (PyCFunction)(void (*)(void))emit_row, METH_FASTCALL | METH_KEYWORDS, "bus.emit_row, in C."},
    {"emit_for", (PyCFunction)(void (*)(void))emit_for, METH_FASTCALL | METH_KEYWORDS, "bus.emit_for, in C."},
    {"call_site", (PyCFunction)(void (*)(void))call_site, METH_FASTCALL, "sites.call_site, in C."},
    {"current_scope", current_scope, METH_NOARGS, "bus.current_scope, in C."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "busfast", NULL, -1, methods};

PyMODINIT_FUNC PyInit_busfast(void)
{
    const char *names[] = {"_subscribers", "_tagged", "sole", "_only_rows", "handle_id", "mode", "phase",
                           "session_id", "_story", "add", "channels", "is_open", "_emit_for_py"};
    PyObject **slots[] = {&s_subscribers, &s_tagged, &s_sole, &s_only_rows, &s_handle_id, &s_mode, &s_phase,
                          &s_session_id, &s_story, &s_add, &s_channels, &s_is_open, &s_emit_for_py};
    for (int i = 0; i < 13; i++)
        if ((*slots[i] = PyUnicode_InternFromString(names[i])) == NULL)
            return NULL;
    return PyModule_Create(&module);
}
