/* ownersfast: the captured-parameter check of a recorded reentrant backward, in C (NOTE [ C speed-ups ] in
 * ckpt_viz/cext.py; the callers are in ckpt_viz/runtime/owners.py, whose Python stays the reference).
 *
 *   current_facts(entry, module): the OwnerFacts of a cache entry (weakref, facts) when the weakref still gives
 *       `module` and the module tree's signature equals the one kept (owners.NOTE [ Owner facts cache ], rule 2),
 *       else None (Python then rebuilds the entry, or walks an odd tree, as before).
 *   grad_states(params): owners.grad_states (the parameters that require grad, their .grad, its _version or -1).
 *   captured_states(cache, Module, function): grad_states of the cached current facts of the module owning
 *       `function` (owners.captured_states), else None.
 *   report_key(before, channels): the key of owners.captured_report (shapes, names, accumulated), or None where
 *       Python must do it (an odd value anywhere: the Python then computes the same key, or raises the same error).
 * Only generic attribute reads: no torch headers. Nothing is kept between calls.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *s_parameters, *s_buffers, *s_modules, *s_submodules, *s_signature, *s_requires_grad, *s_grad,
    *s_version, *s_shape, *s_names, *s_params, *s_minus_one;

/* owners._signature((module, *submodules)): ids of the 3 dicts of each module, their sizes, ids of their values;
 * NULL without an exception where a module's dict is missing or not a plain dict (Python decides then). */
static PyObject *signature(PyObject *module, PyObject *submodules)
{
    Py_ssize_t count = 1 + PyTuple_GET_SIZE(submodules), values = 0;
    PyObject *names[3] = {s_parameters, s_buffers, s_modules};
    PyObject **dicts = PyMem_Calloc((size_t)(3 * count), sizeof(PyObject *));
    Py_ssize_t *sizes = PyMem_Calloc((size_t)(3 * count), sizeof(Py_ssize_t));
    PyObject *result = NULL;
    if (dicts == NULL || sizes == NULL) {
        PyMem_Free(dicts);
        PyMem_Free(sizes);
        return NULL;
    }
    for (Py_ssize_t m = 0; m < count; m++) {
        PyObject *owner = m == 0 ? module : PyTuple_GET_ITEM(submodules, m - 1);
        for (int k = 0; k < 3; k++) {
            PyObject *d = PyObject_GetAttr(owner, names[k]);
            dicts[3 * m + k] = d;
            if (d == NULL || !PyDict_CheckExact(d))
                goto done;
            sizes[3 * m + k] = PyDict_GET_SIZE(d);
            values += sizes[3 * m + k];
        }
    }
    Py_ssize_t n = 3 * count;
    result = PyTuple_New(2 * n + values);
    if (result == NULL)
        goto done;
    /* Python code may have run since the sizes were read (a later module's attribute read, a collection in
     * PyTuple_New running a finalizer): a dict whose size changed means a tree in flux, and Python decides. */
    Py_ssize_t at = 2 * n, end = 2 * n + values;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyDict_GET_SIZE(dicts[i]) != sizes[i]) {
            Py_CLEAR(result);
            goto done;
        }
        PyObject *id = PyLong_FromVoidPtr(dicts[i]), *size = PyLong_FromSsize_t(PyDict_GET_SIZE(dicts[i]));
        if (id == NULL || size == NULL) {
            Py_XDECREF(id);
            Py_XDECREF(size);
            Py_CLEAR(result);
            goto done;
        }
        PyTuple_SET_ITEM(result, i, id);
        PyTuple_SET_ITEM(result, n + i, size);
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(dicts[i], &pos, &key, &value)) { /* dict.values order */
            if (at >= end) { /* never with the sizes checked above; kept so no write can pass the tuple's end */
                Py_CLEAR(result);
                goto done;
            }
            PyObject *vid = PyLong_FromVoidPtr(value);
            if (vid == NULL) {
                Py_CLEAR(result);
                goto done;
            }
            PyTuple_SET_ITEM(result, at++, vid);
        }
    }
done:
    for (Py_ssize_t i = 0; i < 3 * count; i++)
        Py_XDECREF(dicts[i]);
    PyMem_Free(dicts);
    PyMem_Free(sizes);
    if (result == NULL)
        PyErr_Clear();
    return result;
}

static PyObject *current_facts(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyTuple_CheckExact(args[0]) || PyTuple_GET_SIZE(args[0]) != 2
        || !PyWeakref_CheckRef(PyTuple_GET_ITEM(args[0], 0)))
        Py_RETURN_NONE;
    PyObject *module = args[1], *found = PyTuple_GET_ITEM(args[0], 1);
    if (PyWeakref_GetObject(PyTuple_GET_ITEM(args[0], 0)) != module) /* borrowed; Py_None once dead */
        Py_RETURN_NONE;
    PyObject *submodules = PyObject_GetAttr(found, s_submodules);
    PyObject *kept = submodules != NULL ? PyObject_GetAttr(found, s_signature) : NULL;
    PyObject *now = kept != NULL && PyTuple_CheckExact(submodules) ? signature(module, submodules) : NULL;
    int same = now != NULL ? PyObject_RichCompareBool(now, kept, Py_EQ) : 0;
    Py_XDECREF(now);
    Py_XDECREF(kept);
    Py_XDECREF(submodules);
    if (same != 1) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return Py_NewRef(found);
}

