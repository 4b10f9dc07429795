// Python objects as engine Sources and Sinks: the one place where what a Python caller passes as
// "the file" becomes an engine object, so Python code never dispatches on schemes or file kinds.
//
//   str                  a local path or a URI; the engine's transports dispatch on the scheme
//   bytes, os.PathLike   always a local path, even one that looks like a URI
//   int                  an open file descriptor
//   _C.Source            shared, not opened again (so is `obj._engine_source`, which the streams
//                        of tensorizer.stream_io carry): credentials resolve and the object is
//                        probed once per open_stream, however many readers follow
//   file object          with a regular file's descriptor: read by path (page cache, O_DIRECT,
//                        mmap) or written with pwrite(2); otherwise read and written through the
//                        object's own seek/readinto/write, called under the GIL and serialized by
//                        a mutex taken before the GIL (one lock order), never copied whole into
//                        memory first. Only a source that cannot seek (a pipe) is read whole.
#include <nanobind/nanobind.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "bindings.h"
#include "interruptible.h"
#include "tensorizer/cancel.h"
#include "tensorizer/error.h"

namespace tzpy {
namespace {

using tensorizer::ErrorCode;
using tensorizer::IoSlice;

// "Type: message" of a Python exception caught in C++, with the GIL held (no traceback).
std::string python_message(nb::python_error& e) {
  return std::string(nb::type_name(e.type()).c_str()) + ": " + nb::str(e.value()).c_str();
}

// Code here may catch what a file object's method raised and carry on, but never KeyboardInterrupt
// or SystemExit (a Ctrl-C that lands inside such a call must still reach the caller): those go on.
void rethrow_unless_ordinary(nb::python_error& e) {
  if (!e.matches(PyExc_Exception)) throw;
}

// Runs `body` (GIL held), which calls into Python; returns "" or what went wrong, for a message.
// `unexpected` describes a call that returned something of the wrong type.
template <typename Body>
std::string python_failure(const char* unexpected, Body&& body) {
  try {
    body();
  } catch (nb::python_error& e) {
    rethrow_unless_ordinary(e);
    return python_message(e);
  } catch (const nb::cast_error& e) {
    return std::string(unexpected) + " (" + e.what() + ")";
  }
  return "";
}

// A seekable Python file object, read with seek + readinto (read where it has no readinto).
class PyFileSource final : public tensorizer::Source {
  struct State {
    nb::object file;
    std::string name;
    uint64_t size = 0;
    std::mutex mu;
    std::atomic<uint64_t> bytes_read{0};
    ~State() {
      nb::gil_scoped_acquire gil;  // the last reference may go on a thread without the GIL
      file.reset();
    }
  };

 public:
  // With the GIL held.
  PyFileSource(nb::object file, std::string name) : s_(std::make_shared<State>()) {
    s_->file = std::move(file);
    s_->name = std::move(name);
    s_->size = nb::cast<uint64_t>(s_->file.attr("seek")(0, 2));
  }
  explicit PyFileSource(std::shared_ptr<State> s) : s_(std::move(s)) {}

  uint64_t size() override { return s_->size; }
  void read_scatter(uint64_t offset, const IoSlice* slices, size_t count) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    nb::gil_scoped_acquire gil;
    const std::string failure = python_failure("a read returned an unexpected value", [&] {
      s_->file.attr("seek")(offset);
      for (size_t i = 0; i < count; ++i) {
        read_fully(offset, static_cast<char*>(slices[i].data), slices[i].size);
        offset += slices[i].size;
      }
    });
    if (!failure.empty())
      tensorizer::fail(ErrorCode::kIO, "reading '" + s_->name + "' at offset " +
                                           std::to_string(offset) + " failed: " + failure);
  }
  std::unique_ptr<Source> clone() override { return std::make_unique<PyFileSource>(s_); }
  const std::string& uri() const override { return s_->name; }
  uint64_t bytes_read() const override { return s_->bytes_read.load(); }
  int preferred_readers() const override { return 1; }  // calls are serialized anyway

