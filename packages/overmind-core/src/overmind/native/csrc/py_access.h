// Small reads of Python objects shared by the provenance walk and the provenance digest: each raises the Python
// error the equivalent Python expression would (a missing key, a failing len() or bool()).
#pragma once

#include <Python.h>

#include <pybind11/pybind11.h>

#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

namespace overmind {
namespace py_access {

inline pybind11::object steal(PyObject* obj) {
  if (obj == nullptr) {
    throw pybind11::error_already_set();
  }
  return pybind11::reinterpret_steal<pybind11::object>(obj);
}

// (key, value) pairs of a mapping in its iteration order: PyDict_Next for an exact dict, items() for any other (an
// OrderedDict's own order can differ from its underlying dict's after move_to_end).
inline std::vector<std::pair<pybind11::object, pybind11::object>> items_of(PyObject* mapping) {
  std::vector<std::pair<pybind11::object, pybind11::object>> out;
  if (PyDict_CheckExact(mapping)) {
    out.reserve(PyDict_GET_SIZE(mapping));
    Py_ssize_t pos = 0;
    PyObject *key = nullptr, *value = nullptr;
    while (PyDict_Next(mapping, &pos, &key, &value)) {
      out.emplace_back(pybind11::reinterpret_borrow<pybind11::object>(key),
                       pybind11::reinterpret_borrow<pybind11::object>(value));
    }
    return out;
  }
  pybind11::object items = steal(PyObject_CallMethod(mapping, "items", nullptr));
  for (pybind11::handle pair : items) {
    pybind11::tuple kv = pybind11::reinterpret_borrow<pybind11::tuple>(pair);
    out.emplace_back(kv[0], kv[1]);
  }
  return out;
}

// d[key] of a dict (borrowed), with the KeyError of the Python expression when it is missing
inline PyObject* item(PyObject* dict, const pybind11::str& key) {
  PyObject* value = PyDict_GetItemWithError(dict, key.ptr());
  if (value == nullptr) {
    if (!PyErr_Occurred()) {
      PyErr_SetObject(PyExc_KeyError, key.ptr());
    }
    throw pybind11::error_already_set();
  }
  return value;
}

inline pybind11::str interned(const char* text) {
  return pybind11::reinterpret_steal<pybind11::str>(steal(PyUnicode_InternFromString(text)).release());
}

inline Py_ssize_t length(PyObject* obj) {
  const Py_ssize_t n = PyObject_Size(obj);
  if (n < 0) {
    throw pybind11::error_already_set();
  }
  return n;
}

inline bool truthy(PyObject* obj) {
  const int r = PyObject_IsTrue(obj);
  if (r < 0) {
    throw pybind11::error_already_set();
  }
  return r == 1;
}

// Whether every value of a module's __dict__ has a type in known (a set of types known not to be tensors)
inline bool all_types_known(PyObject* dict, PyObject* known) {
  Py_ssize_t pos = 0;
  PyObject *key = nullptr, *value = nullptr;
  while (PyDict_Next(dict, &pos, &key, &value)) {
    const int found = PySet_Contains(known, reinterpret_cast<PyObject*>(Py_TYPE(value)));
    if (found < 0) {
      throw pybind11::error_already_set();
    }
    if (!found) {
      return false;
    }
  }
  return true;
}

// The attribute and key names the provenance walks read, interned once per walk
struct ModuleNames {
  pybind11::str dict = interned("__dict__"), training = interned("training"), grad = interned("grad");
  pybind11::str parameters = interned("_parameters"), buffers = interned("_buffers"), modules = interned("_modules");
  pybind11::str hooks = interned("_forward_hooks"), pre_hooks = interned("_forward_pre_hooks");
};

// Each module of the tree under root once, in the order of root.modules() (pre-order, children in order):
// visit(module, its __dict__) returns the (name, child) items of the module's _modules, whose modules come next.
// `who` names the caller in the error for a __dict__ that is not a dict. Every module stays alive meanwhile.
template <typename Visit>
void each_module(pybind11::handle root, const char* who, const ModuleNames& names, Visit&& visit) {
  std::unordered_set<PyObject*> seen;
  std::vector<pybind11::object> stack{pybind11::reinterpret_borrow<pybind11::object>(root)};
  while (!stack.empty()) {
    pybind11::object m = std::move(stack.back());
    stack.pop_back();
    if (!seen.insert(m.ptr()).second) {
      continue;
    }
    pybind11::object d = m.attr(names.dict);
    if (!PyDict_Check(d.ptr())) {
      throw pybind11::type_error(std::string(who) + ": a module's __dict__ is not a dict");
    }
    const std::vector<std::pair<pybind11::object, pybind11::object>> children = visit(m, d);
    for (auto it = children.rbegin(); it != children.rend(); ++it) {
      if (!it->second.is_none()) {
        stack.push_back(it->second);
      }
    }
  }
}

}  // namespace py_access
}  // namespace overmind
