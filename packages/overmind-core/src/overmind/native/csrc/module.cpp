// The Python module overmind.native._C: bindings only; the work lives in the other files of csrc/.
#include <pybind11/stl.h>
#include <torch/version.h>

#include <string>

#include "load_arena.h"
#include "zerocopy.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  // The functions build torch Python objects; torch's own module initialisation must have run first.
  py::module_::import("torch");
  m.doc() = "Compiled parts of overmind.zerocopy and overmind.shm.arena; use those modules rather than this one.";
  // The torch release whose C++ API this was compiled against: overmind.native.extension uses it under that
  // torch only (the API changes between releases).
  m.attr("TORCH_BUILT") = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                          std::to_string(TORCH_VERSION_PATCH);
  m.def("storage_from_buffer", &overmind::storage_from_buffer, py::arg("buffer"),
        "torch.UntypedStorage over a buffer's memory, without a copy; keeps the buffer's owner alive.");
  m.def("storage_from_buffer_range", &overmind::storage_from_buffer_range, py::arg("buffer"), py::arg("offset"),
        py::arg("nbytes"), "storage_from_buffer over bytes [offset, offset + nbytes) of the buffer.");
  m.def("script_module_from_storage", &overmind::script_module_from_storage, py::arg("storage"),
        py::arg("device") = py::none(),
        "torch._C.ScriptModule imported from the TorchScript archive held in a CPU storage, without "
        "copying the archive; uncompressed tensor records of a torch.package layout archive are aliased.");
  m.def("tensor_rebuilder", &overmind::tensor_rebuilder, py::arg("fallback"),
        "A compiled rebuild_from_untyped for the common tensor; any other call goes to fallback unchanged.");
  m.def("provenance_walk", &overmind::provenance_walk, py::arg("root"), py::arg("tensor_type"),
        py::arg("parameter_type"), py::arg("not_tensor_types"), py::arg("loose_tensors"), py::arg("python_row"),
        "(modules, rows) of overmind.keys.provenance.snapshot's walk of a module tree, built in C.");
  m.def("provenance_digest", &overmind::provenance_digest, py::arg("root"), py::arg("tensor_type"),
        py::arg("parameter_type"), py::arg("not_tensor_types"), py::arg("loose_tensors"), py::arg("python_row"),
        "(bytes, values, rows, held, ranges): the compact form overmind.keys.provenance.fingerprint keeps of a module "
        "tree, built in C.");
  m.def("tensor_walk", &overmind::tensor_walk, py::arg("root"), py::arg("tensor_type"), py::arg("atoms"),
        py::arg("atom_types"), py::arg("containers"), py::arg("collections"), py::arg("max_objects"),
        "The tensors a result holds, each once, or None past max_objects: overmind.entries.estimate's walk, in C.");
  m.def("stack_room", &overmind::stack_room,
        "Bytes of C stack left to the calling thread below this call; -1 when its bounds are unknown.");
  m.def("arena_open", &overmind::arena_open, py::arg("threshold"),
        "Open a load arena on this thread: its CPU allocations of threshold bytes or more go into one memfd.");
  m.def("arena_close", &overmind::arena_close, py::arg("handle"),
        "Stop placing; remap the live ranges private; return (address, size, memfd offset) of each.");
  m.def("arena_detach", &overmind::arena_detach, py::arg("handle"), py::arg("address"),
        "Give the live range at address an anonymous copy, and punch it out of the memfd.");
  m.def("arena_fd", &overmind::arena_fd, py::arg("handle"), "The arena's memfd (borrowed: dup it to keep it).");
  m.def("arena_release", &overmind::arena_release, py::arg("handle"), "Forget the arena; closes its memfd.");
  m.def("dict_marks", &overmind::dict_marks, py::arg("dicts"), py::arg("previous"),
        "(version, length, digest) of each dict, 24 bytes each: overmind.loading.writes.marks, in C.");
  m.def("dict_prefix_digest", &overmind::dict_prefix_digest, py::arg("dict"), py::arg("n"),
        "The digest dict_marks gives the first n items of a dict.");
  m.def("module_scan", &overmind::module_scan, py::arg("namespace"), py::arg("module"), py::arg("kinds"),
        py::arg("classify"), "The containers among a module's globals: overmind.loading.writes.watched's scan, in C.");
  m.def("arena_live_ranges", &overmind::arena_live_ranges, "Live ranges of all arenas in this process.");
}
