// dtype string parsing and the torch <-> numpy dtype table (docs/format.md §1.9). Pure: no I/O.
#include "tensorizer/dtype.h"

#include "tensorizer/error.h"

namespace tensorizer {
namespace {

struct TorchDType {
  const char* name;   // without the "torch." prefix
  const char* numpy;  // numpy string when numpy has the type, else nullptr (opaque)
  uint32_t itemsize;
};

// Every torch 2.13 dtype that can be serialized. Quantized dtypes are absent on purpose.
constexpr TorchDType kTorchDTypes[] = {
    {"float16", "<f2", 2},
    {"float32", "<f4", 4},
    {"float64", "<f8", 8},
    {"int8", "|i1", 1},
    {"uint8", "|u1", 1},
    {"int16", "<i2", 2},
    {"int32", "<i4", 4},
    {"int64", "<i8", 8},
    {"bool", "|b1", 1},
    {"complex64", "<c8", 8},
    {"complex128", "<c16", 16},
    {"uint16", "<u2", 2},
    {"uint32", "<u4", 4},
    {"uint64", "<u8", 8},
    {"bfloat16", nullptr, 2},
    {"complex32", nullptr, 4},
    {"float8_e5m2", nullptr, 1},
    {"float8_e4m3fn", nullptr, 1},
    {"float8_e5m2fnuz", nullptr, 1},
    {"float8_e4m3fnuz", nullptr, 1},
    {"float8_e8m0fnu", nullptr, 1},
    {"float4_e2m1fn_x2", nullptr, 1},
    {"bits8", nullptr, 1},
    {"bits16", nullptr, 2},
    {"bits1x8", nullptr, 1},
    {"bits2x4", nullptr, 1},
    {"bits4x2", nullptr, 1},
    {"uint1", nullptr, 1},
    {"uint2", nullptr, 1},
    {"uint3", nullptr, 1},
    {"uint4", nullptr, 1},
    {"uint5", nullptr, 1},
    {"uint6", nullptr, 1},
    {"uint7", nullptr, 1},
    {"int1", nullptr, 1},
    {"int2", nullptr, 1},
    {"int3", nullptr, 1},
    {"int4", nullptr, 1},
    {"int5", nullptr, 1},
    {"int6", nullptr, 1},
    {"int7", nullptr, 1},
};

std::string_view strip_torch_prefix(std::string_view name) {
  constexpr std::string_view kPrefix = "torch.";
  if (name.substr(0, kPrefix.size()) == kPrefix) name.remove_prefix(kPrefix.size());
  return name;
}

const TorchDType* find_torch(std::string_view name) {
  name = strip_torch_prefix(name);
  for (const auto& t : kTorchDTypes)
    if (name == t.name) return &t;
  return nullptr;
}

[[noreturn]] void bad_dtype(std::string_view s, const char* why) {
  fail(ErrorCode::kFormat, "invalid dtype string '" + shown_bytes(s) + "': " + why);
}

}  // namespace

std::string DType::torch_name() const {
  if (opaque()) return torch;
  if (byte_order == '>') return "";
  std::string key(1, kind);
  key += std::to_string(itemsize);
  for (const auto& t : kTorchDTypes) {
    if (t.numpy && key == std::string_view(t.numpy).substr(1))
      return std::string("torch.") + t.name;
  }
  return "";
}

DType parse_dtype(std::string_view s) {
  DType d;
  for (char c : s)
    if (c != '\0' && (c < 0x20 || c > 0x7e)) bad_dtype(s, "a byte that is not printable ASCII");
  size_t nul = s.find('\0');
  std::string_view np = s.substr(0, nul);
  if (nul != std::string_view::npos) {
    std::string_view rest = s.substr(nul + 1);
    if (rest.find('\0') != std::string_view::npos) bad_dtype(s, "more than one NUL separator");
    d.torch = std::string(rest);
  }
  if (np.size() < 3) bad_dtype(s, "too short");
  d.byte_order = np[0];
  if (d.byte_order != '<' && d.byte_order != '>' && d.byte_order != '|' && d.byte_order != '=')
    bad_dtype(s, "unknown byte order");
  d.kind = np[1];
  uint64_t size = 0;
  for (char c : np.substr(2)) {
    if (c < '0' || c > '9') bad_dtype(s, "bad item size");
    size = size * 10 + static_cast<uint64_t>(c - '0');
    if (size > 1u << 20) bad_dtype(s, "item size too large");
  }
  if (size == 0) bad_dtype(s, "zero item size");
  d.itemsize = static_cast<uint32_t>(size);
  d.numpy = std::string(np);
  if (d.opaque()) {
    if (d.torch.empty()) bad_dtype(s, "opaque dtype without a torch dtype name");
    if (d.torch.substr(0, 6) != "torch.")
      bad_dtype(s, "opaque torch name must start with 'torch.'");
    const TorchDType* t = find_torch(d.torch);
    if (t && t->itemsize != d.itemsize)
      bad_dtype(s, "opaque item size does not match the torch dtype");
  } else if (!d.torch.empty()) {
    bad_dtype(s, "torch dtype name on a non-opaque dtype");
  }
  return d;
}

std::string dtype_string_for_torch(std::string_view torch_name) {
  const TorchDType* t = find_torch(torch_name);
  if (!t) {
    std::string n(strip_torch_prefix(torch_name));
    if (n.rfind("qint", 0) == 0 || n.rfind("quint", 0) == 0)
      fail(ErrorCode::kUnsupported, "quantized dtype torch." + n + " cannot be serialized");
    fail(ErrorCode::kUnsupported, "unknown torch dtype '" + std::string(torch_name) + "'");
  }
  if (t->numpy) return t->numpy;
  std::string s = t->itemsize == 1 ? "|V1" : "<V" + std::to_string(t->itemsize);
  s += '\0';
  s += "torch.";
  s += t->name;
  return s;
}

uint32_t torch_dtype_itemsize(std::string_view torch_name) {
  const TorchDType* t = find_torch(torch_name);
  if (!t) fail(ErrorCode::kUnsupported, "unknown torch dtype '" + std::string(torch_name) + "'");
  return t->itemsize;
}

}  // namespace tensorizer
