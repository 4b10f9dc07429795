// `tensorizer._C`: the nanobind extension module. Registers the engine's error translation,
// dtype helpers, transport options, key helpers, Reader and Writer. The Python package
// (python/tensorizer) is the public API; this module is private glue.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <string_view>

#include "bindings.h"
#include "tensorizer/dtype.h"
#include "tensorizer/error.h"
#include "tensorizer/format.h"
#include "tensorizer/hash.h"
#include "tensorizer/reader.h"

namespace tzpy {
namespace {

using tensorizer::ErrorCode;

// The Python exception class for an engine error code (classes that mirror the reference's live
// in tensorizer._errors; the rest are builtins).
PyObject* exception_for(ErrorCode code) {
  const char* name = nullptr;
  switch (code) {
    case ErrorCode::kHashMismatch:
      name = "HashMismatchError";
      break;
    case ErrorCode::kCrypto:
      name = "CryptographyError";
      break;
    case ErrorCode::kFormat:
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kUnsupportedVersion:
      return PyExc_ValueError;
    case ErrorCode::kNotFound:
      return PyExc_FileNotFoundError;
    case ErrorCode::kIO:
      return PyExc_OSError;
    case ErrorCode::kUnsupported:
      return PyExc_NotImplementedError;
    case ErrorCode::kCancelled:
      return PyExc_RuntimeError;
    case ErrorCode::kDeadline:
      return PyExc_TimeoutError;
  }
  if (!name) return PyExc_RuntimeError;
  PyObject* mod = PyImport_ImportModule("tensorizer._errors");
  if (!mod) {
    PyErr_Clear();
    return PyExc_RuntimeError;
  }
  PyObject* cls = PyObject_GetAttrString(mod, name);
  Py_DECREF(mod);
  if (!cls) {
    PyErr_Clear();
    return PyExc_RuntimeError;
  }
  Py_DECREF(cls);  // the module keeps the class alive
  return cls;
}

}  // namespace

void register_errors(nb::module_& m) {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const tensorizer::Error& e) {
      // Messages may quote names that are not UTF-8 (a file name is any bytes): those bytes are
      // shown escaped, where PyErr_SetString would raise a UnicodeDecodeError instead.
      const std::string_view what = e.what();
      PyObject* message = PyUnicode_DecodeUTF8(what.data(), static_cast<Py_ssize_t>(what.size()),
                                               "backslashreplace");
      if (!message) return;  // the decode error stands
      PyErr_SetObject(exception_for(e.code()), message);
      Py_DECREF(message);
    }
  });
  m.def("error_code_name", [](int code) {
    return std::string(tensorizer::error_code_name(static_cast<ErrorCode>(code)));
  });
}

tensorizer::TensorPath path_from_python(nb::handle obj) {
  if (nb::isinstance<nb::str>(obj)) return tensorizer::TensorPath(nb::cast<std::string>(obj));
  if (!nb::isinstance<nb::tuple>(obj) && !nb::isinstance<nb::list>(obj))
    throw nb::type_error("a tensor name must be a str or a sequence of str and int components");
  std::vector<tensorizer::PathComponent> parts;
  for (nb::handle item : obj) {
    if (nb::isinstance<nb::str>(item)) {
      parts.emplace_back(nb::cast<std::string>(item));
    } else if (nb::isinstance<nb::int_>(item) && !nb::isinstance<nb::bool_>(item)) {
      long long v = nb::cast<long long>(item);
      if (v < 0) throw nb::value_error("negative integer in a tensor path");
      parts.emplace_back(static_cast<uint64_t>(v));
    } else {
      throw nb::type_error("tensor path components must be str or non-negative int");
    }
  }
  if (parts.empty()) throw nb::value_error("Invalid empty tensor path");
  return tensorizer::TensorPath(std::move(parts));
}

nb::tuple path_to_python(const tensorizer::TensorPath& path) {
  nb::list out;
  for (const auto& c : path.components) {
    if (const auto* s = std::get_if<std::string>(&c)) {
      out.append(nb::str(s->data(), s->size()));
    } else {
      out.append(nb::int_(std::get<uint64_t>(c)));
    }
  }
  return nb::tuple(out);
}

namespace {

tensorizer::Key key_from_bytes(nb::handle obj, const char* what) {
  nb::bytes b = nb::cast<nb::bytes>(obj);
  if (b.size() != 32)
    throw nb::value_error((std::string(what) + " must be exactly 32 bytes").c_str());
  tensorizer::Key k;
  std::memcpy(k.data(), b.c_str(), 32);
  return k;
}

}  // namespace

