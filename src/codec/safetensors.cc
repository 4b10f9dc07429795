// The safetensors codec: length prefix, JSON header, tensor table (docs/format.md §5). No I/O.
#include "tensorizer/safetensors.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "tensorizer/dtype.h"
#include "tensorizer/error.h"

namespace tensorizer {
namespace {

using json = nlohmann::json;

constexpr int kMaxDepth = 3;  // top object > tensor object > shape array > dimension

// safetensors dtype names and the torch dtype each one loads as (nullptr: none the engine holds).
struct SafetensorsDType {
  const char* name;
  const char* torch;
};
constexpr SafetensorsDType kDTypes[] = {
    {"BOOL", "bool"},
    {"U8", "uint8"},
    {"I8", "int8"},
    {"I16", "int16"},
    {"U16", "uint16"},
    {"I32", "int32"},
    {"U32", "uint32"},
    {"I64", "int64"},
    {"U64", "uint64"},
    {"F16", "float16"},
    {"BF16", "bfloat16"},
    {"F32", "float32"},
    {"F64", "float64"},
    {"C64", "complex64"},
    {"F8_E4M3", "float8_e4m3fn"},
    {"F8_E5M2", "float8_e5m2"},
    {"F8_E8M0", "float8_e8m0fnu"},
    {"F4", nullptr},
    {"F6_E2M3", nullptr},
    {"F6_E3M2", nullptr},
};

// Each kDTypes row's place in the safetensors library's dtype order, by which it sorts tensors
// when writing (it writes the last in that order first).
constexpr int kSortRank[] = {
    /*BOOL*/ 0,    /*U8*/ 4,      /*I8*/ 5,      /*I16*/ 9,     /*U16*/ 10,    /*I32*/ 13,
    /*U32*/ 14,    /*I64*/ 18,    /*U64*/ 19,    /*F16*/ 11,    /*BF16*/ 12,   /*F32*/ 15,
    /*F64*/ 17,    /*C64*/ 16,    /*F8_E4M3*/ 7, /*F8_E5M2*/ 6, /*F8_E8M0*/ 8, /*F4*/ 1,
    /*F6_E2M3*/ 2, /*F6_E3M2*/ 3,
};
static_assert(std::size(kSortRank) == std::size(kDTypes));

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

[[noreturn]] void bad(const std::string& what) {
  fail(ErrorCode::kFormat, "invalid safetensors header: " + what);
}

std::string tensor_label(const std::string& name) { return "tensor '" + shown_bytes(name) + "'"; }

uint64_t unsigned_value(const json& v, const std::string& what) {
  if (!v.is_number_unsigned()) bad(what + " is not a non-negative integer");
  return v.get<uint64_t>();
}

IndexEntry parse_tensor(const std::string& name, const json& t, uint64_t data_start,
                        uint64_t buffer_size, uint64_t& begin, uint64_t& end) {
  const std::string label = tensor_label(name);
  if (!t.is_object()) bad(label + " is not an object");
  for (const auto& [key, _] : t.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      bad(label + " has an unknown field '" + shown_bytes(key) + "'");
  const auto dtype = t.find("dtype"), shape = t.find("shape"), offsets = t.find("data_offsets");
  if (dtype == t.end() || shape == t.end() || offsets == t.end())
    bad(label + " lacks one of dtype, shape, data_offsets");
  if (!dtype->is_string()) bad(label + ": dtype is not a string");
  if (!shape->is_array()) bad(label + ": shape is not an array");
  if (!offsets->is_array() || offsets->size() != 2)
    bad(label + ": data_offsets is not an array of two integers");

  IndexEntry e;
  e.name = name;
  e.path = TensorPath(name);
  try {
    e.dtype = dtype_string_for_safetensors(dtype->get_ref<const std::string&>());
  } catch (const Error& err) {
    fail(err.code(), label + ": " + err.what());
  }
  for (const json& d : *shape) e.shape.push_back(unsigned_value(d, label + ": a dimension"));
  begin = unsigned_value((*offsets)[0], label + ": data_offsets[0]");
  end = unsigned_value((*offsets)[1], label + ": data_offsets[1]");
  if (begin > end) bad(label + ": data_offsets end before they begin");
  if (end > buffer_size)
    bad(label + ": data_offsets end at " + std::to_string(end) + ", past the data buffer (" +
        std::to_string(buffer_size) + " bytes)");
  uint64_t expected = 0;
  try {
    if (__builtin_mul_overflow(e.num_elements(), e.itemsize(), &expected))
      bad(label + ": its size overflows 64 bits");
  } catch (const Error& err) {
    bad(label + ": " + err.what());
  }
  if (expected != end - begin)
    bad(label + ": dtype and shape make " + std::to_string(expected) + " bytes, data_offsets " +
        std::to_string(end - begin));
  e.header_offset = e.data_offset = data_start + begin;  // no per-tensor header
  e.data_length = end - begin;
  return e;
}

}  // namespace

bool looks_like_safetensors(const uint8_t* data, size_t size) {
  return size > kSafetensorsLengthSize && data[kSafetensorsLengthSize] == '{';
}

uint64_t safetensors_header_length(const uint8_t* data, size_t size, uint64_t file_size) {
  if (size < kSafetensorsLengthSize || file_size < kSafetensorsLengthSize)
    bad("the file is shorter than the 8-byte header length");
  const uint64_t n = read_u64_le(data);
  if (n > file_size - kSafetensorsLengthSize)
    bad("header length " + std::to_string(n) + " runs past the end of the file (" +
        std::to_string(file_size) + " bytes)");
  return n;
}

SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, uint64_t file_size) {
  SafetensorsHeader out;
  out.data_start = kSafetensorsLengthSize + size;
  if (out.data_start > file_size) bad("the header runs past the end of the file");
  const uint64_t buffer_size = file_size - out.data_start;

  // Duplicate names would silently keep the last value: refuse them while parsing, and refuse
  // nesting deeper than the format has (a hostile header cannot make the tree arbitrarily deep).
  std::vector<std::string> top_keys;
  const auto guard = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxDepth) bad("nested deeper than the format allows");
    if (event == json::parse_event_t::key && depth == 1)
      top_keys.push_back(parsed.get<std::string>());
    return true;
  };
  json root;
  try {
    root = json::parse(data, data + size, guard);
  } catch (const json::exception& err) {
    bad(std::string("not valid JSON (") + err.what() + ")");
  }
  if (!root.is_object()) bad("not a JSON object");
  std::sort(top_keys.begin(), top_keys.end());
  if (auto dup = std::adjacent_find(top_keys.begin(), top_keys.end()); dup != top_keys.end())
    bad("the name '" + shown_bytes(*dup) + "' appears twice");

  struct Placed {
    uint64_t begin, end;
    IndexEntry entry;
  };
  std::vector<Placed> placed;
  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) bad("__metadata__ is not an object");
      for (const auto& [key, v] : value.items()) {
        if (!v.is_string()) bad("__metadata__ value of '" + shown_bytes(key) + "' is not a string");
        out.metadata.emplace_back(key, v.get<std::string>());
      }
      continue;
    }
    if (name.empty()) bad("a tensor has an empty name");
    Placed p;
    p.entry = parse_tensor(name, value, out.data_start, buffer_size, p.begin, p.end);
    placed.push_back(std::move(p));
  }
  // As the safetensors library requires: sorted by offset, the tensors tile the whole buffer.
  std::sort(placed.begin(), placed.end(), [](const Placed& a, const Placed& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (const Placed& p : placed) {
    if (p.begin != at)
      bad(tensor_label(p.entry.name) + ": data_offsets begin at " + std::to_string(p.begin) +
          ", expected " + std::to_string(at) +
          (p.begin < at ? " (it overlaps the tensor before)" : " (a gap before it)"));
    at = p.end;
  }
  if (at != buffer_size)
    bad("the tensors cover " + std::to_string(at) + " bytes of a " + std::to_string(buffer_size) +
        "-byte data buffer");
  out.entries.reserve(placed.size());
  for (Placed& p : placed) out.entries.push_back(std::move(p.entry));
  std::sort(out.metadata.begin(), out.metadata.end());
  return out;
}

std::vector<NamedRange> safetensors_parts(uint64_t data_start, std::vector<NamedRange> tensors) {
  std::erase_if(tensors, [](const NamedRange& t) { return t.size == 0; });
  std::sort(tensors.begin(), tensors.end(),
            [](const NamedRange& a, const NamedRange& b) { return a.offset < b.offset; });
  tensors.insert(tensors.begin(), NamedRange{kSafetensorsPart, 0, data_start});
  return tensors;
}

std::string safetensors_dtype_for(std::string_view dtype) {
  const std::string torch = parse_dtype(dtype).torch_name();
  for (const SafetensorsDType& d : kDTypes)
    if (d.torch && torch == std::string("torch.") + d.torch) return d.name;
  fail(ErrorCode::kUnsupported, "dtype " + (torch.empty() ? shown_bytes(dtype) : torch) +
                                    " cannot be stored in a safetensors file");
}

SafetensorsLayout plan_safetensors(
    const std::vector<SafetensorsTensor>& tensors,
    const std::optional<std::vector<std::pair<std::string, std::string>>>& metadata) {
  struct Item {
    size_t input;
    int rank;  // position of its dtype in kDTypes (the safetensors library's dtype order)
    std::string st_dtype;
    uint64_t bytes;
  };
  std::vector<Item> items;
  items.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsTensor& t = tensors[i];
    if (t.name.empty()) fail(ErrorCode::kInvalidArgument, "a tensor has an empty name");
    Item item{i, 0, safetensors_dtype_for(t.dtype), parse_dtype(t.dtype).itemsize};
    while (kDTypes[item.rank].name != item.st_dtype) ++item.rank;
    for (uint64_t d : t.shape)
      if (__builtin_mul_overflow(item.bytes, d, &item.bytes))
        fail(ErrorCode::kInvalidArgument,
             "tensor '" + shown_bytes(t.name) + "': its size overflows 64 bits");
    items.push_back(std::move(item));
  }
  // As safetensors orders them: by dtype, widest (last in its order) first, then by name.
  std::sort(items.begin(), items.end(), [&](const Item& a, const Item& b) {
    return a.rank != b.rank ? kSortRank[a.rank] > kSortRank[b.rank]
                            : tensors[a.input].name < tensors[b.input].name;
  });
  std::unordered_set<std::string_view> names = {"__metadata__"};
  for (const SafetensorsTensor& t : tensors)
    if (!names.insert(t.name).second)
      fail(ErrorCode::kInvalidArgument,
           "the name '" + shown_bytes(t.name) + "' appears twice (or is reserved)");

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (metadata) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : *metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  SafetensorsLayout out;
  out.data_offset.resize(tensors.size());
  out.data_length.resize(tensors.size());
  uint64_t at = 0;
  for (const Item& item : items) {
    const SafetensorsTensor& t = tensors[item.input];
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = item.st_dtype;
    entry["shape"] = t.shape;
    entry["data_offsets"] = {at, at + item.bytes};
    header[t.name] = std::move(entry);
    out.data_offset[item.input] = at;
    out.data_length[item.input] = item.bytes;
    at += item.bytes;
  }
  std::string json;
  try {
    json = header.dump();
  } catch (const nlohmann::json::exception& err) {
    fail(ErrorCode::kInvalidArgument,
         std::string("a name or metadata string is not UTF-8 (") + err.what() + ")");
  }
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string len(kSafetensorsLengthSize, '\0');
  for (size_t i = 0; i < kSafetensorsLengthSize; ++i)
    len[i] = static_cast<char>(static_cast<uint64_t>(json.size()) >> (8 * i));
  out.prefix = len + json;
  for (uint64_t& off : out.data_offset) off += out.prefix.size();
  out.file_size = out.prefix.size() + at;
  std::vector<NamedRange> ranges;
  for (size_t i = 0; i < tensors.size(); ++i)
    ranges.push_back({tensors[i].name, out.data_offset[i], out.data_length[i]});
  out.parts = safetensors_parts(out.prefix.size(), std::move(ranges));
  return out;
}

std::string dtype_string_for_safetensors(std::string_view dtype) {
  for (const SafetensorsDType& d : kDTypes) {
    if (dtype != d.name) continue;
    if (!d.torch)
      fail(ErrorCode::kUnsupported,
           "safetensors dtype " + std::string(dtype) + " has no torch dtype this build loads");
    return dtype_string_for_torch(d.torch);
  }
  fail(ErrorCode::kFormat, "unknown safetensors dtype '" + shown_bytes(dtype) + "'");
}

}  // namespace tensorizer
