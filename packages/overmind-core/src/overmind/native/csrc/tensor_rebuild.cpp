// The common case of overmind.native.tensors.rebuild_from_untyped (an exact CPU `UntypedStorage`, no state or
// gradient, no torch-function mode), without Python frames or torch's argument parser; any other call is handed to
// the Python function unchanged.
//
// A warm pipeline load rebuilds ~2,700 tensors, and the Python function spends most of each rebuild parsing the
// arguments of torch.empty and Tensor.set_ (docs/architecture.md, "Measured costs"). This does the same two
// operations through the dispatcher (so inference mode, dispatch modes and deterministic fills behave as they do
// for the Python calls), sets the recorded version counter as torch._C._autograd._unsafe_set_version_counter does,
// and wraps the result. Anything off the common path is handed, unchanged, to the Python function the rebuilder
// was made with: a storage that is not an exact CPU torch.UntypedStorage, tensor state or a gradient, a plain
// tensor that requires grad, or an active torch-function mode (torch.device(...) as a context manager,
// set_default_device), which the Python calls would consult and these do not.
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include "zerocopy.h"

namespace py = pybind11;

namespace overmind {
namespace {

// self of the function object: (python_fallback, Tensor._make_subclass, torch.nn.Parameter)
// storage, dtype, offset, size, stride, requires_grad, is_parameter, state[, grad, version]: entries written before
// the version was recorded pass the first eight
constexpr Py_ssize_t kArgs = 8;
constexpr Py_ssize_t kArgsWithVersion = 10;

bool int_tuple(PyObject* obj, c10::SmallVector<int64_t, 6>& out) {
  if (!PyTuple_CheckExact(obj)) {
    return false;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(obj);
  out.resize(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyTuple_GET_ITEM(obj, i);
    if (!PyLong_CheckExact(item)) {
      return false;
    }
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(item, &overflow);
    if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return false;
    }
    out[i] = v;
  }
  return true;
}

PyObject* call_fallback(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  return PyObject_Vectorcall(PyTuple_GET_ITEM(self, 0), args, nargs, nullptr);
}

PyObject* rebuild_plain_tensor(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if ((nargs != kArgs && nargs != kArgsWithVersion) || !THPStorage_CheckExact(args[0]) || !THPDtype_Check(args[1]) || !PyLong_CheckExact(args[2]) ||
      args[7] != Py_None || (args[5] != Py_True && args[5] != Py_False) ||
      (args[6] != Py_True && args[6] != Py_False)) {
    return call_fallback(self, args, nargs);
  }
  long long version = -1;  // -1: leave the counter as the rebuild leaves it
  if (nargs == kArgsWithVersion) {
    if (args[8] != Py_None || (args[9] != Py_None && !PyLong_CheckExact(args[9]))) {
      return call_fallback(self, args, nargs);  // a gradient, or a version of another type
    }
    if (args[9] != Py_None) {
      int overflow = 0;
      version = PyLong_AsLongLongAndOverflow(args[9], &overflow);
      if (overflow != 0 || version < 0) {
        PyErr_Clear();
        return call_fallback(self, args, nargs);  // the Python function raises what torch raises
      }
    }
  }
  const bool requires_grad = args[5] == Py_True;
  const bool is_parameter = args[6] == Py_True;
  if ((requires_grad && !is_parameter) || at::impl::torch_function_mode_enabled()) {
    return call_fallback(self, args, nargs);
  }
  const c10::Storage& storage = THPStorage_Unpack(args[0]);
  if (storage.device_type() != c10::DeviceType::CPU) {
    return call_fallback(self, args, nargs);
  }
  int overflow = 0;
  const long long offset = PyLong_AsLongLongAndOverflow(args[2], &overflow);
  c10::SmallVector<int64_t, 6> size, stride;
  if (overflow != 0 || (offset == -1 && PyErr_Occurred()) || !int_tuple(args[3], size) || !int_tuple(args[4], stride)) {
    PyErr_Clear();
    return call_fallback(self, args, nargs);
  }
  const auto dtype = reinterpret_cast<THPDtype*>(args[1])->scalar_type;
  at::Tensor t = at::empty({0}, at::TensorOptions().dtype(dtype));
  t.set_(storage, offset, size, stride);
  if (version >= 0 && !t.is_inference()) {
    // as torch._C._autograd._unsafe_set_version_counter: a copy of the counter handle shares its count
    c10::VariableVersion counter = t.unsafeGetTensorImpl()->version_counter();
    counter.set_version(version);
  }
  PyObject* tensor = THPVariable_Wrap(std::move(t));
  if (tensor == nullptr || !is_parameter) {
    return tensor;
  }
  // What Parameter(t, requires_grad) does for a plain tensor: Tensor._make_subclass(Parameter, t, requires_grad).
  PyObject* sub_args[3] = {PyTuple_GET_ITEM(self, 2), tensor, args[5]};
  PyObject* param = PyObject_Vectorcall(PyTuple_GET_ITEM(self, 1), sub_args, 3, nullptr);
  Py_DECREF(tensor);
  return param;
  END_HANDLE_TH_ERRORS
}

PyMethodDef rebuild_def = {
    "rebuild_from_untyped", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&rebuild_plain_tensor)),
    METH_FASTCALL, "overmind.native.tensors.rebuild_from_untyped, compiled for the common case."};

}  // namespace

py::object tensor_rebuilder(py::handle fallback) {
  py::module_ torch = py::module_::import("torch");
  py::object make_subclass = torch.attr("Tensor").attr("_make_subclass");
  py::object parameter = torch.attr("nn").attr("Parameter");
  py::tuple self = py::make_tuple(fallback, make_subclass, parameter);
  PyObject* fn = PyCFunction_New(&rebuild_def, self.ptr());
  if (fn == nullptr) {
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(fn);
}

}  // namespace overmind
