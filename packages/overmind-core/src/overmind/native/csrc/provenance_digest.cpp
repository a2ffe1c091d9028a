// The compact form a provenance record keeps of a module tree, and compares again when the module is passed to a
// later load (overmind.keys.provenance.fingerprint), built in one pass without a Python object per module or tensor.
//
// It reads what the provenance walk reads (provenance_walk.cpp), in the same order, and writes it as bytes:
// - a module: its class (address), `training`, its forward hook and pre-hook counts, then its parameters, buffers and
//   tensor attributes (each a name, the tensor's address, for a parameter whether .grad is None), then its children
//   (each a name and the child's address); a None parameter, buffer or child is written as a name and a mark, so
//   registering one shows;
// - then a row per tensor: class (address), storage address and size, dtype, shape, stride, offset, requires_grad,
//   conj, neg, device.
// Names are written as their UTF-8 with a length, every field with a fixed width or a length before it: two trees
// give equal bytes only when every field read is equal. A tensor off the common path (not a plain CPU torch.Tensor or
// Parameter, or any tensor while a torch-function mode is active) gets its row from the Python _tensor_row, written
// the same way when its values have the types of the C reads. Anything else is handed back as a Python value,
// compared with ==, with a mark in the bytes where it stands: a name that is not an exact str, a `training` that is
// not a bool, a Python row of other types. Classes are kept alive by the record (the `held` set), so an address
// written for one never stands for another class later.
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/impl/COW.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "py_access.h"
#include "zerocopy.h"

namespace py = pybind11;

namespace overmind {
namespace {

using py_access::item;
using py_access::items_of;

class Writer {
 public:
  std::string bytes;
  py::list values;  // values off the common path, in order
  py::list rows;    // rows built by the Python _tensor_row, in order
  py::list held;    // classes whose addresses are written, each once (by address: a class may be unhashable)
  std::unordered_set<PyObject*> held_seen;
  std::string ranges;  // (storage address, nbytes) of each tensor written as a row here, nbytes > 0

  void mark(char c) { bytes.push_back(c); }
  void u64(uint64_t v) { bytes.append(reinterpret_cast<const char*>(&v), sizeof v); }
  void address(const void* p) { u64(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p))); }

  void range(uint64_t address, uint64_t nbytes) {
    const uint64_t pair[2] = {address, nbytes};
    ranges.append(reinterpret_cast<const char*>(pair), sizeof pair);
  }

  void hold(PyObject* type) {
    if (held_seen.insert(type).second) {
      held.append(py::reinterpret_borrow<py::object>(type));
    }
  }

  void type_of(PyObject* obj) {
    PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(obj));
    hold(type);
    address(type);
  }

  void name(PyObject* key) {
    if (PyUnicode_CheckExact(key)) {
      Py_ssize_t n = 0;
      const char* text = PyUnicode_AsUTF8AndSize(key, &n);
      if (text != nullptr) {
        mark('s');
        u64(static_cast<uint64_t>(n));
        bytes.append(text, static_cast<size_t>(n));
        return;
      }
      PyErr_Clear();  // a lone surrogate: compared as a value
    }
    value(key);
  }

  void value(PyObject* obj) {
    mark('v');
    values.append(py::reinterpret_borrow<py::object>(obj));
  }

  void flag(PyObject* obj) {
    if (obj == Py_True) {
      mark('T');
    } else if (obj == Py_False) {
      mark('F');
    } else {
      value(obj);
    }
  }
};

// The tensors of a parameter or buffer dict: a name and an address each (for parameters, whether .grad is None)
void named_tensors(Writer& out, PyObject* mapping, bool parameters, const py::str& grad_name,
                   std::vector<py::object>& tensors) {
  auto entries = items_of(mapping);
  out.u64(entries.size());
  for (auto& [k, v] : entries) {
    out.name(k.ptr());
    if (v.is_none()) {
      out.mark('N');
      continue;
    }
    out.mark('t');
    out.address(v.ptr());
    if (parameters) {
      out.mark(v.attr(grad_name).is_none() ? 'g' : 'G');
    }
    tensors.push_back(v);
  }
}

