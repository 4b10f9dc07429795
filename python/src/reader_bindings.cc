// `_C.Reader`: a .tensors reader for Python. Opens whatever python_io.cc turns into a Source
// (path, URI, descriptor, file object, stream), lists the index, and loads tensors
// into memory the caller allocated (torch tensors) or the engine owns (load_host), with the GIL
// released for the whole load.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <utility>

#include "bindings.h"
#include "interruptible.h"
#include "tensorizer/dtype.h"
#include "tensorizer/error.h"
#include "tensorizer/host_load.h"
#include "tensorizer/reader.h"
#include "tensorizer/staged_load.h"

namespace tzpy {
namespace {

using tensorizer::Reader;

// A host load of fewer bytes than this from a local unencrypted file runs on the calling thread
// (interruptible's `quick`): a lazy load's tensor, read or mapped in microseconds. (An encrypted
// one may first derive its key from a passphrase: Argon2id, seconds, which Ctrl-C must end.)
constexpr uint64_t kQuickLocalBytes = 1 << 20;

// The DLPack dtype of a stored little-endian dtype string that torch takes from DLPack as is;
// nullopt for the rest (big-endian, complex32, float8: loaded as bytes and viewed in Python).
std::optional<nb::dlpack::dtype> dlpack_dtype(const std::string& stored) {
  using code = nb::dlpack::dtype_code;
  tensorizer::DType d = tensorizer::parse_dtype(stored);
  if (d.byte_order == '>') return std::nullopt;
  static const std::pair<const char*, std::pair<code, uint8_t>> kKnown[] = {
      {"torch.float16", {code::Float, 16}},     {"torch.float32", {code::Float, 32}},
      {"torch.float64", {code::Float, 64}},     {"torch.bfloat16", {code::Bfloat, 16}},
      {"torch.int8", {code::Int, 8}},           {"torch.int16", {code::Int, 16}},
      {"torch.int32", {code::Int, 32}},         {"torch.int64", {code::Int, 64}},
      {"torch.uint8", {code::UInt, 8}},         {"torch.bool", {code::Bool, 8}},
      {"torch.complex64", {code::Complex, 64}}, {"torch.complex128", {code::Complex, 128}}};
  const std::string name = d.torch_name();
  for (const auto& [torch_name, dl] : kKnown)
    if (name == torch_name) return nb::dlpack::dtype{static_cast<uint8_t>(dl.first), dl.second, 1};
  return std::nullopt;
}

// The headers one load read, moved out of the reader in request order: no copy and no Python
// object per tensor (hundreds of small objects cost a fresh process about a millisecond); Python
// asks for one tensor's module index, stored hashes or hashable header when it needs them.
struct LoadedInfos {
  LoadedInfos() = default;
  LoadedInfos(LoadedInfos&&) = default;
  LoadedInfos& operator=(LoadedInfos&&) = default;
  LoadedInfos(const LoadedInfos&) = delete;                          // owns the headers
  std::vector<std::unique_ptr<tensorizer::LoadedTensorInfo>> infos;  // null: no header read
  const tensorizer::LoadedTensorInfo* at(size_t k) const {
    return k < infos.size() ? infos[k].get() : nullptr;
  }
  // Takes entries[k]'s header details out of `r` for each k.
  static LoadedInfos take(Reader& r, const std::vector<size_t>& entries) {
    LoadedInfos out;
    out.infos.reserve(entries.size());
    for (size_t e : entries) out.infos.push_back(r.take_loaded_info(e));
    return out;
  }
};

// Owns a Reader; serializes loads from several Python threads (the GIL is released meanwhile).
class PyReader {
 public:
  explicit PyReader(std::unique_ptr<Reader> r) : reader_(std::move(r)) {}

