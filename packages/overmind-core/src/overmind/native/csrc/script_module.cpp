// TorchScript archive held in a storage -> torch::jit::Module, reading the archive where it lies.
//
// torch._C.import_ir_module_from_buffer copies its input into a std::string first; here a
// ReadAdapterInterface serves the ZIP reader straight from the storage's memory. For the torch.package
// layout (what overmind/entries/torchscript.py writes) every tensor record is pre-supplied to the unpickler through
// a DeserializationStorageContext as a storage aliasing the archive, so parameters are not copied either.
// A plain torch.jit.save archive reuses record keys across its two pickles ("data/0", "constants/0"),
// so its records cannot be supplied by key: it loads with the archive read in place but records copied.
#include <algorithm>
#include <cstring>
#include <memory>
#include <regex>
#include <stdexcept>

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>
#include <torch/csrc/jit/serialization/storage_context.h>

#include "zerocopy.h"

namespace py = pybind11;
using caffe2::serialize::PyTorchStreamReader;
using caffe2::serialize::ReadAdapterInterface;

namespace overmind {
namespace {

// Serves reads from memory owned by a c10::Storage; holding the Storage keeps that memory valid.
class StorageReadAdapter final : public ReadAdapterInterface {
 public:
  explicit StorageReadAdapter(c10::Storage storage)
      : storage_(std::move(storage)),
        data_(static_cast<const char*>(storage_.data())),
        size_(storage_.nbytes()) {}

  size_t size() const override { return size_; }

  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= size_) {
      return 0;
    }
    n = std::min<size_t>(n, size_ - pos);
    std::memcpy(buf, data_ + pos, n);
    return n;
  }

 private:
  c10::Storage storage_;
  const char* data_;
  size_t size_;
};

// DataPtr context of a record storage: a reference to the whole archive storage.
struct ArchiveReference {
  c10::Storage archive;
};

void release_archive_reference(void* ctx) { delete static_cast<ArchiveReference*>(ctx); }

uint16_t read_le16(const char* p) {
  return static_cast<uint16_t>(static_cast<unsigned char>(p[0]) | (static_cast<unsigned char>(p[1]) << 8));
}

uint32_t read_le32(const char* p) {
  return static_cast<uint32_t>(read_le16(p)) | (static_cast<uint32_t>(read_le16(p + 2)) << 16);
}

// The record's bytes as they lie in the archive, or nullptr when it is compressed or looks malformed
// (then the reader's ordinary, copying path handles it).
const char* stored_record_data(PyTorchStreamReader& reader, const c10::Storage& archive,
                               const std::string& name, size_t* size) {
  const auto* base = static_cast<const char*>(archive.data());
  const size_t total = archive.nbytes();
  const size_t header = reader.getRecordHeaderOffset(name);
  constexpr size_t kLocalHeaderSize = 30;
  if (header + kLocalHeaderSize > total || read_le32(base + header) != 0x04034b50u) {
    return nullptr;
  }
  if (read_le16(base + header + 8) != 0) {  // compression method 0 = stored
    return nullptr;
  }
  const size_t offset = reader.getRecordOffset(name);
  *size = reader.getRecordSize(name);
  if (offset > total || *size > total - offset) {
    return nullptr;
  }
  return base + offset;
}

// "<id>" of the single ".data/ts_code/<id>/data.pkl", or "" for a plain torch.jit.save archive.
std::string package_module_id(const std::vector<std::string>& records) {
  static const std::regex pickle(R"(^\.data/ts_code/([^/]+)/data\.pkl$)");
  std::vector<std::string> ids;
  for (const auto& name : records) {
    std::smatch match;
    if (std::regex_match(name, match, pickle) && match[1] != "code") {
      ids.push_back(match[1]);
    }
  }
  if (ids.size() > 1) {
    throw py::value_error("overmind: the TorchScript archive holds " + std::to_string(ids.size()) +
                          " modules; script_module_from_storage reads archives of exactly one module, "
                          "as torchscript.py writes them.");
  }
  return ids.empty() ? std::string() : ids.front();
}

// Every uncompressed ".data/<key>.storage" record, as a storage aliasing the archive, by key.
std::shared_ptr<torch::jit::DeserializationStorageContext> alias_records(PyTorchStreamReader& reader,
                                                                         const c10::Storage& archive,
                                                                         const std::vector<std::string>& records) {
  static const std::string prefix = ".data/";
  static const std::string suffix = ".storage";
  auto context = std::make_shared<torch::jit::DeserializationStorageContext>();
  for (const auto& name : records) {
    const bool is_tensor = name.size() > prefix.size() + suffix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
                           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
                           name.find('/', prefix.size()) == std::string::npos;
    if (!is_tensor) {
      continue;
    }
    size_t size = 0;
    const char* data = stored_record_data(reader, archive, name, &size);
    if (data == nullptr) {
      continue;
    }
    at::DataPtr data_ptr(const_cast<char*>(data), new ArchiveReference{archive}, &release_archive_reference,
                         at::Device(at::kCPU));
    c10::Storage record(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), size,
                                                               std::move(data_ptr), /*allocator=*/nullptr,
                                                               /*resizable=*/false));
    context->addStorage(name.substr(prefix.size()), std::move(record));
  }
  return context;
}

}  // namespace

py::object script_module_from_storage(py::handle storage_obj, std::optional<std::string> device) {
  if (!torch::isStorage(storage_obj.ptr())) {
    throw py::type_error("overmind: script_module_from_storage expects a torch.UntypedStorage, got " +
                         std::string(Py_TYPE(storage_obj.ptr())->tp_name) + ".");
  }
  c10::Storage archive = torch::createStorage(storage_obj.ptr());
  if (!archive.device().is_cpu()) {
    throw py::value_error("overmind: a TorchScript archive must be held in a CPU storage, got one on " +
                          archive.device().str() + "; move it with storage.cpu() first.");
  }
  std::optional<at::Device> target;
  if (device) {
    target = at::Device(*device);
  }
  torch::jit::Module module;
  {
    // Import touches no Python object; release the GIL so other threads run meanwhile.
    py::gil_scoped_release no_gil;
    auto cu = std::make_shared<torch::jit::CompilationUnit>();
    auto reader = std::make_shared<PyTorchStreamReader>(std::make_shared<StorageReadAdapter>(archive));
    const auto records = reader->getAllRecords();
    const std::string module_id = package_module_id(records);
    if (module_id.empty()) {
      torch::jit::ExtraFilesMap extra_files;
      module = torch::jit::import_ir_module(cu, std::make_shared<StorageReadAdapter>(archive), target, extra_files);
    } else {
      module = torch::jit::import_ir_module(cu, reader, alias_records(*reader, archive, records), target, module_id);
    }
  }
  return py::cast(module);
}

}  // namespace overmind
