// Buffer protocol -> c10::StorageImpl whose DataPtr owns the Py_buffer.
#include <Python.h>

#include <string>

#include <c10/core/CPUAllocator.h>
#include <c10/core/Storage.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/DynamicTypes.h>

#include "zerocopy.h"

namespace py = pybind11;

namespace overmind {
namespace {

// Heap-held so the Py_buffer is filled in place and never copied: exporters may point into it.
struct HeldBuffer {
  Py_buffer view{};
};

bool interpreter_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// The storage may die on any thread (an autograd worker, a DataLoader thread), with or without the GIL.
void release_held_buffer(void* ctx) {
  auto* held = static_cast<HeldBuffer*>(ctx);
  // During interpreter shutdown the GIL cannot be taken safely; the process is exiting and its mappings
  // go with it, so leaking the reference is the correct choice.
  if (!interpreter_alive()) {
    return;
  }
  PyGILState_STATE state = PyGILState_Ensure();
  PyBuffer_Release(&held->view);
  PyGILState_Release(state);
  delete held;
}

}  // namespace

py::object storage_from_buffer_range(py::handle buffer, int64_t offset, int64_t nbytes) {
  auto held = std::make_unique<HeldBuffer>();
  // Writable first; a read-only buffer is accepted too, as the Python twin (torch.frombuffer) accepts it.
  if (PyObject_GetBuffer(buffer.ptr(), &held->view, PyBUF_WRITABLE) != 0) {
    if (!PyErr_ExceptionMatches(PyExc_BufferError)) {
      throw py::error_already_set();  // not a buffer at all: TypeError, as memoryview(x) says
    }
    PyErr_Clear();
    if (PyObject_GetBuffer(buffer.ptr(), &held->view, PyBUF_SIMPLE) != 0) {
      throw py::error_already_set();  // e.g. BufferError: not C-contiguous
    }
  }
  const auto len = static_cast<int64_t>(held->view.len);
  if (nbytes < 0) {
    nbytes = len - offset;  // to the buffer's end
  }
  if (offset < 0 || nbytes < 0 || offset > len || nbytes > len - offset) {
    PyBuffer_Release(&held->view);
    throw py::value_error("overmind: bytes [" + std::to_string(offset) + ", +" + std::to_string(nbytes) +
                          ") lie outside the buffer's " + std::to_string(len) + " bytes");
  }
  if (nbytes == 0) {
    // Nothing to alias, nothing to keep alive: the same empty storage torch.UntypedStorage(0) gives.
    PyBuffer_Release(&held->view);
    return py::reinterpret_steal<py::object>(torch::createPyObject(at::Storage(c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), 0, c10::GetDefaultCPUAllocator(), /*resizable=*/true))));
  }
  void* data = static_cast<char*>(held->view.buf) + offset;
  at::DataPtr data_ptr(data, held.get(), &release_held_buffer, at::Device(at::kCPU));
  held.release();  // owned by data_ptr from here on
  auto impl = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), static_cast<size_t>(nbytes),
                                                    std::move(data_ptr), /*allocator=*/nullptr,
                                                    /*resizable=*/false);
  PyObject* result = torch::createPyObject(at::Storage(std::move(impl)));
  if (result == nullptr) {
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(result);
}

py::object storage_from_buffer(py::handle buffer) { return storage_from_buffer_range(buffer, 0, -1); }

}  // namespace overmind