  // `target`: anything source_from_python takes (path, URI, descriptor, file object, stream).
  static PyReader* open(nb::handle target, const tensorizer::TransportOptions& transport,
                        nb::handle key, nb::handle passphrase, nb::handle kdf_limits,
                        double deadline_s, bool expect_host_load) {
    tensorizer::ReaderOptions opt;
    opt.transport = transport;
    opt.expect_host_load = expect_host_load;
    opt.decryption = decryption_from_python(key, passphrase, kdf_limits);
    std::unique_ptr<tensorizer::Source> source = source_from_python(target, transport);
    std::optional<Deadline> deadline;
    if (deadline_s > 0) {
      deadline = Deadline{tensorizer::CancelToken::Clock::now() +
                              std::chrono::duration_cast<tensorizer::CancelToken::Clock::duration>(
                                  std::chrono::duration<double>(deadline_s)),
                          deadline_s, "loading '" + source->uri() + "'"};
    }
    std::unique_ptr<Reader> r =
        interruptible([&] { return Reader::open(std::move(source), opt); }, deadline);
    auto* out = new PyReader(std::move(r));
    out->deadline_ = std::move(deadline);
    return out;
  }

  Reader& get() {
    if (!reader_) throw nb::value_error("I/O operation on a closed tensorizer reader");
    return *reader_;
  }

  // The index, one IndexEntry per tensor (copies: they outlive the reader).
  std::vector<tensorizer::IndexEntry> entries() { return get().entries(); }

  // Loads entries[i] into addresses[i]; returns what each tensor's header said (LoadedInfos).
  LoadedInfos load(const std::vector<size_t>& indices, const std::vector<uintptr_t>& addresses,
                   int num_workers, bool verify_hash) {
    return load_into(indices, addresses, num_workers, verify_hash,
                     [](Reader& r, const auto& dests, const auto& opt) { r.load(dests, opt); });
  }

  // Reads `runs` runs of `run_bytes` of entry `index`, the first `offset` bytes in and `stride`
  // apart, packed into `address` (Reader::read_strided).
  void read_strided(size_t index, uint64_t offset, uint64_t run_bytes, uint64_t stride,
                    uint64_t runs, uintptr_t address, int num_workers) {
    tensorizer::LoadOptions opt;
    opt.num_workers = num_workers;
    Reader& r = get();
    interruptible(
        [&] {
          std::lock_guard<std::mutex> lock(mu_);
          r.read_strided(index, {offset, run_bytes, stride, runs}, reinterpret_cast<void*>(address),
                         opt);
        },
        deadline_);
  }

  // Loads entries[i] into addresses[i] through the staging ring (tensorizer/staged_load.h): device
  // memory of CUDA device `device`, or, with device -1, any host memory via the host backend.
  // `cudart` names the CUDA runtime library to use when not empty. Returns what load() returns.
  LoadedInfos load_staged(const std::vector<size_t>& indices,
                          const std::vector<uintptr_t>& addresses, int device, int num_workers,
                          bool verify_hash, uint64_t ring_bytes, const std::string& cudart) {
    tensorizer::StagingOptions staging;
    if (ring_bytes) staging.ring_bytes = ring_bytes;
    return load_into(indices, addresses, num_workers, verify_hash,
                     [&](Reader& r, const auto& dests, const auto& opt) {
                       auto backend = device < 0 ? tensorizer::host_copy_backend()
                                                 : tensorizer::cuda_copy_backend(device, 4, cudart);
                       tensorizer::load_staged(r, dests, *backend, opt, staging);
                     });
  }

