// The walk behind overmind.entries.estimate.storages, without a Python frame per object: the tensors a result holds,
// each once, found by the reads its Python twin (estimate._python_tensors) makes, in less time (docs/architecture.md,
// "Measured costs").
//
// Every test is the Python expression's C form: isinstance is PyObject_IsInstance (a proxy's __class__ answers),
// getattr(obj, "__dict__", None) clears only an AttributeError, a dict or collection of a type other than the
// builtin one is read through its own values() or iter(), and the truth value of a builtin container is its
// length. A walk meeting more than max_objects objects gives up (None).
#include <Python.h>

#include <pybind11/pybind11.h>

#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "py_access.h"
#include "zerocopy.h"

namespace py = pybind11;

namespace overmind {
namespace {

using py_access::steal;

enum Kind { kTensor, kMapping, kCollection, kClass, kOther };

bool is_instance(PyObject* obj, PyObject* cls) {
  const int r = PyObject_IsInstance(obj, cls);
  if (r < 0) {
    throw py::error_already_set();
  }
  return r == 1;
}

bool contains(PyObject* set, PyObject* item) {
  const int r = PySet_Contains(set, item);
  if (r < 0) {
    throw py::error_already_set();
  }
  return r == 1;
}

// estimate._kind: by isinstance, in this order
Kind kind_of(PyObject* obj, PyObject* tensor_type, PyObject* collections) {
  if (is_instance(obj, tensor_type)) {
    return kTensor;
  }
  if (is_instance(obj, reinterpret_cast<PyObject*>(&PyDict_Type))) {
    return kMapping;
  }
  if (is_instance(obj, collections)) {
    return kCollection;
  }
  if (is_instance(obj, reinterpret_cast<PyObject*>(&PyType_Type))) {
    return kClass;
  }
  return kOther;
}

// Whether every instance of type answers isinstance alike: no class on its MRO but object defines __class__
bool kind_fixed_by_type(PyTypeObject* type, PyObject* class_name) {
  PyObject* mro = type->tp_mro;
  if (mro == nullptr || !PyTuple_Check(mro)) {
    return false;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(mro);
  for (Py_ssize_t i = 0; i + 1 < n; ++i) {
    PyObject* dict = reinterpret_cast<PyTypeObject*>(PyTuple_GET_ITEM(mro, i))->tp_dict;
    if (dict != nullptr) {
      const int r = PyDict_Contains(dict, class_name);
      if (r < 0) {
        throw py::error_already_set();
      }
      if (r == 1) {
        return false;
      }
    }
  }
  return true;
}

// The items of obj as the Python walk iterates them: a builtin dict's values, list's or tuple's items are read in
// place; anything else through values() (a mapping) or iter() (a collection)
void children_of(PyObject* obj, bool mapping, std::vector<py::object>& out) {
  out.clear();
  // an OrderedDict's values are its dict's (only their order differs, which the walk does not depend on)
  if (mapping && (PyDict_CheckExact(obj) || Py_IS_TYPE(obj, &PyODict_Type))) {
    Py_ssize_t pos = 0;
    PyObject *key = nullptr, *value = nullptr;
    out.reserve(PyDict_GET_SIZE(obj));
    while (PyDict_Next(obj, &pos, &key, &value)) {
      out.push_back(py::reinterpret_borrow<py::object>(value));
    }
    return;
  }
  if (!mapping && (PyList_CheckExact(obj) || PyTuple_CheckExact(obj))) {
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
    out.reserve(n);
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(obj); ++i) {
      out.push_back(py::reinterpret_borrow<py::object>(PySequence_Fast_GET_ITEM(obj, i)));
    }
    return;
  }
  py::object iterable = mapping ? steal(PyObject_CallMethod(obj, "values", nullptr))
                                : py::reinterpret_borrow<py::object>(obj);
  py::object it = steal(PyObject_GetIter(iterable.ptr()));
  while (PyObject* item = PyIter_Next(it.ptr())) {
    out.push_back(steal(item));
  }
  if (PyErr_Occurred()) {
    throw py::error_already_set();
  }
}

}  // namespace

py::object tensor_walk(py::handle root, py::handle tensor_type, py::handle atoms, py::handle atom_types,
                       py::handle containers, py::handle collections, Py_ssize_t max_objects) {
  if (!PyAnySet_Check(atom_types.ptr()) || !PyAnySet_Check(containers.ptr())) {
    throw py::type_error("tensor_walk: atom_types and containers must be sets");
  }
  py::list tensors;
  std::unordered_set<PyObject*> seen;
  std::unordered_map<PyTypeObject*, Kind> kinds;
  const py::str dict_name = py_access::interned("__dict__");
  const py::str class_name = py_access::interned("__class__");
  // every object pushed stays alive until the walk ends (a values() view or __dict__ may be made afresh)
  std::vector<py::object> held;
  std::vector<py::object> stack{py::reinterpret_borrow<py::object>(root)};
  std::vector<py::object> children;
  Py_ssize_t met = 0;
  while (!stack.empty()) {
    py::object obj = std::move(stack.back());
    stack.pop_back();
    if (!seen.insert(obj.ptr()).second) {
      continue;
    }
    held.push_back(obj);
    if (++met > max_objects) {
      return py::none();
    }
    PyTypeObject* type = Py_TYPE(obj.ptr());
    Kind kind;
    auto known = kinds.find(type);
    if (known != kinds.end()) {
      kind = known->second;
    } else {
      kind = kind_of(obj.ptr(), tensor_type.ptr(), collections.ptr());
      if (kind_fixed_by_type(type, class_name.ptr())) {
        kinds.emplace(type, kind);
      }
    }
    if (kind == kTensor) {
      tensors.append(obj);
      continue;
    }
    if (kind == kClass) {
      continue;
    }
    if (kind == kMapping || kind == kCollection) {
      children_of(obj.ptr(), kind == kMapping, children);
    } else {
      PyObject* d = PyObject_GetAttr(obj.ptr(), dict_name.ptr());
      if (d == nullptr) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
          throw py::error_already_set();
        }
        PyErr_Clear();
        continue;
      }
      py::object attrs = steal(d);
      if (!is_instance(attrs.ptr(), reinterpret_cast<PyObject*>(&PyDict_Type))) {
        continue;
      }
      held.push_back(attrs);
      children_of(attrs.ptr(), true, children);
    }
    bool all_atoms = true;
    for (const py::object& c : children) {
      if (!contains(atom_types.ptr(), reinterpret_cast<PyObject*>(Py_TYPE(c.ptr())))) {
        all_atoms = false;
        break;
      }
    }
    if (all_atoms) {
      continue;
    }
    for (py::object& c : children) {
      PyObject* ctype = reinterpret_cast<PyObject*>(Py_TYPE(c.ptr()));
      if (contains(atom_types.ptr(), ctype) || seen.count(c.ptr()) != 0) {
        continue;
      }
      if (contains(containers.ptr(), ctype)) {  // a builtin container is no atom: only its emptiness is asked
        if (!py_access::truthy(c.ptr())) {
          continue;
        }
      } else if (is_instance(c.ptr(), atoms.ptr())) {
        continue;
      }
      stack.push_back(std::move(c));
    }
  }
  return std::move(tensors);
}

}  // namespace overmind
