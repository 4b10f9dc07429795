// `_C.Writer` and `_C.WriteRequest`: writes batches of tensors from memory (torch/numpy data
// pointers) through the engine's Writer with the GIL released. Targets: whatever python_io.cc
// turns into a Sink (a path/URI: temporary file + rename, uploads; a descriptor; a file object).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>

#include "bindings.h"
#include "interruptible.h"
#include "tensorizer/error.h"
#include "tensorizer/safetensors_writer.h"
#include "tensorizer/writer.h"

namespace tzpy {
namespace {

using tensorizer::ErrorCode;

class PyWriter {
 public:
  explicit PyWriter(std::unique_ptr<tensorizer::Writer> w) : writer_(std::move(w)) {}

  static tensorizer::WriterOptions options(const tensorizer::TransportOptions* transport,
                                           nb::handle key, nb::handle kdf, int num_workers) {
    tensorizer::WriterOptions opt;
    if (transport) opt.transport = *transport;
    opt.encryption = encryption_from_python(key, kdf);
    opt.num_workers = num_workers;
    return opt;
  }

  // `target`: anything sink_from_python takes (path, URI, descriptor, binary file object).
  static PyWriter* open(nb::handle target, const tensorizer::TransportOptions& transport,
                        nb::handle key, nb::handle kdf, int num_workers) {
    auto opt = options(&transport, key, kdf, num_workers);
    std::unique_ptr<tensorizer::Sink> sink = sink_from_python(target, transport);
    std::unique_ptr<tensorizer::Writer> w =
        interruptible([&] { return tensorizer::Writer::open(std::move(sink), opt); });
    return new PyWriter(std::move(w));
  }

  tensorizer::Writer& get() {
    if (!writer_) throw nb::value_error("I/O operation on a closed tensorizer writer");
    return *writer_;
  }

  void write(const std::vector<const tensorizer::WriteRequest*>& requests) {
    std::vector<tensorizer::WriteRequest> batch;
    batch.reserve(requests.size());
    for (const tensorizer::WriteRequest* r : requests) batch.push_back(*r);
    tensorizer::Writer& w = get();
    try {
      interruptible([&] {
        std::lock_guard<std::mutex> lock(mu_);
        w.write(batch);
      });
    } catch (const nb::python_error&) {  // Ctrl-C: nothing of this save is published (an
      abort();                           // engine failure already marks the writer failed)
      throw;
    }
  }

  void close() {
    if (!writer_) return;
    try {
      interruptible([&] {
        std::lock_guard<std::mutex> lock(mu_);
        writer_->close();
      });
    } catch (const nb::python_error&) {
      abort();
      throw;
    } catch (...) {
      nb::gil_scoped_release release;
      writer_.reset();
      throw;
    }
    writer_.reset();
  }

  bool closed() const { return !writer_; }

  void abort() {
    if (!writer_) return;
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    writer_->abort();
    writer_.reset();
  }

  ~PyWriter() {
    // Dropped without close(): publish what was written, as the engine's Writer does.
    if (writer_) {
      nb::gil_scoped_release release;
      writer_.reset();
    }
  }

 private:
  std::unique_ptr<tensorizer::Writer> writer_;
  std::mutex mu_;
};

}  // namespace

// The requests pointed at a snapshot of their data (tensorizer::snapshot_data), and an object
// that keeps the snapshot alive.
nb::tuple snapshot(const std::vector<const tensorizer::WriteRequest*>& requests, int workers) {
  std::vector<tensorizer::WriteRequest> copies;
  copies.reserve(requests.size());
  for (const tensorizer::WriteRequest* r : requests) copies.push_back(*r);
  std::shared_ptr<void> block =
      interruptible([&] { return tensorizer::snapshot_data(copies, workers); });
  auto* keep = new std::shared_ptr<void>(std::move(block));
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<void>*>(p); });
  nb::list out;
  for (auto& c : copies) out.append(nb::cast(std::move(c)));
  return nb::make_tuple(out, owner);
}

