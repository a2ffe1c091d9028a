// The marks behind overmind.loading.writes.marks: a dict's (version, length, digest of its items' identities), so a
// load can tell which of the tens of thousands of dicts its libraries hold at module level it changed, and whether a
// changed one only gained items at its end. A digest is recomputed only where the interpreter's version tag of the
// dict moved since the previous marks (PEP 509; an interpreter without the tag recomputes every digest).
#include <Python.h>

#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "zerocopy.h"

namespace py = pybind11;

namespace overmind {
namespace {

constexpr size_t kMarkBytes = 24;  // version, length, digest: three little-endian uint64

uint64_t mix(uint64_t h, uint64_t x) {
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  h ^= x;
  h = (h << 27) | (h >> 37);
  return h * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL;
}

// The identities of the first n items (key, value and the value's type), in the dict's order.
uint64_t digest(PyObject* dict, Py_ssize_t n) {
  uint64_t h = 0x84222325cbf29ce4ULL;
  Py_ssize_t pos = 0;
  PyObject* key;
  PyObject* value;
  Py_ssize_t i = 0;
  while (i < n && PyDict_Next(dict, &pos, &key, &value)) {
    h = mix(h, reinterpret_cast<uintptr_t>(key));
    h = mix(h, reinterpret_cast<uintptr_t>(value));
    h = mix(h, reinterpret_cast<uintptr_t>(Py_TYPE(value)));
    ++i;
  }
  return mix(h, static_cast<uint64_t>(i));
}

uint64_t version_of(PyObject* dict) {
#if PY_VERSION_HEX < 0x030E0000
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  return reinterpret_cast<PyDictObject*>(dict)->ma_version_tag;
#pragma GCC diagnostic pop
#else
  (void)dict;
  return 0;
#endif
}

}  // namespace

py::bytes dict_marks(py::list dicts, py::object previous) {
  const Py_ssize_t count = PyList_GET_SIZE(dicts.ptr());
  std::string out(static_cast<size_t>(count) * kMarkBytes, '\0');
  const char* prev = nullptr;
  Py_ssize_t prev_len = 0;
  if (!previous.is_none()) {
    char* buf = nullptr;
    if (PyBytes_AsStringAndSize(previous.ptr(), &buf, &prev_len) < 0) {
      throw py::error_already_set();
    }
    prev = buf;
  }
  for (Py_ssize_t i = 0; i < count; ++i) {
    PyObject* d = PyList_GET_ITEM(dicts.ptr(), i);
    if (!PyDict_Check(d)) {
      throw py::type_error("dict_marks: every item must be a dict");
    }
    uint64_t mark[3];
    mark[0] = version_of(d);
    mark[1] = static_cast<uint64_t>(PyDict_GET_SIZE(d));
    const size_t at = static_cast<size_t>(i) * kMarkBytes;
    uint64_t before[3];
    if (prev != nullptr && static_cast<Py_ssize_t>(at + kMarkBytes) <= prev_len) {
      std::memcpy(before, prev + at, kMarkBytes);
    }
    if (prev != nullptr && mark[0] != 0 && static_cast<Py_ssize_t>(at + kMarkBytes) <= prev_len &&
        before[0] == mark[0]) {
      mark[2] = before[2];
    } else {
      mark[2] = digest(d, PyDict_GET_SIZE(d));
    }
    std::memcpy(out.data() + at, mark, kMarkBytes);
  }
  return py::bytes(out);
}

uint64_t dict_prefix_digest(py::handle dict, Py_ssize_t n) {
  if (!PyDict_Check(dict.ptr())) {
    throw py::type_error("dict_prefix_digest: not a dict");
  }
  return digest(dict.ptr(), n);
}

}  // namespace overmind
