// Shared pieces of the `tensorizer._C` extension: registration hooks for each binding file and
// conversions between Python values and engine structs. Only glue: no format logic here.
#pragma once

#include <nanobind/nanobind.h>

#include <optional>

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

// A Python path (str, or a tuple/list of str and non-negative int) as a TensorPath.
tensorizer::TensorPath path_from_python(nb::handle obj);
// A TensorPath as a Python tuple of str/int components.
nb::tuple path_to_python(const tensorizer::TensorPath& path);

// Decryption from (key: bytes | None, passphrase: bytes | None); nullopt when both are None.
std::optional<tensorizer::DecryptionParams> decryption_from_python(nb::handle key,
                                                                   nb::handle passphrase);
// Encryption from (key: bytes, kdf: (opslimit, memlimit, salt) | None); nullopt when key is None.
std::optional<tensorizer::EncryptionParams> encryption_from_python(nb::handle key, nb::handle kdf);

}  // namespace tzpy