  // Loads entries[i] into memory the engine owns, by the route `route` asks for ("auto", "map",
  // "direct", "copy"; see tensorizer/host_load.h); returns, per tensor, a 1-D uint8 torch tensor
  // owning its bytes (typed and shaped where DLPack can say the dtype, else 1-D uint8) and the
  // route taken; and what each tensor's header said (LoadedInfos), in the same order.
  nb::tuple load_host(const std::vector<size_t>& indices, int num_workers, bool verify_hash,
                      const std::string& route) {
    static const std::pair<const char*, tensorizer::HostRoute> kRoutes[] = {
        {"auto", tensorizer::HostRoute::kAuto},
        {"map", tensorizer::HostRoute::kMap},
        {"direct", tensorizer::HostRoute::kDirect},
        {"copy", tensorizer::HostRoute::kCopy}};
    const auto* found = std::find_if(std::begin(kRoutes), std::end(kRoutes),
                                     [&](const auto& r) { return route == r.first; });
    if (found == std::end(kRoutes))
      throw nb::value_error(
          ("route: expected auto, map, direct or copy, got '" + route + "'").c_str());
    Reader& r = get();
    tensorizer::LoadOptions opt;
    opt.num_workers = num_workers;
    opt.verify_hash = verify_hash;
    LoadedInfos infos;
    uint64_t bytes = 0;
    for (size_t i : indices) bytes += i < r.entries().size() ? r.entries()[i].data_length : 0;
    const bool quick = r.source().local_fd() >= 0 && !r.encrypted() && bytes < kQuickLocalBytes;
    std::vector<tensorizer::HostTensor> loaded = interruptible(
        [&] {
          std::lock_guard<std::mutex> lock(mu_);
          auto out = tensorizer::load_to_host(r, indices, opt, found->second);
          infos = LoadedInfos::take(r, indices);
          return out;
        },
        deadline_, quick);
    nb::list out;
    std::vector<size_t> shape;
    for (auto& t : loaded) {
      // Typed and shaped when DLPack names the dtype (one object, no views in Python); else bytes.
      const auto& e = r.entries()[t.entry];
      const auto dtype = dlpack_dtype(e.dtype);
      if (dtype)
        shape.assign(e.shape.begin(), e.shape.end());
      else
        shape.assign({t.size});
      out.append(
          nb::make_tuple(torch_tensor_over(t.data, shape, dtype.value_or(nb::dtype<uint8_t>()),
                                           std::move(t.owner)),
                         tensorizer::to_string(t.via)));
    }
    return nb::make_tuple(out, nb::cast(std::move(infos)));
  }

  // `size` raw bytes of the object at `offset` (to_redis), read straight into the new bytes object
  // (not yet visible to Python, so filling it without the GIL is safe): one copy in memory.
  nb::bytes read_raw(uint64_t offset, uint64_t size) {
    Reader& r = get();
    nb::bytes out(nullptr, size);
    char* dst = PyBytes_AsString(out.ptr());
    interruptible(
        [&] {
          std::lock_guard<std::mutex> lock(mu_);
          if (size) r.source().read_at(offset, dst, size);
        },
        deadline_);
    return out;
  }

  nb::list verify_all(int num_workers) {
    Reader& r = get();
    std::vector<std::string> mismatches = interruptible([&] {
      std::lock_guard<std::mutex> lock(mu_);
      return r.verify_all(num_workers);
    });
    nb::list out;
    for (const auto& s : mismatches) out.append(nb::str(s.data(), s.size()));
    return out;
  }

  void close() {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(mu_);
    reader_.reset();
  }
  bool closed() const { return !reader_; }

 private:
  // Runs `run` (a load into caller memory) without the GIL for entries[i] -> addresses[i];
  // returns the headers it read, in request order.
  using LoadFn = std::function<void(Reader&, const std::vector<tensorizer::TensorDestination>&,
                                    const tensorizer::LoadOptions&)>;
  LoadedInfos load_into(const std::vector<size_t>& indices, const std::vector<uintptr_t>& addresses,
                        int num_workers, bool verify_hash, const LoadFn& run) {
    if (indices.size() != addresses.size())
      throw nb::value_error("indices and addresses differ in length");
    std::vector<tensorizer::TensorDestination> dests;
    dests.reserve(indices.size());
    for (size_t k = 0; k < indices.size(); ++k)
      dests.push_back({indices[k], reinterpret_cast<void*>(addresses[k])});
    tensorizer::LoadOptions opt;
    opt.num_workers = num_workers;
    opt.verify_hash = verify_hash;
    LoadedInfos infos;
    Reader& r = get();
    interruptible(
        [&] {
          std::lock_guard<std::mutex> lock(mu_);
          run(r, dests, opt);
          infos = LoadedInfos::take(r, indices);
        },
        deadline_);
    return infos;
  }

  std::unique_ptr<Reader> reader_;
  std::mutex mu_;
  std::optional<Deadline> deadline_;  // of every engine call on this reader, from its opening
};

// A shape as a tuple of ints.
nb::tuple shape_to_python(const std::vector<uint64_t>& shape) {
  nb::tuple out = nb::steal<nb::tuple>(PyTuple_New(static_cast<Py_ssize_t>(shape.size())));
  if (!out.is_valid()) throw nb::python_error();
  for (size_t d = 0; d < shape.size(); ++d) {
    PyObject* dim = PyLong_FromUnsignedLongLong(shape[d]);
    if (!dim) throw nb::python_error();
    PyTuple_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(d), dim);
  }
  return out;
}

}  // namespace