static PyObject *grad_states(PyObject *self, PyObject *arg);

/* captured_states(cache, Module, function): grad_states(facts(owner).params) for the module that owns `function`
 * (the function itself, or the module of a bound method), when the cache holds current facts for it (as
 * ReentrantCheckpointHandle._captured then owners.grad_states); None where Python must look (no module, no
 * current entry). */
static PyObject *captured_states(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyDict_CheckExact(args[0]) || !PyType_Check(args[1]))
        Py_RETURN_NONE;
    PyObject *cache = args[0], *owner = args[2];
    PyTypeObject *module_type = (PyTypeObject *)args[1];
    if (!PyObject_TypeCheck(owner, module_type)) {
        owner = PyMethod_Check(owner) ? PyMethod_GET_SELF(owner) : NULL; /* a bound method's __self__ */
        if (owner == NULL || !PyObject_TypeCheck(owner, module_type))
            Py_RETURN_NONE;
    }
    PyObject *key = PyLong_FromVoidPtr(owner);
    if (key == NULL)
        return NULL;
    PyObject *entry = PyDict_GetItemWithError(cache, key); /* borrowed */
    Py_DECREF(key);
    if (entry == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Py_INCREF(entry); /* current_facts reads attributes, which may run Python that drops the entry from the cache */
    PyObject *pair[2] = {entry, owner};
    PyObject *found = current_facts(self, pair, 2);
    Py_DECREF(entry);
    if (found == NULL || found == Py_None)
        return found;
    PyObject *params = PyObject_GetAttr(found, s_params);
    Py_DECREF(found);
    if (params == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *states = grad_states(self, params);
    Py_DECREF(params);
    return states;
}

/* getattr(obj, "_version", -1), as a new reference; NULL on an error other than AttributeError */
static PyObject *version_of(PyObject *obj)
{
    PyObject *v = PyObject_GetAttr(obj, s_version);
    if (v == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        v = Py_NewRef(s_minus_one);
    }
    return v;
}

static PyObject *grad_states(PyObject *self, PyObject *arg)
{
    PyObject *params = PySequence_Tuple(arg);
    if (params == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(params), kept = 0;
    PyObject *chosen = PyTuple_New(n), *grads = NULL, *versions = NULL, *result = NULL;
    if (chosen == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) { /* itertools.compress(params, map(requires_grad, params)) */
        PyObject *p = PyTuple_GET_ITEM(params, i), *flag = PyObject_GetAttr(p, s_requires_grad);
        int on = flag != NULL ? PyObject_IsTrue(flag) : -1;
        Py_XDECREF(flag);
        if (on < 0)
            goto done;
        if (on)
            PyTuple_SET_ITEM(chosen, kept++, Py_NewRef(p));
    }
    if (_PyTuple_Resize(&chosen, kept) < 0)
        goto done;
    grads = PyTuple_New(kept);
    versions = PyTuple_New(kept);
    if (grads == NULL || versions == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < kept; i++) {
        PyObject *g = PyObject_GetAttr(PyTuple_GET_ITEM(chosen, i), s_grad);
        if (g == NULL)
            goto done;
        PyTuple_SET_ITEM(grads, i, g);
    }
    for (Py_ssize_t i = 0; i < kept; i++) {
        PyObject *v = version_of(PyTuple_GET_ITEM(grads, i));
        if (v == NULL)
            goto done;
        PyTuple_SET_ITEM(versions, i, v);
    }
    result = PyTuple_Pack(3, chosen, grads, versions);
done:
    Py_DECREF(params);
    Py_XDECREF(chosen);
    Py_XDECREF(grads);
    Py_XDECREF(versions);
    return result;
}

/* The name the innermost channel naming `p` gives it (as bus.name_of), a new reference (None: unnamed); NULL
 * without an exception where a names mapping is not a plain dict. */
static PyObject *name_of(PyObject *p, PyObject *named)
{
    PyObject *key = PyLong_FromVoidPtr(p);
    if (key == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(named); i++) {
        PyObject *n = PyDict_GetItemWithError(PyList_GET_ITEM(named, i), key); /* borrowed */
        if (n == NULL && PyErr_Occurred())
            break;
        if (n != NULL && n != Py_None) {
            Py_DECREF(key);
            return Py_NewRef(n);
        }
    }
    Py_DECREF(key);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *report_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyTuple_CheckExact(args[0]) || PyTuple_GET_SIZE(args[0]) != 3 || !PyTuple_CheckExact(args[1]))
        Py_RETURN_NONE;
    PyObject *params = PyTuple_GET_ITEM(args[0], 0), *old = PyTuple_GET_ITEM(args[0], 1);
    PyObject *versions = PyTuple_GET_ITEM(args[0], 2), *channels = args[1];
    if (!PyTuple_CheckExact(params) || !PyTuple_CheckExact(old) || !PyTuple_CheckExact(versions)
        || PyTuple_GET_SIZE(old) != PyTuple_GET_SIZE(params) || PyTuple_GET_SIZE(versions) != PyTuple_GET_SIZE(params))
        Py_RETURN_NONE;
    Py_ssize_t n = PyTuple_GET_SIZE(params);
    PyObject *named = PyList_New(0), *shapes = PyTuple_New(n), *accumulated = PyTuple_New(n), *names = NULL;
    PyObject *key = NULL;
    if (named == NULL || shapes == NULL || accumulated == NULL)
        goto done;
    /* named = [c.names for c in reversed(channels) if c.names], each a plain dict */
    for (Py_ssize_t i = PyTuple_GET_SIZE(channels) - 1; i >= 0; i--) {
        PyObject *d = PyObject_GetAttr(PyTuple_GET_ITEM(channels, i), s_names);
        int some = d != NULL && PyDict_CheckExact(d) ? PyObject_IsTrue(d) : -1;
        if (some > 0 && PyList_Append(named, d) < 0)
            some = -1;
        Py_XDECREF(d);
        if (some < 0)
            goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PyTuple_GET_ITEM(params, i);
        PyObject *grad = PyObject_GetAttr(p, s_grad);
        PyObject *shape = grad != NULL ? PyObject_GetAttr(p, s_shape) : NULL;
        PyObject *version = shape != NULL ? version_of(grad) : NULL;
        int hit = 0;
        if (version == NULL || !PyLong_CheckExact(version) || !PyLong_CheckExact(PyTuple_GET_ITEM(versions, i))) {
            Py_XDECREF(grad);
            Py_XDECREF(shape);
            Py_XDECREF(version);
            goto done;
        }
        /* a .grad now, and a new one or the old one written in place (its version moved) */
        if (grad != Py_None) {
            hit = grad != PyTuple_GET_ITEM(old, i);
            if (!hit)
                hit = PyObject_RichCompareBool(version, PyTuple_GET_ITEM(versions, i), Py_NE);
        }
        Py_DECREF(grad);
        Py_DECREF(version);
        if (hit < 0) {
            Py_DECREF(shape);
            goto done;
        }
        PyTuple_SET_ITEM(shapes, i, shape);
        PyTuple_SET_ITEM(accumulated, i, Py_NewRef(hit ? Py_True : Py_False));
    }
    if (PyList_GET_SIZE(named) == 0) {
        names = PyTuple_New(0);
    } else {
        names = PyTuple_New(n);
        for (Py_ssize_t i = 0; names != NULL && i < n; i++) {
            PyObject *name = name_of(PyTuple_GET_ITEM(params, i), named);
            if (name == NULL)
                goto done;
            PyTuple_SET_ITEM(names, i, name);
        }
    }
    if (names != NULL)
        key = PyTuple_Pack(3, shapes, names, accumulated);
done:
    Py_XDECREF(named);
    Py_XDECREF(shapes);
    Py_XDECREF(accumulated);
    Py_XDECREF(names);
    if (key == NULL) { /* Python computes it again, and raises what it raises */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return key;
}

static PyMethodDef methods[] = {
    {"current_facts", (PyCFunction)(void (*)(void))current_facts, METH_FASTCALL, "A cache entry's facts, if current."},
    {"grad_states", grad_states, METH_O, "owners.grad_states, in C."},
    {"captured_states", (PyCFunction)(void (*)(void))captured_states, METH_FASTCALL,
     "grad_states of the cached module facts of a function's owner, or None."},
    {"report_key", (PyCFunction)(void (*)(void))report_key, METH_FASTCALL, "owners.captured_report's key, or None."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "ownersfast", NULL, -1, methods};

PyMODINIT_FUNC PyInit_ownersfast(void)
{
    const char *names[] = {"_parameters", "_buffers", "_modules", "submodules", "signature", "requires_grad", "grad",
                           "_version", "shape", "names", "params"};
    PyObject **slots[] = {&s_parameters, &s_buffers, &s_modules, &s_submodules, &s_signature, &s_requires_grad,
                          &s_grad, &s_version, &s_shape, &s_names, &s_params};
    for (int i = 0; i < 11; i++)
        if ((*slots[i] = PyUnicode_InternFromString(names[i])) == NULL)
            return NULL;
    if ((s_minus_one = PyLong_FromLong(-1)) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
