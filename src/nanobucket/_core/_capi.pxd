# CPython C-API functions that Cython's own cpython/*.pxd do not declare (or
# declare without the exception value we need), declared once for every module.
from cpython.object cimport PyObject


cdef extern from "Python.h":
    object PyByteArray_FromStringAndSize(char *s, Py_ssize_t n)
    char *PyByteArray_AS_STRING(object o)
    bint PyComplex_Check(object o)
    double PyFloat_AS_DOUBLE(object o)
    bint PyFloat_CheckExact(object o)
    bint PyLong_Check(object o)
    object PyLong_FromDouble(double v)
    bint PyNumber_Check(object o)
    Py_ssize_t PySequence_Fast_GET_SIZE(object o)
    PyObject **PySequence_Fast_ITEMS(object o)
    const char *PyUnicode_AsUTF8AndSize(object o, Py_ssize_t *size) except NULL
    bint PyUnicode_CheckExact(object o)
