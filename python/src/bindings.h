// Shared pieces of the `tensorizer._C` extension: registration hooks for each binding file and
// conversions between Python values and engine structs. Only glue: no format logic here.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <memory>
#include <optional>
#include <vector>

#include "tensorizer/crypto.h"
#include "tensorizer/tensor_path.h"
#include "tensorizer/transport.h"

namespace tzpy {

namespace nb = nanobind;

void register_errors(nb::module_& m);
void register_common(nb::module_& m);
void register_reader(nb::module_& m);
void register_writer(nb::module_& m);
void register_source(nb::module_& m);

// What a Python caller passes as "the file" (a path, URI, descriptor, file object, _C.Source or
// stream) as an engine Source or Sink; python_io.cc says what each kind becomes.
std::unique_ptr<tensorizer::Source> source_from_python(
    nb::handle obj, const tensorizer::TransportOptions& transport);
std::unique_ptr<tensorizer::Sink> sink_from_python(nb::handle obj,
                                                   const tensorizer::TransportOptions& transport);
// A source's or sink's URI for Python: a local file's name is any bytes, and the bytes that are not
// UTF-8 come back as os.fsdecode gives them (surrogates), so the str opens the same file.
nb::str uri_to_python(const std::string& uri);
// The engine Source behind a _C.Source, or behind an object whose `_engine_source` is one; null
// for anything else.
std::shared_ptr<tensorizer::Source> engine_source_of(nb::handle obj);

// A Python path (str, or a tuple/list of str and non-negative int) as a TensorPath.
tensorizer::TensorPath path_from_python(nb::handle obj);
// A TensorPath as a Python tuple of str/int components.
nb::tuple path_to_python(const tensorizer::TensorPath& path);

// A torch tensor of `shape` and `dtype` over the CPU memory at `data`, which `owner` keeps alive
// until torch frees the tensor (torch_tensor.cc).
nb::object torch_tensor_over(void* data, const std::vector<size_t>& shape, nb::dlpack::dtype dtype,
                             std::shared_ptr<void> owner);

// Decryption from (key: bytes | None, passphrase: bytes | None, kdf_limits: KdfLimits | None, the
// default); nullopt when key and passphrase are None.
std::optional<tensorizer::DecryptionParams> decryption_from_python(nb::handle key,
                                                                   nb::handle passphrase,
                                                                   nb::handle kdf_limits);
// Encryption from (key: bytes, kdf: (opslimit, memlimit, salt) | None); nullopt when key is None.
std::optional<tensorizer::EncryptionParams> encryption_from_python(nb::handle key, nb::handle kdf);

}  // namespace tzpy