 private:
  void read_fully(uint64_t offset, char* p, size_t n) {
    const bool has_readinto = nb::hasattr(s_->file, "readinto");
    while (n > 0) {
      tensorizer::check_cancelled();  // a slow file object must not outlast Ctrl-C
      size_t got = 0;
      if (has_readinto) {
        nb::object view =
            nb::steal(PyMemoryView_FromMemory(p, static_cast<Py_ssize_t>(n), PyBUF_WRITE));
        if (!view.is_valid()) throw nb::python_error();
        nb::object r = s_->file.attr("readinto")(view);
        got = r.is_none() ? 0 : nb::cast<size_t>(r);
      } else {
        nb::object r = s_->file.attr("read")(n);
        nb::bytes b = nb::cast<nb::bytes>(r);
        got = std::min(b.size(), n);
        std::memcpy(p, b.c_str(), got);
      }
      if (got == 0 || got > n)
        tensorizer::fail(ErrorCode::kFormat, "'" + s_->name + "' ends at byte " +
                                                 std::to_string(offset) + ", before the " +
                                                 std::to_string(n) + " more bytes expected there");
      p += got;
      n -= got;
      offset += got;
      s_->bytes_read += got;
    }
  }

  std::shared_ptr<State> s_;
};

// A Python binary file object as a Sink: pwrite(2) on its descriptor when it has one, else its
// seek/write under the GIL. Nothing to publish: commit() flushes, abort() leaves it as it is.
class PyFileSink final : public tensorizer::Sink {
 public:
  PyFileSink(nb::object file, int fd, std::string name)
      : file_(std::move(file)), fd_(fd), name_(std::move(name)) {}

  ~PyFileSink() override {
    nb::gil_scoped_acquire gil;
    file_.reset();
  }