// The fields every row writes, from C reads of the tensor or from the Python _tensor_row's values
struct RowFields {
  PyObject* type;
  uint64_t data;
  uint64_t nbytes;
  uint64_t scalar_type;
  std::vector<int64_t> sizes, strides;
  int64_t offset;
  bool requires_grad, conj, neg;
  c10::Device device{c10::DeviceType::CPU};
};

void write_row(Writer& out, const RowFields& f) {
  out.mark('R');
  out.hold(f.type);
  out.address(f.type);
  out.u64(f.data);
  out.u64(f.nbytes);
  out.u64(f.scalar_type);
  out.u64(f.sizes.size());
  for (int64_t s : f.sizes) {
    out.u64(static_cast<uint64_t>(s));
  }
  for (int64_t s : f.strides) {
    out.u64(static_cast<uint64_t>(s));
  }
  out.u64(static_cast<uint64_t>(f.offset));
  out.mark(static_cast<char>(f.requires_grad | (f.conj << 1) | (f.neg << 2)));
  out.u64(static_cast<uint64_t>(f.device.type()));
  out.u64(static_cast<uint64_t>(static_cast<int64_t>(f.device.index())));
  if (f.nbytes > 0) {
    out.range(f.data, f.nbytes);  // a storage off the CPU lies in no mapping: the page check says "changed"
  }
}

// The C reads of a plain CPU tensor: the same reads as type(t), s.data_ptr(), s.nbytes(), t.dtype, t.shape,
// t.stride(), t.storage_offset(), t.requires_grad, t.is_conj(), t.is_neg(), t.device; false off that path (another
// class, another device, no storage, an invalid storage, where Python raises, or a lazy clone, whose data_ptr()
// Python materializes)
bool read_row(PyObject* t, PyObject* tensor_type, PyObject* parameter_type, RowFields& f) {
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(t));
  if (type != tensor_type && type != parameter_type) {
    return false;
  }
  const at::Tensor& tensor = THPVariable_Unpack(t);
  if (!tensor.has_storage() || tensor.device().type() != c10::DeviceType::CPU) {
    return false;
  }
  const c10::Storage& storage = tensor.storage();
  if ((storage.data() == nullptr && storage.nbytes() != 0) || c10::impl::cow::is_cow_data_ptr(storage.data_ptr())) {
    return false;
  }
  f.type = type;
  f.data = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(storage.data()));
  f.nbytes = storage.nbytes();
  f.scalar_type = static_cast<uint64_t>(tensor.scalar_type());
  f.sizes.assign(tensor.sizes().begin(), tensor.sizes().end());
  f.strides.assign(tensor.strides().begin(), tensor.strides().end());
  f.offset = tensor.storage_offset();
  f.requires_grad = tensor.requires_grad();
  f.conj = tensor.is_conj();
  f.neg = tensor.is_neg();
  f.device = tensor.device();
  return true;
}

bool exact_int(PyObject* obj, int64_t& v) {
  if (!PyLong_CheckExact(obj)) {
    return false;
  }
  int overflow = 0;
  v = PyLong_AsLongLongAndOverflow(obj, &overflow);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return overflow == 0;
}

bool exact_bool(PyObject* obj, bool& v) {
  if (obj != Py_True && obj != Py_False) {
    return false;
  }
  v = obj == Py_True;
  return true;
}

bool int_tuple(PyObject* obj, std::vector<int64_t>& out) {
  if (!PyTuple_Check(obj)) {  // a torch.Size or a tuple: they compare equal with ==
    return false;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(obj);
  out.resize(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!exact_int(PyTuple_GET_ITEM(obj, i), out[static_cast<size_t>(i)])) {
      return false;
    }
  }
  return true;
}

