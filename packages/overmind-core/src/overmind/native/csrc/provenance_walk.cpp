// The walk behind overmind.keys.provenance.snapshot (modules in tree order, a row per tensor), without a Python
// frame per module or per tensor: the same two lists as the Python walk, equal item for item, in a fraction of its
// time (docs/architecture.md, "Measured costs").
//
// A provenance record keeps the digest of the same reads instead (provenance_digest.cpp). Whatever is off the
// common path is handed to the Python functions the walk was given, so the result is always what Python computes:
// - a module's plain attributes are scanned as _loose_tensors does (a type outside the known non-tensor types: the
//   Python _loose_tensors decides, and learns the type);
// - a tensor whose type is not exactly torch.Tensor or torch.nn.Parameter, that is not on the CPU, has no storage
//   or an invalid one, or any tensor while a torch-function mode is active, gets its row from the Python _tensor_row.
// Every attribute read the Python walk makes through getattr (training, .grad) is made through getattr here too.
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/impl/COW.h>
#include <torch/csrc/Device.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <vector>

#include "py_access.h"
#include "zerocopy.h"

namespace py = pybind11;

namespace overmind {
namespace {

using py_access::item;
using py_access::items_of;
using py_access::steal;
using py_access::truthy;

py::object size_of(PyObject* obj) { return steal(PyLong_FromSsize_t(py_access::length(obj))); }

py::tuple tensor_row(py::handle t, PyObject* tensor_type, PyObject* parameter_type, const py::object& size_type,
                     const py::object& python_row) {
  PyTypeObject* type = Py_TYPE(t.ptr());
  if (reinterpret_cast<PyObject*>(type) != tensor_type && reinterpret_cast<PyObject*>(type) != parameter_type) {
    return python_row(t);
  }
  const at::Tensor& tensor = THPVariable_Unpack(t.ptr());
  if (!tensor.has_storage() || tensor.device().type() != c10::DeviceType::CPU) {
    return python_row(t);
  }
  const c10::Storage& storage = tensor.storage();
  if ((storage.data() == nullptr && storage.nbytes() != 0) || c10::impl::cow::is_cow_data_ptr(storage.data_ptr())) {
    return python_row(t);  // an invalid storage (Python raises), or a lazy clone (Python's data_ptr() materializes it)
  }
  const int64_t dim = tensor.dim();
  py::tuple shape(dim), stride(dim);
  const auto sizes = tensor.sizes();
  const auto strides = tensor.strides();
  for (int64_t i = 0; i < dim; ++i) {
    shape[i] = steal(PyLong_FromLongLong(sizes[i]));
    stride[i] = steal(PyLong_FromLongLong(strides[i]));
  }
  // the same reads as type(t), s.data_ptr(), s.nbytes(), t.dtype, t.shape, t.stride(), t.storage_offset(),
  // t.requires_grad, t.is_conj(), t.is_neg(), t.device
  return py::make_tuple(py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(type)),
                        steal(PyLong_FromVoidPtr(const_cast<void*>(storage.data()))),
                        steal(PyLong_FromSize_t(storage.nbytes())),
                        py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(tensor.scalar_type()))),
                        size_type(shape), stride, steal(PyLong_FromLongLong(tensor.storage_offset())),
                        py::bool_(tensor.requires_grad()), py::bool_(tensor.is_conj()), py::bool_(tensor.is_neg()),
                        steal(THPDevice_New(tensor.device())));
}

}  // namespace

py::tuple provenance_walk(py::handle root, py::handle tensor_type, py::handle parameter_type, py::handle not_tensor_types,
                          py::object loose_tensors, py::object python_row) {
  if (!PySet_Check(not_tensor_types.ptr())) {
    throw py::type_error("provenance_walk: not_tensor_types must be a set");
  }
  py::list modules, rows;
  std::vector<py::object> tensors;
  const py_access::ModuleNames names;
  py_access::each_module(root, "provenance_walk", names, [&](const py::object& m, const py::object& d) {
    PyObject* params = item(d.ptr(), names.parameters);
    PyObject* buffers = item(d.ptr(), names.buffers);
    PyObject* children = item(d.ptr(), names.modules);
    py::object prow = py::tuple(), brow = py::tuple(), lrow = py::tuple();
    if (truthy(params)) {
      py::list row;
      for (auto& [k, v] : items_of(params)) {
        if (v.is_none()) {
          continue;
        }
        row.append(py::make_tuple(k, steal(PyLong_FromVoidPtr(v.ptr())), py::bool_(v.attr(names.grad).is_none())));
        tensors.push_back(v);
      }
      prow = row;
    }
    if (truthy(buffers)) {
      py::list row;
      for (auto& [k, v] : items_of(buffers)) {
        if (v.is_none()) {
          continue;
        }
        row.append(py::make_tuple(k, steal(PyLong_FromVoidPtr(v.ptr()))));
        tensors.push_back(v);
      }
      brow = row;
    }
    // _loose_tensors: () when every attribute's type is a known non-tensor type, else the Python function decides
    if (!py_access::all_types_known(d.ptr(), not_tensor_types.ptr())) {
      py::object loose = loose_tensors(d, tensor_type);
      if (truthy(loose.ptr())) {
        py::list row;
        for (py::handle pair : loose) {
          py::tuple kv = py::reinterpret_borrow<py::tuple>(pair);
          row.append(py::make_tuple(kv[0], steal(PyLong_FromVoidPtr(kv[1].ptr()))));
          tensors.push_back(py::reinterpret_borrow<py::object>(kv[1]));
        }
        lrow = row;
      }
    }
    auto child_items = items_of(children);
    py::tuple child_names(child_items.size()), ids(child_items.size());
    for (size_t i = 0; i < child_items.size(); ++i) {
      child_names[i] = child_items[i].first;
      ids[i] = steal(PyLong_FromVoidPtr(child_items[i].second.ptr()));
    }
    modules.append(py::make_tuple(py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(m.ptr()))),
                                  m.attr(names.training), child_names, ids,
                                  size_of(item(d.ptr(), names.hooks)),
                                  size_of(item(d.ptr(), names.pre_hooks)), prow, brow, lrow));
    return child_items;
  });
  const bool mode = at::impl::torch_function_mode_enabled();
  const py::object size_type = py::module_::import("torch").attr("Size");  // THPSize_New is not exported
  for (const py::object& t : tensors) {
    rows.append(mode ? py::tuple(python_row(t))
                     : tensor_row(t, tensor_type.ptr(), parameter_type.ptr(), size_type, python_row));
  }
  return py::make_tuple(modules, rows);
}

}  // namespace overmind
