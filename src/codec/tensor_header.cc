// Per-tensor header codec and the exact bytes its hashes cover (docs/format.md §1.5, §1.6). Pure:
// no I/O.
#include "codec/bytes.h"
#include "tensorizer/format.h"

namespace tensorizer {

TensorHeader parse_tensor_header(const uint8_t* data, size_t size, bool has_crypt_info,
                                 bool long_shape) {
  codec::ByteCursor c(data, size);
  TensorHeader h;
  h.header_size = c.read<uint64_t>("tensor header size");
  if (h.header_size == 0) fail(ErrorCode::kFormat, "unexpected empty tensor header");
  if (h.header_size != size)
    fail(ErrorCode::kFormat, "tensor header says it is " + std::to_string(h.header_size) +
                                 " bytes but the index places the data " + std::to_string(size) +
                                 " bytes after it");
  if (size < 8 + 8) fail(ErrorCode::kFormat, "tensor header too small");
  h.module_idx = c.read<uint16_t>("module index");
  uint8_t type = c.read<uint8_t>("tensor type");
  if (type > 2) fail(ErrorCode::kFormat, "unknown tensor type " + std::to_string(type));
  h.type = static_cast<TensorType>(type);
  uint16_t name_len = c.read<uint16_t>("tensor name length");
  h.name = std::string(c.bytes(name_len, "tensor name"));
  uint8_t dtype_len = c.read<uint8_t>("dtype length");
  h.dtype = std::string(c.bytes(dtype_len, "dtype"));
  uint8_t ndim = c.read<uint8_t>("shape length");
  h.shape.resize(ndim);
  for (auto& d : h.shape) d = long_shape ? c.read<uint64_t>("shape") : c.read<uint32_t>("shape");

  uint16_t hash_len = c.read<uint16_t>("hash section length");
  const size_t hash_end = c.pos() + hash_len;
  if (hash_len > c.remaining())
    fail(ErrorCode::kFormat, "hash section runs past the tensor header");
  uint8_t count = c.read<uint8_t>("hash count");
  for (uint8_t i = 0; i < count; ++i) {
    uint8_t t = c.read<uint8_t>("hash type");
    uint8_t len = c.read<uint8_t>("hash length");
    if (t > 1) fail(ErrorCode::kFormat, "unknown hash type " + std::to_string(t));
    HashEntry e{static_cast<HashType>(t), static_cast<uint32_t>(c.pos()), len};
    if ((e.type == HashType::kCrc32 && len != 4) || (e.type == HashType::kSha256 && len != 32))
      fail(ErrorCode::kFormat, "bad hash length " + std::to_string(len));
    c.skip(len, "hash value");
    h.hashes.push_back(e);
  }
  if (c.pos() > hash_end) fail(ErrorCode::kFormat, "hash entries overrun the hash section");
  c.seek(hash_end);
  if (has_crypt_info) {
    h.has_crypt_field = true;
    h.crypt_field_offset = c.pos();
    h.crypt_info_size = c.read<uint64_t>("crypt info length");
    c.skip(h.crypt_info_size, "crypt info");
  }
  if (c.remaining() < 8) fail(ErrorCode::kFormat, "tensor header has no room for its data length");
  h.fields_end = c.pos();
  h.data_length = codec::load_le<int64_t>(data + size - 8);
  if (h.data_length < 0) fail(ErrorCode::kUnsupported, "negative (compressed) data length");
  return h;
}

void check_header_matches_entry(const TensorHeader& h, const IndexEntry& e) {
  const char* what = nullptr;
  if (h.name != e.name)
    what = "name";
  else if (h.type != e.type)
    what = "tensor type";
  else if (h.dtype != e.dtype)
    what = "dtype";
  else if (h.shape != e.shape)
    what = "shape";
  else if (static_cast<uint64_t>(h.data_length) != e.data_length)
    what = "data length";
  if (what)
    fail(ErrorCode::kFormat, std::string("tensor header at offset ") +
                                 std::to_string(e.header_offset) + " disagrees with the index on " +
                                 what + " for '" + e.name.substr(0, 200) + "'");
}

std::string hashable_header(const uint8_t* data, size_t size, const TensorHeader& h) {
  std::string out(reinterpret_cast<const char*>(data), size);
  for (const auto& e : h.hashes) std::fill_n(out.begin() + e.value_offset, e.value_size, '\0');
  if (h.has_crypt_field) out.erase(h.crypt_field_offset, 8 + h.crypt_info_size);
  return out;
}

EncodedTensorHeader encode_tensor_header(const TensorHeaderFields& f, uint64_t header_offset,
                                         uint64_t data_alignment) {
  EncodedTensorHeader out;
  std::string& b = out.bytes;
  codec::ByteAppender a(b);
  a.put<uint64_t>(0);  // header size, patched below
  a.put<uint16_t>(f.module_idx);
  a.put<uint8_t>(static_cast<uint8_t>(f.type));
  a.put<uint16_t>(static_cast<uint16_t>(f.name.size()));
  a.bytes(f.name);
  a.put<uint8_t>(static_cast<uint8_t>(f.dtype.size()));
  a.bytes(f.dtype);
  a.put<uint8_t>(static_cast<uint8_t>(f.shape->size()));
  for (uint64_t d : *f.shape) {
    if (f.long_shape)
      a.put<uint64_t>(d);
    else
      a.put<uint32_t>(static_cast<uint32_t>(d));
  }
  const uint16_t hash_len = 1 + (f.crc32 ? 6 : 0) + (f.sha256 ? 34 : 0);
  a.put<uint16_t>(hash_len);
  a.put<uint8_t>(static_cast<uint8_t>((f.crc32 ? 1 : 0) + (f.sha256 ? 1 : 0)));
  if (f.crc32) {
    a.put<uint8_t>(static_cast<uint8_t>(HashType::kCrc32));
    a.put<uint8_t>(4);
    out.crc32_offset = b.size();
    a.zeros(4);
  }
  if (f.sha256) {
    a.put<uint8_t>(static_cast<uint8_t>(HashType::kSha256));
    a.put<uint8_t>(32);
    out.sha256_offset = b.size();
    a.zeros(32);
  }
  if (f.crypt_field) {
    a.put<uint64_t>(f.crypt_info_size);
    out.crypt_info_offset = b.size();
    a.zeros(f.crypt_info_size);
  }
  uint64_t size = b.size() + 8;
  if (data_alignment > 1) {
    uint64_t end = header_offset + size;
    uint64_t pad = (data_alignment - end % data_alignment) % data_alignment;
    a.zeros(pad);
    size += pad;
  }
  a.put<int64_t>(static_cast<int64_t>(f.data_length));
  codec::store_le<uint64_t>(b.data(), size);
  return out;
}

}  // namespace tensorizer