// One safetensors object written to `target` (path, URI, descriptor or file object) and
// committed; returns its size. The tensors' bytes stay the caller's until this returns.
uint64_t write_safetensors(
    nb::handle target, const tensorizer::TransportOptions& transport,
    const std::vector<std::string>& names, const std::vector<std::string>& dtypes,
    const std::vector<std::vector<uint64_t>>& shapes, const std::vector<uintptr_t>& addresses,
    const std::optional<std::vector<std::pair<std::string, std::string>>>& metadata,
    int num_workers) {
  if (dtypes.size() != names.size() || shapes.size() != names.size() ||
      addresses.size() != names.size())
    throw nb::value_error(
        "write_safetensors: names, dtypes, shapes and addresses differ in length");
  std::vector<tensorizer::SafetensorsTensor> tensors;
  std::vector<const void*> data;
  for (size_t i = 0; i < names.size(); ++i) {
    tensors.push_back({names[i], dtypes[i], shapes[i]});
    data.push_back(reinterpret_cast<const void*>(addresses[i]));
  }
  std::unique_ptr<tensorizer::Sink> sink = sink_from_python(target, transport);
  return interruptible(
      [&] { return tensorizer::write_safetensors(*sink, tensors, data, metadata, num_workers); });
}

void register_writer(nb::module_& m) {
  using tensorizer::WriteRequest;
  m.def("write_safetensors", &write_safetensors, nb::arg("target"), nb::arg("transport"),
        nb::arg("names"), nb::arg("dtypes"), nb::arg("shapes"), nb::arg("addresses"),
        nb::arg("metadata").none(), nb::arg("num_workers") = 0,
        "Writes one safetensors object (bytes as the safetensors library lays them out) and "
        "publishes it; on failure the target keeps what it had.");
  m.def("snapshot", &snapshot, nb::arg("requests"), nb::arg("workers") = 0,
        "Copies of `requests` whose data is a snapshot in engine memory, and its owner (keep it "
        "until the write returns).");
  nb::class_<WriteRequest>(m, "WriteRequest", "One tensor to write: where it goes and its bytes.")
      .def(
          "__init__",
          [](WriteRequest* r, nb::handle path, int type, int module_idx, std::string dtype,
             std::vector<uint64_t> shape, uintptr_t address, bool meta) {
            if (type < 0 || type > 2) throw nb::value_error("tensor type must be 0, 1 or 2");
            if (module_idx < 0 || module_idx > 0xffff)
              throw nb::value_error("module index must be in [0, 65535]");
            new (r) WriteRequest{path_from_python(path),
                                 static_cast<tensorizer::TensorType>(type),
                                 static_cast<uint16_t>(module_idx),
                                 std::move(dtype),
                                 std::move(shape),
                                 reinterpret_cast<const void*>(address),
                                 meta};
          },
          nb::arg("path"), nb::arg("type"), nb::arg("module_idx"), nb::arg("dtype"),
          nb::arg("shape"), nb::arg("address"), nb::arg("meta") = false,
          "`address`: the C-contiguous bytes (the caller keeps them alive until write() returns); "
          "`meta`: shape only, no data")
      .def_prop_ro("path", [](const WriteRequest& r) { return path_to_python(r.path); })
      .def_prop_ro("type", [](const WriteRequest& r) { return static_cast<int>(r.type); })
      .def_ro("module_idx", &WriteRequest::module_idx)
      .def_ro("dtype", &WriteRequest::dtype)
      .def_ro("shape", &WriteRequest::shape)
      .def_prop_ro("address",
                   [](const WriteRequest& r) { return reinterpret_cast<uintptr_t>(r.data); })
      .def_ro("meta", &WriteRequest::meta);

  nb::class_<PyWriter>(m, "Writer")
      .def_static("open", &PyWriter::open, nb::arg("target"), nb::arg("transport"),
                  nb::arg("key").none() = nb::none(), nb::arg("kdf").none() = nb::none(),
                  nb::arg("num_workers") = 0, nb::rv_policy::take_ownership,
                  "Opens a path, URI, file descriptor or binary file object for writing.")
      .def("write", &PyWriter::write, nb::arg("requests"))
      .def("close", &PyWriter::close)
      .def("abort", &PyWriter::abort)
      .def_prop_ro("closed", &PyWriter::closed)
      .def_prop_ro("uri", [](PyWriter& w) { return uri_to_python(w.get().uri()); })
      .def_prop_ro("version", [](PyWriter& w) { return w.get().header().version; })
      .def_prop_ro("flags", [](PyWriter& w) { return w.get().header().flags; })
      .def_prop_ro("tensor_size", [](PyWriter& w) { return w.get().header().tensor_size; })
      .def_prop_ro("tensor_count", [](PyWriter& w) { return w.get().header().tensor_count; });
}

}  // namespace tzpy