std::optional<tensorizer::DecryptionParams> decryption_from_python(nb::handle key,
                                                                   nb::handle passphrase,
                                                                   nb::handle kdf_limits) {
  std::optional<tensorizer::DecryptionParams> p;
  if (!key.is_none()) {
    p = tensorizer::DecryptionParams::from_key(key_from_bytes(key, "decryption key"));
  } else if (!passphrase.is_none()) {
    nb::bytes b = nb::cast<nb::bytes>(passphrase);
    p = tensorizer::DecryptionParams::from_passphrase(std::string(b.c_str(), b.size()));
  }
  if (p && !kdf_limits.is_none()) p->max_kdf = nb::cast<tensorizer::KdfLimits>(kdf_limits);
  return p;
}

std::optional<tensorizer::EncryptionParams> encryption_from_python(nb::handle key, nb::handle kdf) {
  if (key.is_none()) return std::nullopt;
  tensorizer::EncryptionParams p;
  p.key = key_from_bytes(key, "encryption key");
  if (!kdf.is_none()) {
    nb::tuple t = nb::cast<nb::tuple>(kdf);
    tensorizer::KdfParams k;
    k.opslimit = nb::cast<uint64_t>(t[0]);
    k.memlimit = nb::cast<uint64_t>(t[1]);
    nb::bytes salt = nb::cast<nb::bytes>(t[2]);
    if (salt.size() != k.salt.size()) throw nb::value_error("salt must be exactly 16 bytes");
    std::memcpy(k.salt.data(), salt.c_str(), k.salt.size());
    p.kdf = k;
  }
  return p;
}