// A row of the Python _tensor_row written as read_row's fields would be, where its values are of the types those
// reads give (equal values then give equal bytes, as they compared equal before); false for anything else
bool python_fields(PyObject* row, RowFields& f) {
  if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 11) {
    return false;
  }
  PyObject* const* v = &PyTuple_GET_ITEM(row, 0);
  int64_t data = 0, nbytes = 0;
  if (!PyType_Check(v[0]) || !exact_int(v[1], data) || !exact_int(v[2], nbytes) || data < 0 || nbytes < 0 ||
      !THPDtype_Check(v[3]) || !int_tuple(v[4], f.sizes) || !int_tuple(v[5], f.strides) ||
      f.sizes.size() != f.strides.size() || !exact_int(v[6], f.offset) || !exact_bool(v[7], f.requires_grad) ||
      !exact_bool(v[8], f.conj) || !exact_bool(v[9], f.neg) || !THPDevice_Check(v[10])) {
    return false;
  }
  f.type = v[0];
  f.data = static_cast<uint64_t>(data);
  f.nbytes = static_cast<uint64_t>(nbytes);
  f.scalar_type = static_cast<uint64_t>(reinterpret_cast<THPDtype*>(v[3])->scalar_type);
  f.device = reinterpret_cast<THPDevice*>(v[10])->device;
  return true;
}

void tensor_row(Writer& out, const py::object& t, PyObject* tensor_type, PyObject* parameter_type, bool mode,
                const py::object& python_row) {
  RowFields f;
  if (!mode && read_row(t.ptr(), tensor_type, parameter_type, f)) {
    write_row(out, f);
    return;
  }
  // Under a torch-function mode every row is Python's (the mode may answer the reads), as elsewhere off the path
  py::object row = python_row(t);
  if (python_fields(row.ptr(), f)) {
    write_row(out, f);
    return;
  }
  out.mark('P');
  out.rows.append(row);
}

}  // namespace

py::tuple provenance_digest(py::handle root, py::handle tensor_type, py::handle parameter_type,
                            py::handle not_tensor_types, py::object loose_tensors, py::object python_row) {
  if (!PySet_Check(not_tensor_types.ptr())) {
    throw py::type_error("provenance_digest: not_tensor_types must be a set");
  }
  Writer out;
  std::vector<py::object> tensors;
  const py_access::ModuleNames names;
  py_access::each_module(root, "provenance_digest", names, [&](const py::object& m, const py::object& d) {
    out.mark('M');
    out.type_of(m.ptr());
    out.flag(m.attr(names.training).ptr());
    out.u64(static_cast<uint64_t>(py_access::length(item(d.ptr(), names.hooks))));
    out.u64(static_cast<uint64_t>(py_access::length(item(d.ptr(), names.pre_hooks))));
    named_tensors(out, item(d.ptr(), names.parameters), true, names.grad, tensors);
    named_tensors(out, item(d.ptr(), names.buffers), false, names.grad, tensors);
    if (py_access::all_types_known(d.ptr(), not_tensor_types.ptr())) {
      out.u64(0);
    } else {
      py::object loose = loose_tensors(d, tensor_type);
      out.u64(static_cast<uint64_t>(py_access::length(loose.ptr())));
      for (py::handle pair : loose) {
        py::tuple kv = py::reinterpret_borrow<py::tuple>(pair);
        out.name(kv[0].ptr());
        out.address(kv[1].ptr());
        tensors.push_back(py::reinterpret_borrow<py::object>(kv[1]));
      }
    }
    auto children = items_of(item(d.ptr(), names.modules));
    out.u64(children.size());
    for (auto& [k, v] : children) {
      out.name(k.ptr());
      if (v.is_none()) {
        out.mark('N');
      } else {
        out.mark('c');
        out.address(v.ptr());
      }
    }
    return children;
  });
  out.mark('|');
  const bool mode = at::impl::torch_function_mode_enabled();
  for (const py::object& t : tensors) {
    tensor_row(out, t, tensor_type.ptr(), parameter_type.ptr(), mode, python_row);
  }
  return py::make_tuple(py::bytes(out.bytes), out.values, out.rows, out.held, py::bytes(out.ranges));
}

}  // namespace overmind
