// `_C.Source`, `_C.Sink` and `_C.upload_file`: the engine's transports as Python file-like
// building blocks for tensorizer.stream_io (open_stream on URIs for reading and writing, uploads).
// Reads land directly in the caller's buffer with the GIL released. A Reader opened over a
// `_C.Source` (or a stream carrying one) shares it: nothing is resolved or probed again.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <memory>
#include <mutex>

#include "bindings.h"
#include "interruptible.h"
#include "tensorizer/error.h"
#include "tensorizer/transport.h"

namespace tzpy {
namespace {

// A writable contiguous buffer of any object supporting the buffer protocol.
class WritableBuffer {
 public:
  explicit WritableBuffer(nb::handle obj) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0)
      throw nb::python_error();
  }
  ~WritableBuffer() { PyBuffer_Release(&view_); }
  WritableBuffer(const WritableBuffer&) = delete;
  WritableBuffer& operator=(const WritableBuffer&) = delete;
  void* data() const { return view_.buf; }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_{};
};

class PySource {
 public:
  explicit PySource(std::unique_ptr<tensorizer::Source> s) : source_(std::move(s)) {}

  static PySource* open(nb::handle target, const tensorizer::TransportOptions& transport) {
    return new PySource(source_from_python(target, transport));
  }

  tensorizer::Source& get() {
    if (!source_) throw nb::value_error("I/O operation on a closed stream");
    return *source_;
  }
  const std::shared_ptr<tensorizer::Source>& shared() const { return source_; }

  // Reads min(len(buffer), size - offset) bytes at `offset` into `buffer`; returns the count.
  size_t read_into(uint64_t offset, nb::handle buffer) {
    std::shared_ptr<tensorizer::Source> keep = source_;  // a concurrent close() cannot free it
    tensorizer::Source& s = get();
    WritableBuffer buf(buffer);
    return interruptible([&] {
      std::lock_guard<std::mutex> lock(mu_);
      const uint64_t size = s.size();
      size_t n = 0;
      if (offset < size) {
        n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size - offset));
        if (n) s.read_at(offset, buf.data(), n);
      }
      return n;
    });
  }

  // Readers opened over this source keep it alive; closing drops only this handle.
  void close() { source_.reset(); }
  bool closed() const { return !source_; }

 private:
  std::shared_ptr<tensorizer::Source> source_;
  std::mutex mu_;
};

// A Sink for a Python writable stream: writes at offsets (the GIL released), then commit() once.
class PySink {
 public:
  static PySink* open(nb::handle target, const tensorizer::TransportOptions& transport) {
    auto* s = new PySink();
    s->sink_ = sink_from_python(target, transport);
    return s;
  }
  ~PySink() {
    if (sink_) {  // never committed: what was written is discarded
      nb::gil_scoped_release release;
      sink_->abort();
    }
  }

  tensorizer::Sink& get() {
    if (!sink_) throw nb::value_error("I/O operation on a closed stream");
    return *sink_;
  }

  void write_at(uint64_t offset, nb::bytes data) {
    tensorizer::Sink& s = get();
    interruptible([&] {
      std::lock_guard<std::mutex> lock(mu_);
      s.write_at(offset, data.c_str(), data.size());
    });
  }

  // Publishes what was written (an upload, a rename); the sink is closed whatever happens.
  void commit() {
    std::unique_ptr<tensorizer::Sink> s = std::move(sink_);
    if (!s) return;
    interruptible([&] {
      try {
        s->commit();
      } catch (...) {
        s->abort();
        throw;
      }
    });
  }

  void abort() {
    std::unique_ptr<tensorizer::Sink> s = std::move(sink_);
    if (!s) return;
    nb::gil_scoped_release release;
    s->abort();
  }

  bool closed() const { return !sink_; }

 private:
  std::unique_ptr<tensorizer::Sink> sink_;
  std::mutex mu_;
};

// Copies a local file to any sink URI (S3 upload, another path) with the engine's streaming copy.
uint64_t upload_file(const std::string& path, const std::string& uri,
                     const tensorizer::TransportOptions& transport) {
  return interruptible([&] { return tensorizer::copy_object(path, uri, transport); });
}

}  // namespace

std::shared_ptr<tensorizer::Source> engine_source_of(nb::handle obj) {
  nb::handle h = obj;
  nb::object attr;
  if (!nb::isinstance<PySource>(h)) {
    if (!nb::hasattr(obj, "_engine_source")) return nullptr;
    attr = obj.attr("_engine_source");
    if (!nb::isinstance<PySource>(attr)) return nullptr;
    h = attr;
  }
  const std::shared_ptr<tensorizer::Source>& s = nb::cast<PySource&>(h).shared();
  if (!s) throw nb::value_error("I/O operation on a closed stream");
  return s;
}

void register_source(nb::module_& m) {
  nb::class_<PySource>(m, "Source")
      .def_static("open", &PySource::open, nb::arg("target"), nb::arg("transport"),
                  nb::rv_policy::take_ownership,
                  "Opens a path, URI, file descriptor or binary file object for reading.")
      .def("read_into", &PySource::read_into, nb::arg("offset"), nb::arg("buffer"))
      .def("close", &PySource::close)
      .def_prop_ro("closed", &PySource::closed)
      .def_prop_ro("size",
                   [](PySource& s) {
                     tensorizer::Source& src = s.get();
                     nb::gil_scoped_release release;
                     return src.size();
                   })
      .def_prop_ro("uri", [](PySource& s) { return uri_to_python(s.get().uri()); })
      .def_prop_ro("bytes_read", [](PySource& s) { return s.get().bytes_read(); });
  nb::class_<PySink>(m, "Sink")
      .def_static("open", &PySink::open, nb::arg("target"), nb::arg("transport"),
                  nb::rv_policy::take_ownership,
                  "Opens a path, URI, file descriptor or binary file object for writing.")
      .def("write_at", &PySink::write_at, nb::arg("offset"), nb::arg("data"))
      .def("commit", &PySink::commit, "Publishes what was written; closes the sink.")
      .def("abort", &PySink::abort, "Discards what was written; closes the sink.")
      .def_prop_ro("closed", &PySink::closed)
      .def_prop_ro("uri", [](PySink& s) { return uri_to_python(s.get().uri()); });
  m.def("upload_file", &upload_file, nb::arg("path"), nb::arg("uri"), nb::arg("transport"),
        "Copies a local file to `uri` through the engine (e.g. an S3 upload); returns the bytes "
        "copied.");
}

}  // namespace tzpy