  void write_gather(uint64_t offset, const IoSlice* slices, size_t count) override {
    if (fd_ >= 0) {
      for (size_t i = 0; i < count; ++i) {
        write_fd(offset, static_cast<const char*>(slices[i].data), slices[i].size);
        offset += slices[i].size;
      }
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    nb::gil_scoped_acquire gil;
    const std::string failure = python_failure("write() returned an unexpected value", [&] {
      for (size_t i = 0; i < count; ++i) {
        write_py(offset, static_cast<char*>(slices[i].data), slices[i].size);
        offset += slices[i].size;
      }
    });
    if (!failure.empty())
      tensorizer::fail(ErrorCode::kIO, "writing to '" + name_ + "' failed: " + failure);
  }

  void commit() override {
    if (fd_ >= 0 || !file_.is_valid()) return;
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

bool is_int(nb::handle obj) { return PyLong_Check(obj.ptr()) && !PyBool_Check(obj.ptr()); }

// str, bytes or os.PathLike as the path's bytes (os.fsencode: any name Linux allows, UTF-8 or
// not); nullopt for anything else. (A NUL byte in it is the file transport's error.)
std::optional<std::string> fs_path(nb::handle obj) {
  if (!nb::isinstance<nb::str>(obj) && !nb::isinstance<nb::bytes>(obj) &&
      !PyObject_HasAttrString(obj.ptr(), "__fspath__"))
    return std::nullopt;
  nb::object encoded = nb::module_::import_("os").attr("fsencode")(obj);
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(encoded.ptr(), &data, &size) != 0) throw nb::python_error();
  return std::string(data, static_cast<size_t>(size));
}

// A path the engine reads as a local file whatever it looks like.
std::string local_uri(const std::string& path) {
  return path.find("://") == std::string::npos ? path : "file://" + path;
}

// A str names a URI or a local path. One that is not UTF-8 (os.fsdecode keeps a name's undecodable
// bytes as surrogates) can only be a path, and is opened by its bytes.
std::string str_uri(nb::handle obj) {
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(obj.ptr(), &size);
  if (!data) {
    PyErr_Clear();
    return local_uri(*fs_path(obj));
  }
  return std::string(data, static_cast<size_t>(size));
}

// The file object's name for messages: its `name` when that is a non-empty path, else <Type>.
std::string file_label(nb::handle file) {
  if (nb::hasattr(file, "name")) {
    nb::object name = file.attr("name");
    if (nb::isinstance<nb::str>(name) || nb::isinstance<nb::bytes>(name)) {
      std::string s = *fs_path(name);
      if (!s.empty()) return s;
    }
  }
  return "<" + std::string(nb::type_name(file.type()).c_str()) + ">";
}

// The descriptor of a file object when it is a regular file, else -1.
int regular_fd(nb::handle file) {
  if (!nb::hasattr(file, "fileno")) return -1;
  int fd = -1;
  try {
    nb::object r = file.attr("fileno")();
    if (!is_int(r)) return -1;
    fd = nb::cast<int>(r);
  } catch (nb::python_error& e) {  // io.UnsupportedOperation, a closed file, ...
    rethrow_unless_ordinary(e);
    return -1;
  }
  struct stat st;
  return fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? fd : -1;
}

// A path that opens the same file as `fd`: the object's name while it still names that file,
// else /proc/self/fd/N.
std::string path_for_fd(nb::handle file, int fd) {
  const std::string label = file_label(file);
  struct stat by_fd, by_name;
  if (label.front() != '<' && ::fstat(fd, &by_fd) == 0 && ::stat(label.c_str(), &by_name) == 0 &&
      by_fd.st_dev == by_name.st_dev && by_fd.st_ino == by_name.st_ino)
    return local_uri(label);
  return "/proc/self/fd/" + std::to_string(fd);
}

bool seekable(nb::handle file) {
  if (!nb::hasattr(file, "seek")) return false;
  if (!nb::hasattr(file, "seekable")) return true;
  try {
    return nb::cast<bool>(file.attr("seekable")());
  } catch (nb::python_error& e) {
    rethrow_unless_ordinary(e);
    return false;
  }
}

std::unique_ptr<tensorizer::Source> open_uri(const std::string& uri,
                                             const tensorizer::TransportOptions& transport) {
  return interruptible([&] { return tensorizer::open_source(uri, transport); });
}

}  // namespace

nb::str uri_to_python(const std::string& uri) {
  PyObject* s = PyUnicode_DecodeFSDefaultAndSize(uri.data(), static_cast<Py_ssize_t>(uri.size()));
  if (!s) throw nb::python_error();
  return nb::steal<nb::str>(s);
}

std::unique_ptr<tensorizer::Source> source_from_python(
    nb::handle obj, const tensorizer::TransportOptions& transport) {
  // A stream's engine source, shared: the Reader owns "its" source while the stream keeps working.
  if (std::shared_ptr<tensorizer::Source> shared = engine_source_of(obj))
    return std::make_unique<tensorizer::ForwardingSource>(std::move(shared));
  if (nb::isinstance<nb::str>(obj)) return open_uri(str_uri(obj), transport);
  if (std::optional<std::string> path = fs_path(obj)) return open_uri(local_uri(*path), transport);
  if (is_int(obj))
    return open_uri("/proc/self/fd/" + std::to_string(nb::cast<int>(obj)), transport);
  const int fd = regular_fd(obj);
  if (fd >= 0) return open_uri(path_for_fd(obj, fd), transport);
  if (seekable(obj)) return std::make_unique<PyFileSource>(nb::borrow(obj), file_label(obj));
  // A pipe or another one-way stream: only a copy in memory gives random access, bounded as a FIFO
  // path is (tensorizer::pipe_read_bound).
  const std::string label = file_label(obj);
  const uint64_t bound = tensorizer::pipe_read_bound(transport.file);
  auto copy = std::make_shared<std::string>();
  nb::object read = obj.attr("read"), to_bytes = nb::module_::import_("builtins").attr("bytes");
  for (;;) {
    nb::object data = read(size_t{1} << 20);
    if (!nb::isinstance<nb::bytes>(data)) data = to_bytes(data);
    nb::bytes b = nb::cast<nb::bytes>(data);
    if (b.size() == 0) break;
    copy->append(b.c_str(), b.size());
    tensorizer::check_pipe_read(copy->size(), bound, label);
  }
  return tensorizer::make_memory_source(std::move(copy), label);
}

std::unique_ptr<tensorizer::Sink> sink_from_python(nb::handle obj,
                                                   const tensorizer::TransportOptions& transport) {
  std::string uri;
  if (nb::isinstance<nb::str>(obj)) {
    uri = str_uri(obj);
  } else if (std::optional<std::string> path = fs_path(obj)) {
    uri = local_uri(*path);
  } else if (is_int(obj)) {
    const int fd = nb::cast<int>(obj);
    return std::make_unique<PyFileSink>(nb::object(), fd, "<fd " + std::to_string(fd) + ">");
  } else {
    if (nb::hasattr(obj, "flush")) obj.attr("flush")();  // bytes it buffered come first
    return std::make_unique<PyFileSink>(nb::borrow(obj), regular_fd(obj), file_label(obj));
  }
  return interruptible([&] { return tensorizer::open_sink(uri, transport); });
}

}  // namespace tzpy
