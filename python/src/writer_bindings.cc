// `_C.Writer`: writes batches of tensors from memory (torch/numpy data pointers) through the
// engine's Writer with the GIL released. Targets: a path/URI (engine sinks: temporary file +
// rename, uploads), or an open Python binary file object. For file objects, a Sink below writes
// with pwrite(2) on the object's descriptor when it has one, else calls the object's seek/write
// under the GIL (serialized by a mutex, taken before the GIL to keep one lock order).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "bindings.h"
#include "tensorizer/error.h"
#include "tensorizer/writer.h"

namespace tzpy {
namespace {

using tensorizer::ErrorCode;

class PyFileSink final : public tensorizer::Sink {
 public:
  PyFileSink(nb::object file, int fd, std::string name)
      : file_(std::move(file)), fd_(fd), name_(std::move(name)) {}

  ~PyFileSink() override {
    // The file object may be released from a thread without the GIL.
    nb::gil_scoped_acquire gil;
    file_.reset();
  }

  void write_gather(uint64_t offset, const tensorizer::IoSlice* slices, size_t count) override {
    if (fd_ >= 0) {
      for (size_t i = 0; i < count; ++i) {
        write_fd(offset, static_cast<const char*>(slices[i].data), slices[i].size);
        offset += slices[i].size;
      }
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    nb::gil_scoped_acquire gil;
    try {
      for (size_t i = 0; i < count; ++i) {
        write_py(offset, static_cast<char*>(slices[i].data), slices[i].size);
        offset += slices[i].size;
      }
    } catch (const tensorizer::Error&) {
      throw;
    } catch (const std::exception& e) {  // a Python exception or a failed cast
      tensorizer::fail(ErrorCode::kIO, "writing to '" + name_ + "' failed: " + e.what());
    }
  }

  void commit() override {
    if (fd_ >= 0) return;
    std::lock_guard<std::mutex> lock(mu_);
    nb::gil_scoped_acquire gil;
    if (nb::hasattr(file_, "flush")) file_.attr("flush")();
  }
  void abort() override {}
  const std::string& uri() const override { return name_; }

 private:
  void write_fd(uint64_t offset, const char* p, size_t n) {
    while (n > 0) {
      ssize_t w = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0)
        tensorizer::fail(ErrorCode::kIO, "writing to '" + name_ + "' at offset " +
                                             std::to_string(offset) +
                                             " failed: " + std::strerror(w < 0 ? errno : EIO));
      p += w;
      n -= static_cast<size_t>(w);
      offset += static_cast<uint64_t>(w);
    }
  }

  void write_py(uint64_t offset, char* p, size_t n) {
    file_.attr("seek")(offset);
    while (n > 0) {
      // A read-only memoryview over the engine's bytes: no copy into a Python object.
      nb::object view =
          nb::steal(PyMemoryView_FromMemory(p, static_cast<Py_ssize_t>(n), PyBUF_READ));
      if (!view.is_valid()) throw nb::python_error();
      nb::object r = file_.attr("write")(view);
      size_t w = r.is_none() ? n : nb::cast<size_t>(r);
      if (w == 0 || w > n)
        tensorizer::fail(ErrorCode::kIO,
                         "writing to '" + name_ + "': write() returned " + std::to_string(w));
      p += w;
      n -= w;
    }
  }

  nb::object file_;
  int fd_;
  std::string name_;
  std::mutex mu_;
};

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

  static PyWriter* open(const std::string& uri, const tensorizer::TransportOptions& transport,
                        nb::handle key, nb::handle kdf, int num_workers) {
    auto opt = options(&transport, key, kdf, num_workers);
    std::unique_ptr<tensorizer::Writer> w;
    {
      nb::gil_scoped_release release;
      w = tensorizer::Writer::open(uri, opt);
    }
    return new PyWriter(std::move(w));
  }

  static PyWriter* to_file(nb::object file, int fd, const std::string& name, nb::handle key,
                           nb::handle kdf, int num_workers) {
    auto opt = options(nullptr, key, kdf, num_workers);
    auto sink = std::make_unique<PyFileSink>(std::move(file), fd, name);
    return new PyWriter(tensorizer::Writer::open(std::move(sink), opt));
  }

  tensorizer::Writer& get() {
    if (!writer_) throw nb::value_error("I/O operation on a closed tensorizer writer");
    return *writer_;
  }

  // requests: [(path, type, module_idx, dtype, shape, address, meta)]
  void write(nb::list requests) {
    std::vector<tensorizer::WriteRequest> batch;
    batch.reserve(requests.size());
    for (nb::handle h : requests) {
      nb::tuple t = nb::cast<nb::tuple>(h);
      if (t.size() != 7) throw nb::value_error("write request must have 7 fields");
      tensorizer::WriteRequest r;
      r.path = path_from_python(t[0]);
      int type = nb::cast<int>(t[1]);
      if (type < 0 || type > 2) throw nb::value_error("tensor type must be 0, 1 or 2");
      r.type = static_cast<tensorizer::TensorType>(type);
      int idx = nb::cast<int>(t[2]);
      if (idx < 0 || idx > 0xffff) throw nb::value_error("module index must be in [0, 65535]");
      r.module_idx = static_cast<uint16_t>(idx);
      r.dtype = nb::cast<std::string>(t[3]);
      r.shape = nb::cast<std::vector<uint64_t>>(t[4]);
      r.data = reinterpret_cast<const void*>(nb::cast<uintptr_t>(t[5]));
      r.meta = nb::cast<bool>(t[6]);
      batch.push_back(std::move(r));
    }
    tensorizer::Writer& w = get();
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    w.write(batch);
  }

  void close() {
    if (!writer_) return;
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    try {
      writer_->close();
    } catch (...) {
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

void register_writer(nb::module_& m) {
  nb::class_<PyWriter>(m, "Writer")
      .def_static("open", &PyWriter::open, nb::arg("uri"), nb::arg("transport"),
                  nb::arg("key").none() = nb::none(), nb::arg("kdf").none() = nb::none(),
                  nb::arg("num_workers") = 0, nb::rv_policy::take_ownership)
      .def_static("to_file", &PyWriter::to_file, nb::arg("file"), nb::arg("fd"), nb::arg("name"),
                  nb::arg("key").none() = nb::none(), nb::arg("kdf").none() = nb::none(),
                  nb::arg("num_workers") = 0, nb::rv_policy::take_ownership)
      .def("write", &PyWriter::write, nb::arg("requests"))
      .def("close", &PyWriter::close)
      .def("abort", &PyWriter::abort)
      .def_prop_ro("closed", &PyWriter::closed)
      .def_prop_ro("uri", [](PyWriter& w) { return w.get().uri(); })
      .def_prop_ro("version", [](PyWriter& w) { return w.get().header().version; })
      .def_prop_ro("flags", [](PyWriter& w) { return w.get().header().flags; })
      .def_prop_ro("tensor_size", [](PyWriter& w) { return w.get().header().tensor_size; })
      .def_prop_ro("tensor_count", [](PyWriter& w) { return w.get().header().tensor_count; });
}

}  // namespace tzpy