void register_reader(nb::module_& m) {
  using tensorizer::IndexEntry;
  nb::class_<IndexEntry>(m, "IndexEntry", "One tensor of a .tensors index, as stored.")
      .def_prop_ro(
          "name", [](const IndexEntry& e) { return nb::bytes(e.name.data(), e.name.size()); },
          "the on-disk name bytes")
      .def_prop_ro(
          "path", [](const IndexEntry& e) { return path_to_python(e.path); },
          "the decoded name: a tuple of str and int components")
      .def_prop_ro(
          "type", [](const IndexEntry& e) { return static_cast<int>(e.type); }, "TensorType value")
      .def_ro("dtype", &IndexEntry::dtype, "the stored dtype string, e.g. '<f2'")
      .def_prop_ro("shape", [](const IndexEntry& e) { return shape_to_python(e.shape); })
      .def_ro("header_offset", &IndexEntry::header_offset)
      .def_ro("data_offset", &IndexEntry::data_offset)
      .def_ro("data_length", &IndexEntry::data_length,
              "stored bytes (0 for meta and empty tensors)")
      .def_prop_ro("expected_bytes", &IndexEntry::expected_bytes, "bytes of the loaded tensor")
      .def_prop_ro("is_meta", &IndexEntry::is_meta)
      .def("__repr__", [](const IndexEntry& e) {
        return "IndexEntry('" + tensorizer::display_path(e.path) + "', dtype='" + e.dtype + "', " +
               std::to_string(e.data_length) + " bytes at " + std::to_string(e.data_offset) + ")";
      });
  using tensorizer::LoadedTensorInfo;
  // Each accessor takes the tensor's position in its load's request; None where no header was read.
  nb::class_<LoadedInfos>(m, "LoadedInfos",
                          "What the tensors' own headers said, in the order a load asked for them.")
      .def("__len__", [](const LoadedInfos& l) { return l.infos.size(); })
      .def("module_idx",
           [](const LoadedInfos& l, size_t k) -> std::optional<int> {
             if (const LoadedTensorInfo* info = l.at(k)) return info->module_idx;
             return std::nullopt;
           })
      .def(
          "hashes",
          [](const LoadedInfos& l,
             size_t k) -> std::optional<std::vector<std::pair<int, nb::bytes>>> {
            const LoadedTensorInfo* info = l.at(k);
            if (!info) return std::nullopt;
            std::vector<std::pair<int, nb::bytes>> out;
            for (const auto& h : info->header.hashes)
              out.emplace_back(
                  static_cast<int>(h.type),
                  nb::bytes(info->compact_header.data() + h.value_offset, h.value_size));
            return out;
          },
          "the stored hashes: (HashType value, digest bytes)")
      .def(
          "hashable_header",
          [](const LoadedInfos& l, size_t k) -> std::optional<nb::bytes> {
            const LoadedTensorInfo* info = l.at(k);
            if (!info) return std::nullopt;
            const std::string raw = info->raw_header();
            std::string h = tensorizer::hashable_header(
                reinterpret_cast<const uint8_t*>(raw.data()), raw.size(), info->header);
            return nb::bytes(h.data(), h.size());
          },
          "the header bytes the stored hashes cover (zeroed hash values)");

  nb::class_<tensorizer::NamedRange>(m, "NamedRange", "A named byte range of the file.")
      .def_ro("name", &tensorizer::NamedRange::name,
              "\"header\" (prelude and index) or the tensor's stored name")
      .def_ro("offset", &tensorizer::NamedRange::offset)
      .def_ro("size", &tensorizer::NamedRange::size)
      .def("__repr__", [](const tensorizer::NamedRange& p) {
        return "NamedRange(" + p.name + ", " + std::to_string(p.offset) + ", " +
               std::to_string(p.size) + ")";
      });

  nb::class_<PyReader>(m, "Reader")
      .def_static("open", &PyReader::open, nb::arg("target"), nb::arg("transport"),
                  nb::arg("key").none() = nb::none(), nb::arg("passphrase").none() = nb::none(),
                  nb::arg("kdf_limits").none() = nb::none(), nb::arg("deadline") = 0.0,
                  nb::arg("expect_host_load") = false, nb::rv_policy::take_ownership,
                  "Opens a path, URI, file descriptor, binary file object or _C.Source; "
                  "expect_host_load: every tensor will be loaded with load_host next.")
      .def("entries", &PyReader::entries)
      .def(
          "index_rows",
          [](PyReader& r) {
            // One tuple per tensor, made here in one pass: no IndexEntry copy or wrapper and no
            // attribute call per field (what a load of hundreds of tensors pays per entry).
            const auto& entries = r.get().entries();
            nb::list rows;
            for (const tensorizer::IndexEntry& e : entries) {
              rows.append(nb::make_tuple(path_to_python(e.path), static_cast<int>(e.type), e.dtype,
                                         shape_to_python(e.shape), e.header_offset, e.data_offset,
                                         e.data_length, e.expected_bytes()));
            }
            return rows;
          },
          "(path, type, dtype, shape, header_offset, data_offset, data_length, expected_bytes) "
          "of every tensor, in index order")
      .def(
          "object_parts",
          [](PyReader& r) { return tensorizer::object_parts(r.get().header(), r.get().entries()); },
          "How the file is cut into separately stored values (the Redis layout), in order.")
      .def("load", &PyReader::load, nb::arg("indices"), nb::arg("addresses"),
           nb::arg("num_workers") = 0, nb::arg("verify_hash") = false)
      .def("load_staged", &PyReader::load_staged, nb::arg("indices"), nb::arg("addresses"),
           nb::arg("device"), nb::arg("num_workers") = 0, nb::arg("verify_hash") = false,
           nb::arg("ring_bytes") = 0, nb::arg("cudart") = "")
      .def("read_strided", &PyReader::read_strided, nb::arg("index"), nb::arg("offset"),
           nb::arg("run_bytes"), nb::arg("stride"), nb::arg("runs"), nb::arg("address"),
           nb::arg("num_workers") = 0,
           "Reads only `runs` runs of `run_bytes` of one tensor, from byte `offset`, `stride` "
           "apart, packed (no hash check).")
      .def("load_host", &PyReader::load_host, nb::arg("indices"), nb::arg("num_workers") = 0,
           nb::arg("verify_hash") = false, nb::arg("route") = "auto")
      .def("read_raw", &PyReader::read_raw, nb::arg("offset"), nb::arg("size"))
      .def("verify_all", &PyReader::verify_all, nb::arg("num_workers") = 0)
      .def("close", &PyReader::close)
      .def_prop_ro("closed", &PyReader::closed)
      .def_prop_ro("uri", [](PyReader& r) { return uri_to_python(r.get().uri()); })
      .def_prop_ro("version", [](PyReader& r) { return r.get().header().version; })
      .def_prop_ro(
          "format",
          [](PyReader& r) {
            return r.get().format() == tensorizer::FileFormat::kSafetensors ? "safetensors"
                                                                            : "tensorizer";
          },
          "'tensorizer' or 'safetensors'")
      .def_prop_ro(
          "metadata",
          [](PyReader& r) {
            nb::dict out;
            for (const auto& [k, v] : r.get().metadata()) out[nb::str(k.data(), k.size())] = v;
            return out;
          },
          "safetensors' __metadata__ strings (empty for .tensors files)")
      .def_prop_ro("flags", [](PyReader& r) { return r.get().header().flags; })
      .def_prop_ro("tensor_size", [](PyReader& r) { return r.get().header().tensor_size; })
      .def_prop_ro("tensor_count", [](PyReader& r) { return r.get().header().tensor_count; })
      .def_prop_ro("index_size", [](PyReader& r) { return r.get().header().index_size; })
      .def_prop_ro("encrypted", [](PyReader& r) { return r.get().encrypted(); })
      .def_prop_ro("bytes_read", [](PyReader& r) { return r.get().bytes_read(); })
      .def_prop_ro("host_bytes_premapped",
                   [](PyReader& r) { return r.get().host_bytes_premapped(); })
      .def_prop_ro("cache_status", [](PyReader& r) { return r.get().source().cache_status(); });
}

}  // namespace tzpy