void register_common(nb::module_& m) {
  // dtype helpers (docs/format.md §1.9).
  m.def(
      "dtype_string_for_torch",
      [](const std::string& torch_name) {
        std::string s = tensorizer::dtype_string_for_torch(torch_name);
        return nb::str(s.data(), s.size());
      },
      nb::arg("torch_name"), "The dtype string stored for a torch dtype name ('torch.bfloat16').");
  m.def(
      "parse_dtype",
      [](const std::string& s) {
        tensorizer::DType d = tensorizer::parse_dtype(s);
        return nb::make_tuple(d.numpy, d.torch_name(), d.itemsize, d.opaque());
      },
      nb::arg("dtype"),
      "(numpy part, torch dtype name or '', item size, opaque) of a dtype string.");

  // Keys (docs/format.md §3.2).
  nb::class_<tensorizer::KdfLimits>(
      m, "KdfLimits",
      "The most Argon2id work a load does for a passphrase (defaults: "
      "opslimit 4, memlimit 1 GiB, or $TENSORIZER_MAX_KDF_OPSLIMIT/"
      "$TENSORIZER_MAX_KDF_MEMLIMIT).")
      .def("__init__",
           [](tensorizer::KdfLimits* l) { new (l) auto(tensorizer::KdfLimits::from_env()); })
      .def_rw("opslimit", &tensorizer::KdfLimits::opslimit)
      .def_rw("memlimit", &tensorizer::KdfLimits::memlimit);
  m.def(
      "derive_key",
      [](nb::bytes passphrase, uint64_t opslimit, uint64_t memlimit, nb::bytes salt) {
        if (salt.size() != 16) throw nb::value_error("salt must be exactly 16 bytes");
        tensorizer::KdfParams k;
        k.opslimit = opslimit;
        k.memlimit = memlimit;
        std::memcpy(k.salt.data(), salt.c_str(), 16);
        std::string pw(passphrase.c_str(), passphrase.size());
        tensorizer::Key key;
        {
          nb::gil_scoped_release release;
          key = tensorizer::derive_key(pw, k);
        }
        return nb::bytes(reinterpret_cast<const char*>(key.data()), key.size());
      },
      nb::arg("passphrase"), nb::arg("opslimit"), nb::arg("memlimit"), nb::arg("salt"),
      "Argon2id13 key derivation exactly as tensorizer does it.");
  m.def(
      "random_key",
      [] {
        tensorizer::Key key = tensorizer::EncryptionParams::random().key;
        return nb::bytes(reinterpret_cast<const char*>(key.data()), key.size());
      },
      "32 bytes from the system's secure random generator.");

  // Hashes of live memory against a header (verify_module, docs/reference-api.md §4.7).
  m.def(
      "compute_hashes",
      [](nb::bytes hashable_header, uintptr_t address, uint64_t nbytes) {
        std::string header(hashable_header.c_str(), hashable_header.size());
        uint32_t crc = 0;
        std::array<uint8_t, 32> sha{};
        {
          nb::gil_scoped_release release;
          tensorizer::TensorHasher h(true, true, header);
          if (nbytes) h.update(reinterpret_cast<const void*>(address), nbytes);
          h.finish();
          crc = h.crc32();
          sha = h.sha256();
        }
        return nb::make_tuple(crc,
                              nb::bytes(reinterpret_cast<const char*>(sha.data()), sha.size()));
      },
      nb::arg("hashable_header"), nb::arg("address"), nb::arg("nbytes"),
      "(CRC32, SHA-256) over a hashable header followed by `nbytes` bytes at `address`.");

  m.def("usable_cores", &tensorizer::usable_cores);

  // Format facts (docs/format.md), so Python restates none of them.
  m.attr("MAGIC") = nb::bytes(tensorizer::kMagic, tensorizer::kMagicSize);
  m.attr("PRELUDE_SIZE") = tensorizer::kPreludeSize;
  m.attr("MAX_VERSION") = tensorizer::kMaxVersion;
  m.attr("OPAQUE_VERSION") = tensorizer::kOpaqueVersion;
  m.attr("ENCRYPTION_VERSION") = tensorizer::kEncryptionVersion;
  m.attr("META_VERSION") = tensorizer::kMetaVersion;
  m.attr("LONG_DIMS_VERSION") = tensorizer::kLongDimsVersion;

  // Transport options, one class per back end; TransportOptions holds one of each.
  using tensorizer::CacheOptions;
  using tensorizer::FileOptions;
  using tensorizer::HttpOptions;
  using tensorizer::RetryOptions;
  using tensorizer::S3Options;
  using tensorizer::TransportOptions;
  nb::class_<HttpOptions>(m, "HttpOptions")
      .def(nb::init<>())
      .def_rw("ca_file", &HttpOptions::ca_file)
      .def_rw("ca_path", &HttpOptions::ca_path)
      .def_rw("allow_untrusted", &HttpOptions::allow_untrusted)
      .def_rw("headers", &HttpOptions::headers)
      .def_rw("read_bytes", &HttpOptions::read_bytes);
  nb::class_<S3Options>(m, "S3Options")
      .def(nb::init<>())
      .def_rw("access_key_id", &S3Options::access_key_id)
      .def_rw("secret_access_key", &S3Options::secret_access_key)
      .def_rw("session_token", &S3Options::session_token)
      .def_rw("endpoint", &S3Options::endpoint)
      .def_rw("config_path", &S3Options::config_path)
      .def_rw("region", &S3Options::region)
      .def_rw("profile", &S3Options::profile)
      .def_rw("force_http", &S3Options::force_http)
      .def_rw("virtual_hosted", &S3Options::virtual_hosted);
  nb::class_<RetryOptions>(m, "RetryOptions")
      .def(nb::init<>())
      .def_rw("connect_timeout_s", &RetryOptions::connect_timeout_s)
      .def_rw("stall_timeout_s", &RetryOptions::stall_timeout_s)
      .def_rw("max_retries", &RetryOptions::max_retries)
      .def_rw("retry_delay_s", &RetryOptions::retry_delay_s);
  nb::class_<FileOptions>(m, "FileOptions")
      .def(nb::init<>())
      .def_rw("sync_on_commit", &FileOptions::sync_on_commit)
      .def_rw("unnamed_temp", &FileOptions::unnamed_temp);
  nb::class_<CacheOptions>(m, "CacheOptions")
      .def(nb::init<>())
      .def_rw("dir", &CacheOptions::dir)
      .def_rw("max_bytes", &CacheOptions::max_bytes);
  nb::class_<TransportOptions>(m, "TransportOptions")
      .def(nb::init<>())
      .def_rw("http", &TransportOptions::http)
      .def_rw("s3", &TransportOptions::s3)
      .def_rw("retry", &TransportOptions::retry)
      .def_rw("file", &TransportOptions::file)
      .def_rw("cache", &TransportOptions::cache);

  // What a path or URI's transport can do (open_stream asks instead of knowing the schemes).
  nb::class_<tensorizer::TransportInfo>(m, "TransportInfo")
      .def_ro("scheme", &tensorizer::TransportInfo::scheme)
      .def_ro("local", &tensorizer::TransportInfo::local)
      .def_ro("writable", &tensorizer::TransportInfo::writable)
      .def_ro("sink_takes_bytes", &tensorizer::TransportInfo::sink_takes_bytes);
  m.def("transport_info", &tensorizer::transport_info, nb::arg("uri"),
        "What the transport behind a path or URI can do; None for a scheme no transport serves.");
}

}  // namespace tzpy

NB_MODULE(_C, m) {
  m.doc() = "Private bindings of the tensorizer C++ engine; use the tensorizer package instead.";
  // nanobind reports every bound object still alive when the module is torn down as a reference
  // leak. At exit that is also a serializer or reader that a daemon thread (a server's, a
  // framework's) still reaches through module globals: not a leak, and the report frightens users.
  nanobind::set_leak_warnings(false);
  tzpy::register_errors(m);
  tzpy::register_common(m);
  tzpy::register_reader(m);
  tzpy::register_writer(m);
  tzpy::register_source(m);
}
