// The scan behind overmind.loading.writes.watched: the containers among one module's globals, found without a Python
// frame per global (a process with torch, transformers and diffusers holds ~200,000 of them in ~4,000 modules). The
// kind of each value comes from its type in the kinds table (classify(type) answers and fills it for a type not in
// it yet), by type(), never isinstance: a lazy module's proxy must not be asked its __class__.
#include <Python.h>

#include <pybind11/pybind11.h>

#include "zerocopy.h"

namespace py = pybind11;

namespace overmind {

py::list module_scan(py::dict namespace_, py::str module, py::dict kinds, py::object classify) {
  py::list out;
  PyObject* other = PyUnicode_InternFromString("other");
  PyObject* klass = PyUnicode_InternFromString("class");
  Py_ssize_t pos = 0;
  PyObject* name;
  PyObject* value;
  while (PyDict_Next(namespace_.ptr(), &pos, &name, &value)) {
    PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(value));
    PyObject* kind = PyDict_GetItemWithError(kinds.ptr(), type);  // borrowed
    py::object held;
    if (kind == nullptr) {
      if (PyErr_Occurred()) {
        throw py::error_already_set();
      }
      held = classify(py::handle(type));
      kind = held.ptr();
    }
    if (PyUnicode_Compare(kind, other) == 0 || !PyUnicode_Check(name)) {
      continue;
    }
    const bool is_class = PyUnicode_Compare(kind, klass) == 0;
    if (!is_class && PyUnicode_GetLength(name) > 1 && PyUnicode_ReadChar(name, 0) == '_' &&
        PyUnicode_ReadChar(name, 1) == '_') {
      continue;  // a module's own dunders (__warningregistry__, __all__, __annotations__) are no registries
    }
    if (!is_class) {
      out.append(py::make_tuple(py::handle(kind), py::handle(name), py::handle(value)));
      continue;
    }
    // a class the module defines under this name: its attributes' dict (not an alias, not a nested class)
    PyObject* attributes = reinterpret_cast<PyTypeObject*>(value)->tp_dict;
    if (attributes == nullptr || !PyDict_CheckExact(attributes)) {  // not a ctypes StgDict: as the twin
      continue;
    }
    PyObject* defined_in = PyDict_GetItemString(attributes, "__module__");  // borrowed
    if (defined_in == nullptr || !PyUnicode_Check(defined_in) || PyUnicode_Compare(defined_in, module.ptr()) != 0) {
      continue;
    }
    PyObject* qualname = PyObject_GetAttrString(value, "__qualname__");
    if (qualname == nullptr) {
      PyErr_Clear();
      continue;
    }
    const bool same = PyUnicode_Check(qualname) && PyUnicode_Compare(qualname, name) == 0;
    Py_DECREF(qualname);
    if (same) {
      out.append(py::make_tuple(py::handle(kind), py::handle(name), py::handle(attributes)));
    }
  }
  return out;
}

}  // namespace overmind
