// Index (metadata block) codec and the path rules of docs/format.md §1.4 and §2.2. Pure: no I/O.
#include "codec/bytes.h"
#include "codec/path_rules.h"
#include "codec/utf8.h"
#include "tensorizer/dtype.h"
#include "tensorizer/format.h"

namespace tensorizer {
namespace {

// Largest per-tensor header we accept; real ones are tiny (crypt MACs: 16 bytes per 2 MiB).
constexpr uint64_t kMaxHeaderSize = uint64_t{1} << 30;

std::string entry_label(size_t i, const std::string& name) {
  return "index entry " + std::to_string(i) + " ('" + shown_bytes(name) + "')";
}

}  // namespace

uint64_t IndexEntry::num_elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n))
      fail(ErrorCode::kFormat, "tensor shape overflows 64 bits");
  }
  return n;
}

uint64_t IndexEntry::itemsize() const { return parse_dtype(dtype).itemsize; }

std::vector<IndexEntry> parse_index(const uint8_t* data, size_t size, const FileHeader& header,
                                    uint64_t file_size) {
  if (header.tensor_count == 0) fail(ErrorCode::kFormat, "tensor index in the file is empty");
  const uint64_t index_end = kPreludeSize + header.index_size;
  if (header.index_size > file_size || index_end > file_size)
    fail(ErrorCode::kFormat, "index size " + std::to_string(header.index_size) +
                                 " runs past the end of the file (" + std::to_string(file_size) +
                                 " bytes)");
  // Each entry needs at least 29 bytes: a count beyond that is corrupt, whatever the block says.
  if (header.tensor_count > header.index_size / 29)
    fail(ErrorCode::kFormat, "tensor count " + std::to_string(header.tensor_count) +
                                 " cannot fit in an index of " + std::to_string(header.index_size) +
                                 " bytes");
  if (size > header.index_size) size = header.index_size;
  codec::ByteCursor c(data, size, kPreludeSize);
  std::vector<IndexEntry> entries;
  entries.reserve(header.tensor_count);
  codec::PathRules rules;
  const bool versioned = header.versioned_entries();
  for (uint64_t i = 0; i < header.tensor_count; ++i) {
    IndexEntry e;
    if (versioned) {
      e.entry_version = c.read<uint32_t>("index entry version");
      if (e.entry_version != 1 && e.entry_version != kLongDimsVersion)
        fail(ErrorCode::kUnsupportedVersion, "index entry " + std::to_string(i) +
                                                 " has unsupported metadata version " +
                                                 std::to_string(e.entry_version));
    }
    uint16_t name_len = c.read<uint16_t>("tensor name length");
    e.name = std::string(c.bytes(name_len, "tensor name"));
    const auto label = [&] { return entry_label(i, e.name); };  // made for errors only
    if (!codec::is_utf8(e.name))
      fail(ErrorCode::kFormat, label() + ": the tensor name is not valid UTF-8");
    try {
      e.path = decode_path(e.name);
    } catch (const Error& err) {
      fail(ErrorCode::kFormat, label() + ": " + err.what());
    }
    uint8_t type = c.read<uint8_t>("tensor type");
    if (type > 2)
      fail(ErrorCode::kFormat, label() + ": unknown tensor type " + std::to_string(type));
    e.type = static_cast<TensorType>(type);
    uint8_t dtype_len = c.read<uint8_t>("dtype length");
    e.dtype = std::string(c.bytes(dtype_len, "dtype"));
    uint8_t ndim = c.read<uint8_t>("shape length");
    e.shape.resize(ndim);
    for (auto& d : e.shape)
      d = e.long_shape() ? c.read<uint64_t>("shape") : c.read<uint32_t>("shape");
    e.header_offset = c.read<uint64_t>("header offset");
    e.data_offset = c.read<uint64_t>("data offset");
    e.data_length = c.read<uint64_t>("data length");

    uint64_t expected = 0;
    try {
      DType dt = parse_dtype(e.dtype);
      uint64_t n = e.num_elements();
      if (__builtin_mul_overflow(n, uint64_t{dt.itemsize}, &expected))
        fail(ErrorCode::kFormat, "tensor size overflows 64 bits");
    } catch (const Error& err) {
      fail(ErrorCode::kFormat, label() + ": " + err.what());
    }
    if (e.data_length != expected && e.data_length != 0)
      fail(ErrorCode::kFormat, label() + ": data length " + std::to_string(e.data_length) +
                                   " does not match dtype and shape (" + std::to_string(expected) +
                                   " bytes)");
    if (e.type != TensorType::kStateDict && !e.path.is_plain())
      fail(ErrorCode::kFormat,
           label() + ": structured names are only allowed on state-dict tensors");
    if (e.header_offset < kMagicSize || e.data_offset < e.header_offset + 8 + 2 + 1 + 2 ||
        e.header_size() > kMaxHeaderSize)
      fail(ErrorCode::kFormat, label() + ": bad header/data offsets (" +
                                   std::to_string(e.header_offset) + ", " +
                                   std::to_string(e.data_offset) + ")");
    if (e.data_offset > file_size || e.data_length > file_size - e.data_offset)
      fail(ErrorCode::kFormat, label() + ": tensor data [" + std::to_string(e.data_offset) + ", +" +
                                   std::to_string(e.data_length) +
                                   ") runs past the end of the file (" + std::to_string(file_size) +
                                   " bytes): the file is truncated");
    rules.add(e.path, label, ErrorCode::kFormat);
    entries.push_back(std::move(e));
  }
  return entries;
}

size_t index_entry_size(const IndexEntry& e, bool versioned) {
  return (versioned ? 4 : 0) + 29 + e.name.size() + e.dtype.size() +
         e.shape.size() * (e.long_shape() ? 8 : 4);
}

void encode_index_entry(const IndexEntry& e, bool versioned, std::string& out) {
  codec::ByteAppender a(out);
  if (versioned) a.put<uint32_t>(e.entry_version);
  a.put<uint16_t>(static_cast<uint16_t>(e.name.size()));
  a.bytes(e.name);
  a.put<uint8_t>(static_cast<uint8_t>(e.type));
  a.put<uint8_t>(static_cast<uint8_t>(e.dtype.size()));
  a.bytes(e.dtype);
  a.put<uint8_t>(static_cast<uint8_t>(e.shape.size()));
  for (uint64_t d : e.shape) {
    if (e.long_shape())
      a.put<uint64_t>(d);
    else
      a.put<uint32_t>(static_cast<uint32_t>(d));
  }
  a.put<uint64_t>(e.header_offset);
  a.put<uint64_t>(e.data_offset);
  a.put<uint64_t>(e.data_length);
}

std::vector<NamedRange> object_parts(const FileHeader& header,
                                     const std::vector<IndexEntry>& entries) {
  std::vector<NamedRange> parts;
  parts.reserve(1 + 2 * entries.size());
  parts.push_back({"header", 0, kPreludeSize + header.index_size});
  for (const IndexEntry& e : entries) {
    parts.push_back({e.name, e.header_offset, e.header_size()});
    if (e.data_length > 0) parts.push_back({e.name, e.data_offset, e.data_length});
  }
  return parts;
}

}  // namespace tensorizer
