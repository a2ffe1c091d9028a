// The Python module overmind._C: bindings only; the work lives in the other files of csrc/.
#include <pybind11/stl.h>

#include "zerocopy.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  // The functions build torch Python objects; torch's own module initialisation must have run first.
  py::module_::import("torch");
  m.doc() = "Compiled speedups of overmind.zerocopy; use overmind.zerocopy rather than this module.";
  m.def("storage_from_buffer", &overmind::storage_from_buffer, py::arg("buffer"),
        "torch.UntypedStorage over a buffer's memory, without a copy; keeps the buffer's owner alive.");
  m.def("script_module_from_storage", &overmind::script_module_from_storage, py::arg("storage"),
        py::arg("device") = py::none(),
        "torch._C.ScriptModule imported from the TorchScript archive held in a CPU storage, without "
        "copying the archive; uncompressed tensor records of a torch.package layout archive are aliased.");
}
