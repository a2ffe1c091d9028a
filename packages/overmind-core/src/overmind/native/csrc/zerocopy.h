// overmind.native._C: the compiled half of native/zerocopy.py (and of the provenance walk, keys/provenance.py).
//
// Each function has a pure-Python twin in zerocopy.py with the same signature and behaviour; the test
// suite runs against both. Keep them in step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <pybind11/pybind11.h>

namespace overmind {

// buffer -> torch.UntypedStorage over the buffer's memory (no copy). The storage holds the Py_buffer, hence
// a reference to the buffer's owner, until its last user is gone. A 0-byte buffer gives an empty storage.
pybind11::object storage_from_buffer(pybind11::handle buffer);

// The same over bytes [offset, offset + nbytes) of the buffer (nbytes < 0: to its end), without a slice object:
// a mapped entry's storages are ranges of one view (shm/reader.py). ValueError for a range outside the buffer.
pybind11::object storage_from_buffer_range(pybind11::handle buffer, int64_t offset, int64_t nbytes);

// Bytes of C stack left to the calling thread below this call, or -1 when the bounds are unknown (stack_room.cpp).
int64_t stack_room();

// CPU storage holding a TorchScript ZIP archive -> torch._C.ScriptModule. The archive is read in place;
// the uncompressed tensor records of a torch.package layout archive become storages aliasing it.
pybind11::object script_module_from_storage(pybind11::handle storage, std::optional<std::string> device);

// fallback (overmind.tensors' Python rebuild_from_untyped) -> a compiled function with its signature that builds
// the common tensor itself and hands every other call to fallback unchanged (tensor_rebuild.cpp).
pybind11::object tensor_rebuilder(pybind11::handle fallback);

// module -> (modules, rows): what overmind.provenance's Python walk builds for a snapshot, equal item for item; the
// cases off the common path go to loose_tensors and python_row, the Python functions it uses (provenance_walk.cpp).
pybind11::tuple provenance_walk(pybind11::handle root, pybind11::handle tensor_type, pybind11::handle parameter_type,
                                pybind11::handle not_tensor_types, pybind11::object loose_tensors,
                                pybind11::object python_row);

// module -> (bytes, values, rows, held, ranges): the compact form overmind.keys.provenance.fingerprint keeps and
// compares, with the storage ranges its page check asks about (provenance_digest.cpp).
pybind11::tuple provenance_digest(pybind11::handle root, pybind11::handle tensor_type, pybind11::handle parameter_type,
                                  pybind11::handle not_tensor_types, pybind11::object loose_tensors,
                                  pybind11::object python_row);

// result -> the tensors it holds, each once, or None past max_objects objects: what overmind.entries.estimate's
// Python walk finds (tensor_walk.cpp).
pybind11::object tensor_walk(pybind11::handle root, pybind11::handle tensor_type, pybind11::handle atoms,
                             pybind11::handle atom_types, pybind11::handle containers, pybind11::handle collections,
                             Py_ssize_t max_objects);

// [dict] -> bytes: each dict's (version, length, digest of its items' identities) as three uint64; a digest is taken
// from previous where the dict's version has not moved (dict_marks.cpp).
pybind11::bytes dict_marks(pybind11::list dicts, pybind11::object previous);

// The digest dict_marks gives a dict holding only the first n items of this one (dict_marks.cpp).
uint64_t dict_prefix_digest(pybind11::handle dict, Py_ssize_t n);

// [(kind, name, container)] of the containers among a module's globals: kinds maps a type to its kind ("other":
// none), classify(type) answers for a type not in it; a class's container is its attributes' dict (module_scan.cpp).
pybind11::list module_scan(pybind11::dict namespace_, pybind11::str module, pybind11::dict kinds,
                           pybind11::object classify);

}  // namespace overmind
