// Codec tests: tensor paths, dtype strings, file header, index entries and per-tensor headers,
// byte for byte against the spec (§1, §2.1, Appendix B) and against files written by the
// reference tensorizer (2.12.1, SHA-256 of whole files recorded here).
#include <gtest/gtest.h>

#include <cstring>

#include "codec/bytes.h"
#include "tensorizer/dtype.h"
#include "tensorizer/error.h"
#include "tensorizer/format.h"
#include "tensorizer/hash.h"
#include "tensorizer/reader.h"
#include "tensorizer/tensor_path.h"
#include "tensorizer/writer.h"
#include "test_util.h"

namespace tensorizer {
namespace {

using test::error_code_of;
using test::hex;

const uint8_t* u8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

TensorPath P(std::vector<PathComponent> c) { return TensorPath(std::move(c)); }

// ---- Tensor paths (docs/format.md §2.1)
// ---------------------------------------------------------------

TEST(TensorPathTest, SpecExamplesEncodeByteExact) {
  EXPECT_EQ(encode_path(P({"model", "layer", uint64_t{0}, "weight"})),
            "\x1e[\"model\",\"layer\",0,\"weight\"]");
  EXPECT_EQ(encode_path(P({uint64_t{0}})), "\x1e[0]");
  EXPECT_EQ(encode_path(P({"a.b", "\xc3\xbc"})), "\x1e[\"a.b\",\"\\u00fc\"]");
  // A plain key is its raw UTF-8 bytes, nothing escaped.
  EXPECT_EQ(hex(encode_path(TensorPath("\xc3\xa9\"\\\x7f"))), "c3a9225c7f");
  EXPECT_EQ(encode_path(TensorPath("layers.0.weight")), "layers.0.weight");
}

TEST(TensorPathTest, JsonEscapingMatchesPython) {
  // Astral characters as lowercase surrogate pairs (U+1F600 -> \ud83d\ude00).
  EXPECT_EQ(encode_path(P({"x", "\xf0\x9f\x98\x80"})), "\x1e[\"x\",\"\\ud83d\\ude00\"]");
  // Short escapes, other control characters and DEL as \u00XX, '/' unescaped.
  EXPECT_EQ(encode_path(P({"\b\f\n\r\t", "\x01\x1f\x7f", "\"\\/"})),
            "\x1e[\"\\b\\f\\n\\r\\t\",\"\\u0001\\u001f\\u007f\",\"\\\"\\\\/\"]");
  // BMP characters above U+07FF and at the edges.
  EXPECT_EQ(encode_path(P({"\xe2\x82\xac\xef\xbf\xbf", uint64_t{18446744073709551615ull}})),
            "\x1e[\"\\u20ac\\uffff\",18446744073709551615]");
  EXPECT_EQ(encode_path(P({"a", ""})), "\x1e[\"a\",\"\"]")
      << "an empty component is fine inside JSON";
  EXPECT_EQ(encode_path(P({"a", "b"})), "\x1e[\"a\",\"b\"]");
}

TEST(TensorPathTest, DecodeRoundTrips) {
  const std::vector<TensorPath> paths = {
      P({"model", "layer", uint64_t{0}, "weight"}),
      P({uint64_t{0}}),
      P({"a.b", "\xc3\xbc"}),
      P({"x", "\xf0\x9f\x98\x80"}),
      P({"\b\f\n\r\t", "\x01\x1f\x7f", "\"\\/"}),
      P({"\xe2\x82\xac", uint64_t{12345678901234ull}, ""}),
      TensorPath("plain.name"),
      TensorPath("\xc3\xa9\"\\\x7f"),
      TensorPath("[not json]"),
  };
  for (const auto& p : paths) {
    EXPECT_EQ(decode_path(encode_path(p)), p) << hex(encode_path(p));
  }
}

TEST(TensorPathTest, DecodeAcceptsWhatPythonJsonAccepts) {
  EXPECT_EQ(decode_path("\x1e[ \"a\" , 1 ]"), P({"a", uint64_t{1}}));
  EXPECT_EQ(decode_path("\x1e[\"\\u00FC\\/\"]"), P({"\xc3\xbc/"}));
  EXPECT_EQ(decode_path("\x1e[\"\\uD83D\\uDE00\"]"), P({"\xf0\x9f\x98\x80"}));
  EXPECT_EQ(decode_path("\x1e[\"\xc3\xbc\"]"), P({"\xc3\xbc"})) << "raw UTF-8 inside JSON";
  EXPECT_EQ(decode_path("\x1e[0,\"0\"]"), P({uint64_t{0}, "0"}));
}

TEST(TensorPathTest, DecodeRejectsMalformedNames) {
  const std::vector<std::string> bad = {
      "",                               // empty
      std::string("\x1e", 1),           // marker only
      "\x1e[",                          // too short
      "\x1e[]",                         // no components
      "\x1e{\"a\":1}",                  // not an array
      "\x1e\"a\"]",                     // does not start with [
      "\x1e[\"a\"",                     // does not end with ]
      "\x1e[\"a\n\"]",                  // line break
      "\x1e[\"a\r\"]",                  // line break
      "\x1e[1.5]",                      // float
      "\x1e[1e3]",                      // float
      "\x1e[-1]",                       // negative
      "\x1e[01]",                       // leading zero
      "\x1e[true]",                     // bool
      "\x1e[null]",                     // null
      "\x1e[NaN]",                      // constant
      "\x1e[{}]",                       // object
      "\x1e[[1]]",                      // nested array
      "\x1e[\"a\",]",                   // trailing comma
      "\x1e[\"a\"\"b\"]",               // missing comma
      "\x1e[1]]",                       // trailing bytes
      "\x1e[\"a]",                      // unterminated string
      "\x1e[\"a\\x\"]",                 // bad escape
      "\x1e[\"\\u12\"]",                // truncated \u
      "\x1e[\"\\u12g4\"]",              // bad hex digit
      "\x1e[\"\\ud800\"]",              // lone high surrogate
      "\x1e[\"\\udc00\"]",              // lone low surrogate
      "\x1e[\"\x01\"]",                 // raw control character in a string
      "\x1e[99999999999999999999999]",  // integer too large
  };
  for (const auto& b : bad) {
    EXPECT_EQ(error_code_of([&] { decode_path(b); }), ErrorCode::kFormat) << hex(b);
  }
}

TEST(TensorPathTest, EncodeRejectsUnreadableNames) {
  EXPECT_EQ(error_code_of([] { encode_path(TensorPath()); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code_of([] { encode_path(TensorPath("")); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code_of([] { encode_path(TensorPath("\x1e[0]")); }), ErrorCode::kInvalidArgument);
  // A structured component must be valid UTF-8 to be written as JSON.
  EXPECT_EQ(error_code_of([] { encode_path(P({"a", "\xff"})); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_code_of([] {
              encode_path(P({"a", "\xed\xa0\x80"}));
            }),
            ErrorCode::kInvalidArgument);
}

TEST(TensorPathTest, DisplayPath) {
  EXPECT_EQ(display_path(TensorPath("a.b")), "a.b");
  EXPECT_EQ(display_path(P({"a", uint64_t{1}})), "[\"a\",1]");
}

// ---- dtype strings (docs/format.md §1.9)
// --------------------------------------------------------------

struct DTypeRow {
  std::string torch;
  std::string stored;
  uint32_t itemsize;
  uint32_t version;
};

std::string opaque(const char* np, const char* torch) { return std::string(np) + '\0' + torch; }

std::vector<DTypeRow> dtype_table() {
  std::vector<DTypeRow> rows = {
      {"torch.float16", "<f2", 2, 1},
      {"torch.float32", "<f4", 4, 1},
      {"torch.float64", "<f8", 8, 1},
      {"torch.int8", "|i1", 1, 1},
      {"torch.uint8", "|u1", 1, 1},
      {"torch.int16", "<i2", 2, 1},
      {"torch.int32", "<i4", 4, 1},
      {"torch.int64", "<i8", 8, 1},
      {"torch.bool", "|b1", 1, 1},
      {"torch.complex64", "<c8", 8, 1},
      {"torch.complex128", "<c16", 16, 1},
      {"torch.uint16", "<u2", 2, 1},
      {"torch.uint32", "<u4", 4, 1},
      {"torch.uint64", "<u8", 8, 1},
      {"torch.bfloat16", opaque("<V2", "torch.bfloat16"), 2, 2},
      {"torch.complex32", opaque("<V4", "torch.complex32"), 4, 2},
      {"torch.bits16", opaque("<V2", "torch.bits16"), 2, 2},
  };
  for (const char* n : {"float8_e5m2",
                        "float8_e4m3fn",
                        "float8_e5m2fnuz",
                        "float8_e4m3fnuz",
                        "float8_e8m0fnu",
                        "bits8",
                        "bits1x8",
                        "bits2x4",
                        "bits4x2",
                        "uint1",
                        "uint2",
                        "uint3",
                        "uint4",
                        "uint5",
                        "uint6",
                        "uint7",
                        "int1",
                        "int2",
                        "int3",
                        "int4",
                        "int5",
                        "int6",
                        "int7"}) {
    const std::string name = std::string("torch.") + n;
    rows.push_back({name, opaque("|V1", name.c_str()), 1, 2});
  }
  return rows;
}

TEST(DTypeTest, EveryTableRowBothWays) {
  for (const auto& row : dtype_table()) {
    SCOPED_TRACE(row.torch);
    EXPECT_EQ(dtype_string_for_torch(row.torch), row.stored);
    EXPECT_EQ(dtype_string_for_torch(row.torch.substr(6)), row.stored);
    DType d = parse_dtype(row.stored);
    EXPECT_EQ(d.torch_name(), row.torch);
    EXPECT_EQ(d.itemsize, row.itemsize);
    EXPECT_EQ(d.min_version(), row.version);
    EXPECT_EQ(d.opaque(), row.version == 2);
    EXPECT_EQ(torch_dtype_itemsize(row.torch), row.itemsize);
  }
}

TEST(DTypeTest, ParsedFields) {
  DType d = parse_dtype(opaque("<V2", "torch.bfloat16"));
  EXPECT_EQ(d.numpy, "<V2");
  EXPECT_EQ(d.torch, "torch.bfloat16");
  EXPECT_EQ(d.byte_order, '<');
  EXPECT_EQ(d.kind, 'V');
  d = parse_dtype("<c16");
  EXPECT_EQ(d.numpy, "<c16");
  EXPECT_EQ(d.torch, "");
  EXPECT_EQ(d.kind, 'c');
  EXPECT_EQ(d.itemsize, 16u);
}

TEST(DTypeTest, BothUnsignedSpellingsLoadAsTheSameTorchDType) {
  EXPECT_EQ(parse_dtype("<u2").torch_name(), "torch.uint16");
  EXPECT_EQ(parse_dtype(opaque("<V2", "torch.uint16")).torch_name(), "torch.uint16");
  EXPECT_EQ(parse_dtype("<u4").torch_name(), "torch.uint32");
  EXPECT_EQ(parse_dtype(opaque("<V4", "torch.uint32")).torch_name(), "torch.uint32");
  EXPECT_EQ(parse_dtype("<u8").torch_name(), "torch.uint64");
  EXPECT_EQ(parse_dtype(opaque("<V8", "torch.uint64")).torch_name(), "torch.uint64");
}

TEST(DTypeTest, NumpyStringsWithoutATorchDType) {
  EXPECT_EQ(parse_dtype(">f4").torch_name(), "") << "big-endian data cannot be wrapped";
  EXPECT_EQ(parse_dtype("<f16").torch_name(), "");
  EXPECT_EQ(parse_dtype("|S5").itemsize, 5u);
  EXPECT_EQ(parse_dtype("=i4").torch_name(), "torch.int32");
}

TEST(DTypeTest, Errors) {
  const std::vector<std::string> bad = {
      "",
      "<f",
      "f4",
      "xf4",
      "<fx",
      "<f0",
      "<f4x",
      "<f99999999",
      "<V2",                                         // opaque without torch name
      std::string("<V2\0", 4),                       // empty torch name
      opaque("<V2", "bfloat16"),                     // torch name without "torch."
      opaque("<V4", "torch.bfloat16"),               // size disagrees with the torch dtype
      opaque("<f4", "torch.float32"),                // torch part on a non-opaque type
      opaque("<V2", "torch.bfloat16") + '\0' + "x",  // two NULs
  };
  for (const auto& s : bad) {
    EXPECT_EQ(error_code_of([&] { parse_dtype(s); }), ErrorCode::kFormat) << hex(s);
  }
  for (const char* q :
       {"torch.qint8", "quint8", "torch.qint32", "torch.quint4x2", "torch.quint2x4"})
    EXPECT_EQ(error_code_of([&] { dtype_string_for_torch(q); }), ErrorCode::kUnsupported) << q;
  EXPECT_EQ(error_code_of([] { dtype_string_for_torch("torch.nonsense"); }),
            ErrorCode::kUnsupported);
  EXPECT_EQ(error_code_of([] { torch_dtype_itemsize("torch.nonsense"); }), ErrorCode::kUnsupported);
}

// ---- File header (docs/format.md §1.2)
// -----------------------------------------------------------------

TEST(FileHeaderTest, EncodeLayout) {
  FileHeader h;
  h.version = 2;
  h.flags = 1;  // not written below version 4
  h.tensor_size = 28;
  h.tensor_count = 2;
  h.index_size = 262144;
  std::string b = encode_file_header(h);
  ASSERT_EQ(b.size(), kPreludeSize);
  EXPECT_EQ(hex(b),
            "7c545a527c"
            "02000000" +
                std::string(64, '0') + "1c00000000000000" + std::string(16, '0') +
                "0200000000000000" + "0000040000000000");
  h.version = 4;
  b = encode_file_header(h);
  EXPECT_EQ(hex(b.substr(9, 32)), "01" + std::string(62, '0'));
}

TEST(FileHeaderTest, RoundTrip) {
  for (uint32_t v = 1; v <= 5; ++v) {
    FileHeader h;
    h.version = v;
    h.flags = v >= 4 ? 1 : 0;
    if (v == 5) h.flags = 3;
    h.tensor_size = 0x0102030405060708ull;
    h.tensor_count = 77;
    h.index_size = 1234;
    std::string b = encode_file_header(h);
    FileHeader p = parse_file_header(u8(b), b.size());
    EXPECT_EQ(p.version, v);
    EXPECT_EQ(p.flags, h.flags);
    EXPECT_EQ(p.tensor_size, h.tensor_size);
    EXPECT_EQ(p.tensor_count, 77u);
    EXPECT_EQ(p.index_size, 1234u);
  }
}

TEST(FileHeaderTest, CryptInfoRule) {
  FileHeader h;
  for (uint32_t v : {1u, 2u}) {
    h.version = v;
    h.flags = 0;
    EXPECT_FALSE(h.has_crypt_info());
  }
  h.version = 3;
  EXPECT_TRUE(h.has_crypt_info()) << "v3 always has crypt info";
  h.version = 4;
  EXPECT_FALSE(h.has_crypt_info());
  h.flags = 1;
  EXPECT_TRUE(h.has_crypt_info());
  h.version = 5;
  h.flags = 2;
  EXPECT_FALSE(h.has_crypt_info());
  EXPECT_TRUE(h.versioned_entries());
  h.flags = 3;
  EXPECT_TRUE(h.has_crypt_info());
}

TEST(FileHeaderTest, Rejections) {
  FileHeader h;
  h.version = 1;
  h.tensor_count = 1;
  h.index_size = 100;
  const std::string good = encode_file_header(h);
  auto code = [](std::string b) {
    return error_code_of([&] { parse_file_header(u8(b), b.size()); });
  };
  EXPECT_EQ(code(""), ErrorCode::kFormat);
  EXPECT_EQ(code("|TZR"), ErrorCode::kFormat);
  EXPECT_EQ(code("|TZX|" + good.substr(5)), ErrorCode::kFormat);
  for (size_t n = 0; n < kPreludeSize; ++n)
    EXPECT_EQ(code(good.substr(0, n)), ErrorCode::kFormat) << n;
  for (uint32_t v : {0u, 6u, 7u, 0xffffffffu}) {
    std::string b = good;
    codec::store_le<uint32_t>(b.data() + 5, v);
    EXPECT_EQ(code(b), ErrorCode::kUnsupportedVersion) << v;
    // The version is checked before the rest is needed (as the reference does).
    EXPECT_EQ(code(b.substr(0, 9)), ErrorCode::kUnsupportedVersion) << v;
  }
  for (size_t byte = 9; byte < 41; ++byte) {
    std::string b = good;
    codec::store_le<uint32_t>(b.data() + 5, 5);
    b[byte] = byte == 9 ? 4 : 1;  // bit 2, or any bit above 63
    EXPECT_EQ(code(b), ErrorCode::kUnsupportedVersion) << byte;
  }
  std::string b = good;
  codec::store_le<uint32_t>(b.data() + 5, 4);
  b[9] = 2;  // versioned entries below version 5
  EXPECT_EQ(code(b), ErrorCode::kFormat);
}

// ---- Index entries (docs/format.md §1.4, Appendix B)
// --------------------------------------------------

IndexEntry make_entry(std::string name, std::string dtype, std::vector<uint64_t> shape,
                      uint64_t header_offset, uint64_t header_size, uint64_t data_length,
                      TensorType type = TensorType::kStateDict) {
  IndexEntry e;
  e.name = name;
  e.path = decode_path(name);
  e.type = type;
  e.dtype = dtype;
  e.shape = shape;
  e.header_offset = header_offset;
  e.data_offset = header_offset + header_size;
  e.data_length = data_length;
  for (uint64_t d : shape)
    if (d >= (uint64_t{1} << 32)) e.entry_version = kLongDimsVersion;
  return e;
}

struct IndexFixture {
  FileHeader header;
  std::string block;
  uint64_t file_size = 1 << 20;
  std::vector<IndexEntry> parse() const {
    return parse_index(u8(block), block.size(), header, file_size);
  }
};

IndexFixture build_index(const std::vector<IndexEntry>& entries, bool versioned) {
  IndexFixture f;
  f.header.version = versioned ? 5 : 2;
  f.header.flags = versioned ? kFlagVersionedEntries : 0;
  f.header.tensor_count = entries.size();
  for (const auto& e : entries) encode_index_entry(e, versioned, f.block);
  f.header.index_size = f.block.size();
  return f;
}

TEST(IndexTest, EntryBytesMatchTheWorkedExample) {
  // Spec §1.12, entry "w" at offset 73.
  IndexEntry w = make_entry("w", "<f4", {2, 3}, 262217, 78, 24);
  std::string out;
  encode_index_entry(w, false, out);
  EXPECT_EQ(hex(out),
            "0100"
            "77"
            "02"
            "03"
            "3c6634"
            "02"
            "02000000"
            "03000000"
            "4900040000000000"
            "9700040000000000"
            "1800000000000000");
  EXPECT_EQ(index_entry_size(w, false), out.size());
  EXPECT_EQ(out.size(), 29u + 1 + 3 + 8);
  out.clear();
  encode_index_entry(w, true, out);
  EXPECT_EQ(hex(out.substr(0, 4)), "01000000");
  EXPECT_EQ(index_entry_size(w, true), out.size());
}

TEST(IndexTest, RoundTripPlainAndVersioned) {
  const std::vector<IndexEntry> entries = {
      make_entry("a", "<f4", {2, 3}, 1000, 78, 24, TensorType::kParam),
      make_entry("\x1e[\"m\",0]", opaque("<V2", "torch.bfloat16"), {5}, 2000, 100, 10),
      make_entry("s", "<i8", {}, 3000, 80, 8, TensorType::kBuffer),
      make_entry("e", "<f4", {0, 4}, 4000, 80, 0),
      make_entry("meta", "<f4", {3, 2}, 5000, 80, 0),
  };
  for (bool versioned : {false, true}) {
    IndexFixture f = build_index(entries, versioned);
    auto parsed = f.parse();
    ASSERT_EQ(parsed.size(), entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      const auto &a = entries[i], &b = parsed[i];
      EXPECT_EQ(b.name, a.name);
      EXPECT_EQ(b.path, a.path);
      EXPECT_EQ(b.type, a.type);
      EXPECT_EQ(b.dtype, a.dtype);
      EXPECT_EQ(b.shape, a.shape);
      EXPECT_EQ(b.header_offset, a.header_offset);
      EXPECT_EQ(b.data_offset, a.data_offset);
      EXPECT_EQ(b.data_length, a.data_length);
      EXPECT_EQ(b.entry_version, 1u);
    }
    EXPECT_EQ(parsed[2].expected_bytes(), 8u);
    EXPECT_EQ(parsed[2].num_elements(), 1u);
    EXPECT_FALSE(parsed[3].is_meta());
    EXPECT_EQ(parsed[3].expected_bytes(), 0u);
    EXPECT_TRUE(parsed[4].is_meta());
    EXPECT_EQ(parsed[4].expected_bytes(), 24u);
    EXPECT_EQ(parsed[1].itemsize(), 2u);
  }
}

TEST(IndexTest, LongDimsEntryLayout) {
  IndexEntry e = make_entry("long", "<f4", {uint64_t{1} << 32, 0}, 1000, 90, 0);
  ASSERT_TRUE(e.long_shape());
  std::string out;
  encode_index_entry(e, true, out);
  EXPECT_EQ(out.size(), 4u + 29 + 4 + 3 + 2 * 8);
  EXPECT_EQ(hex(out.substr(0, 4)), "05000000");
  EXPECT_EQ(hex(out.substr(4 + 2 + 4 + 1 + 1 + 3, 1 + 16)),
            "02"
            "0000000001000000"
            "0000000000000000");
  IndexFixture f = build_index({make_entry("a", "<f4", {2}, 900, 80, 8), e}, true);
  auto parsed = f.parse();
  ASSERT_EQ(parsed.size(), 2u);
  EXPECT_EQ(parsed[0].entry_version, 1u);
  EXPECT_EQ(parsed[1].entry_version, kLongDimsVersion);
  EXPECT_EQ(parsed[1].shape, (std::vector<uint64_t>{uint64_t{1} << 32, 0}));
}

TEST(IndexTest, TrailingZeroBytesAreIgnored) {
  IndexFixture f = build_index({make_entry("a", "<f4", {2}, 900, 80, 8)}, false);
  f.block.append(1000, '\0');
  f.header.index_size = f.block.size();
  EXPECT_EQ(f.parse().size(), 1u);
}

TEST(IndexTest, Rejections) {
  const IndexFixture good = build_index(
      {make_entry("a", "<f4", {2}, 900, 80, 8), make_entry("b", "<f4", {2}, 1000, 80, 8)}, false);
  auto code = [](const IndexFixture& f) { return error_code_of([&] { f.parse(); }); };
  ASSERT_EQ(good.parse().size(), 2u);
  {
    IndexFixture f = good;
    f.header.tensor_count = 0;
    EXPECT_EQ(code(f), ErrorCode::kFormat) << "empty index";
  }
  {
    IndexFixture f = good;
    f.header.tensor_count = 3;  // more entries than the block holds
    EXPECT_EQ(code(f), ErrorCode::kFormat);
    f.header.tensor_count = uint64_t{1} << 60;
    EXPECT_EQ(code(f), ErrorCode::kFormat);
  }
  for (size_t cut = 0; cut < good.block.size(); ++cut) {
    IndexFixture f = good;
    f.block.resize(cut);  // fewer bytes available than the header claims
    EXPECT_EQ(code(f), ErrorCode::kFormat) << cut;
  }
  {
    IndexFixture f = good;
    f.file_size = 1000;  // second tensor's data past the end
    EXPECT_EQ(code(f), ErrorCode::kFormat);
    f.file_size = 10;  // the index itself past the end
    EXPECT_EQ(code(f), ErrorCode::kFormat);
  }
  auto with = [&](std::vector<IndexEntry> entries, bool versioned = false) {
    return code(build_index(entries, versioned));
  };
  EXPECT_EQ(with({make_entry("a", "<f4", {2}, 900, 80, 9)}), ErrorCode::kFormat)
      << "length vs shape";
  EXPECT_EQ(with({make_entry("a", "<V2", {2}, 900, 80, 4)}), ErrorCode::kFormat) << "bad dtype";
  EXPECT_EQ(with({make_entry("a", "<f4", {2}, 3, 80, 8)}), ErrorCode::kFormat)
      << "header in prelude";
  EXPECT_EQ(with({make_entry("a", "<f4", {2}, 900, 4, 8)}), ErrorCode::kFormat) << "tiny header";
  EXPECT_EQ(with({make_entry("a", "<f4", {uint64_t{1} << 31, uint64_t{1} << 31, 8}, 900, 80, 0)}),
            ErrorCode::kFormat)
      << "size overflows";
  EXPECT_EQ(with({make_entry("\x1e[\"a\",0]", "<f4", {2}, 900, 80, 8, TensorType::kParam)}),
            ErrorCode::kFormat)
      << "structured name on a PARAM";
  EXPECT_EQ(
      with({make_entry("a", "<f4", {2}, 900, 80, 8), make_entry("a", "<f4", {2}, 1000, 80, 8)}),
      ErrorCode::kFormat)
      << "duplicate";
  try {  // the entry named as a user sees it (the label is made only on an error)
    build_index({make_entry("a", "<f4", {2}, 900, 80, 8), make_entry("a", "<f4", {2}, 1000, 80, 8)},
                false)
        .parse();
    ADD_FAILURE() << "a duplicate name parsed";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "index entry 1 ('a'): duplicate tensor name");
  }
  EXPECT_EQ(with({make_entry("\x1e[\"a\"]", "<f4", {2}, 900, 80, 8),
                  make_entry("\x1e[\"a\",\"b\"]", "<f4", {2}, 1000, 80, 8)}),
            ErrorCode::kFormat)
      << "leaf and prefix";
  EXPECT_EQ(with({make_entry("\x1e[\"a\",\"b\"]", "<f4", {2}, 900, 80, 8),
                  make_entry("a", "<f4", {2}, 1000, 80, 8)}),
            ErrorCode::kFormat)
      << "prefix then leaf (a plain name is the one-component path)";
  EXPECT_EQ(with({make_entry("\x1e[\"a\",0]", "<f4", {2}, 900, 80, 8),
                  make_entry("\x1e[\"a\",\"b\"]", "<f4", {2}, 1000, 80, 8)}),
            ErrorCode::kFormat)
      << "mixed keys";
  {
    std::string block;
    encode_index_entry(make_entry("a", "<f4", {2}, 900, 80, 8), false, block);
    block[2 + 1] = 3;  // tensor type 3
    IndexFixture f = good;
    f.block = block;
    f.header.tensor_count = 1;
    f.header.index_size = block.size();
    EXPECT_EQ(code(f), ErrorCode::kFormat);
  }
  {
    IndexFixture f = build_index({make_entry("a", "<f4", {2}, 900, 80, 8)}, true);
    f.block[0] = 2;  // unknown metadata version
    EXPECT_EQ(code(f), ErrorCode::kUnsupportedVersion);
  }
}

// ---- Per-tensor headers (docs/format.md §1.5, §1.6)
// ---------------------------------------------------

TensorHeaderFields fields(std::string_view name, std::string_view dtype,
                          const std::vector<uint64_t>& shape, uint64_t data_length) {
  TensorHeaderFields f;
  f.name = name;
  f.dtype = dtype;
  f.shape = &shape;
  f.data_length = data_length;
  return f;
}

TEST(TensorHeaderTest, WorkedExampleHeaderBytes) {
  const std::vector<uint64_t> shape = {2, 3};
  auto f = fields("w", "<f4", shape, 24);
  EncodedTensorHeader h = encode_tensor_header(f, 262217, 1);
  ASSERT_EQ(h.bytes.size(), 78u);
  EXPECT_EQ(hex(h.bytes.substr(0, 38)),
            "4e00000000000000"
            "0000"
            "02"
            "0100"
            "77"
            "03"
            "3c6634"
            "02"
            "02000000"
            "03000000"
            "2900"
            "02"
            "0004"
            "00000000"
            "0120");
  EXPECT_EQ(h.crc32_offset, 32u);
  EXPECT_EQ(h.sha256_offset, 38u);
  EXPECT_EQ(hex(h.bytes.substr(70)), "1800000000000000");
  // Hash over the header (values zero) then the data, as the spec's CRC32 0x2e2ffb9f.
  float data[6] = {0, 1, 2, 3, 4, 5};
  std::string hashed = h.bytes + std::string(reinterpret_cast<const char*>(data), 24);
  EXPECT_EQ(test::crc32_bitwise(hashed.data(), hashed.size()), 0x2e2ffb9fu);
  EXPECT_EQ(crc32_update(0, hashed.data(), hashed.size()), 0x2e2ffb9fu);
  TensorHasher hasher(true, true, h.bytes);
  hasher.update(data, 24);
  hasher.finish();
  EXPECT_EQ(hasher.crc32(), 0x2e2ffb9fu);
  EXPECT_EQ(to_hex(hasher.sha256().data(), 32), test::sha256_hex(hashed.data(), hashed.size()));
}

TEST(TensorHeaderTest, SizesFromTheSpec) {
  const std::vector<uint64_t> shape = {5};
  const std::string bf16 = opaque("<V2", "torch.bfloat16");
  auto f = fields("b", bf16, shape, 10);
  EXPECT_EQ(encode_tensor_header(f, 0, 1).bytes.size(), 66u + 1 + 18 + 4);
  // Encrypted data tensor: SHA-256 only plus the crypt field.
  f.crc32 = false;
  f.crypt_field = true;
  f.crypt_info_size = 52 + 16;
  EncodedTensorHeader e = encode_tensor_header(f, 0, 1);
  EXPECT_EQ(e.bytes.size(), 68u + 1 + 18 + 4 + f.crypt_info_size);
  EXPECT_EQ(e.crc32_offset, std::string::npos);
  // Meta tensor in an encrypted-flag file: both hashes and an empty CryptInfo (C=2).
  f.crc32 = true;
  f.crypt_info_size = 2;
  f.data_length = 0;
  EXPECT_EQ(encode_tensor_header(f, 0, 1).bytes.size(), 76u + 1 + 18 + 4);
}

TEST(TensorHeaderTest, RoundTripAllLayouts) {
  const std::vector<uint64_t> short_shape = {3, 1, 7};
  const std::vector<uint64_t> long_shape = {uint64_t{1} << 33, 0, 2};
  for (int layout = 0; layout < 8; ++layout) {
    const bool crypt = layout & 1, is_long = layout & 2, aligned = layout & 4;
    SCOPED_TRACE(layout);
    const auto& shape = is_long ? long_shape : short_shape;
    auto f = fields("\x1e[\"n\",1]", "<i2", shape, is_long ? 0 : 42);
    f.module_idx = 0xbeef;
    f.type = TensorType::kStateDict;
    f.long_shape = is_long;
    f.crypt_field = crypt;
    f.crypt_info_size = crypt ? 10 : 0;
    const uint64_t at = 262217;
    EncodedTensorHeader e = encode_tensor_header(f, at, aligned ? 64 : 1);
    if (aligned) {
      EXPECT_EQ((at + e.bytes.size()) % 64, 0u);
    }
    if (crypt) std::memset(e.bytes.data() + e.crypt_info_offset, 0x5a, 10);
    std::memset(e.bytes.data() + e.crc32_offset, 0x11, 4);
    std::memset(e.bytes.data() + e.sha256_offset, 0x22, 32);
    TensorHeader h = parse_tensor_header(u8(e.bytes), e.bytes.size(), crypt, is_long);
    EXPECT_EQ(h.header_size, e.bytes.size());
    EXPECT_EQ(h.module_idx, 0xbeef);
    EXPECT_EQ(h.type, TensorType::kStateDict);
    EXPECT_EQ(h.name, "\x1e[\"n\",1]");
    EXPECT_EQ(h.dtype, "<i2");
    EXPECT_EQ(h.shape, shape);
    EXPECT_EQ(h.data_length, is_long ? 0 : 42);
    ASSERT_EQ(h.hashes.size(), 2u);
    EXPECT_EQ(h.hashes[0].type, HashType::kCrc32);
    EXPECT_EQ(h.hashes[0].value_offset, e.crc32_offset);
    EXPECT_EQ(h.hashes[1].type, HashType::kSha256);
    EXPECT_EQ(h.hashes[1].value_offset, e.sha256_offset);
    EXPECT_EQ(h.has_crypt_field, crypt);
    if (crypt) {
      EXPECT_EQ(h.crypt_info_size, 10u);
      EXPECT_EQ(h.crypt_info(u8(e.bytes)), std::string(10, '\x5a'));
      EXPECT_EQ(h.crypt_field_offset + 8, e.crypt_info_offset);
    }
    // Hashable bytes: values zeroed, the crypt field (u64 + body) cut out, filler kept.
    std::string expect = e.bytes;
    std::memset(expect.data() + e.crc32_offset, 0, 4);
    std::memset(expect.data() + e.sha256_offset, 0, 32);
    if (crypt) expect.erase(e.crypt_info_offset - 8, 18);
    EXPECT_EQ(hex(hashable_header(u8(e.bytes), e.bytes.size(), h)), hex(expect));
  }
}

TEST(TensorHeaderTest, LongShapeHeaderUsesU64Dims) {
  const std::vector<uint64_t> shape = {uint64_t{1} << 32, 0};
  auto f = fields("x", "<f4", shape, 0);
  f.long_shape = true;
  EncodedTensorHeader e = encode_tensor_header(f, 0, 1);
  EXPECT_EQ(e.bytes.size(), 66u + 1 + 3 + 16);
  EXPECT_EQ(hex(e.bytes.substr(13 + 1 + 1 + 3, 17)),
            "02"
            "0000000001000000"
            "0000000000000000");
}

TEST(TensorHeaderTest, Rejections) {
  const std::vector<uint64_t> shape = {2};
  const auto f = fields("a", "<f4", shape, 8);
  const std::string good = encode_tensor_header(f, 0, 1).bytes;
  auto code = [](std::string b, bool crypt = false) {
    return error_code_of([&] { parse_tensor_header(u8(b), b.size(), crypt, false); });
  };
  ASSERT_NO_THROW(parse_tensor_header(u8(good), good.size(), false, false));
  for (size_t n = 0; n < good.size(); ++n)
    EXPECT_EQ(code(good.substr(0, n)), ErrorCode::kFormat) << n;
  std::string b = good;
  codec::store_le<uint64_t>(b.data(), 0);
  EXPECT_EQ(code(b), ErrorCode::kFormat) << "empty header";
  b = good + "xx";
  EXPECT_EQ(code(b), ErrorCode::kFormat) << "size disagrees";
  b = good;
  b[10] = 3;
  EXPECT_EQ(code(b), ErrorCode::kFormat) << "tensor type";
  const size_t hash_at = 8 + 2 + 1 + 2 + 1 + 1 + 3 + 1 + 4;  // u16 L
  b = good;
  b[hash_at + 3] = 2;
  EXPECT_EQ(code(b), ErrorCode::kFormat) << "hash type";
  b = good;
  b[hash_at + 4] = 5;
  EXPECT_EQ(code(b), ErrorCode::kFormat) << "CRC32 length";
  b = good;
  codec::store_le<uint16_t>(b.data() + hash_at, 7);
  EXPECT_EQ(code(b), ErrorCode::kFormat) << "entries overrun the hash section";
  b = good;
  codec::store_le<uint16_t>(b.data() + hash_at, 0xffff);
  EXPECT_EQ(code(b), ErrorCode::kFormat) << "hash section past the header";
  b = good;
  b[hash_at + 2] = 9;
  EXPECT_EQ(code(b), ErrorCode::kFormat) << "hash count";
  b = good;
  codec::store_le<int64_t>(b.data() + b.size() - 8, -8);
  EXPECT_NE(code(b), ErrorCode::kCancelled) << "negative data length";
  // A crypt field whose length runs past the header.
  auto fc = f;
  fc.crypt_field = true;
  fc.crypt_info_size = 4;
  b = encode_tensor_header(fc, 0, 1).bytes;
  ASSERT_NO_THROW(parse_tensor_header(u8(b), b.size(), true, false));
  codec::store_le<uint64_t>(b.data() + b.size() - 8 - 4 - 8, 5);
  EXPECT_EQ(code(b, true), ErrorCode::kFormat);
  codec::store_le<uint64_t>(b.data() + b.size() - 8 - 4 - 8, ~uint64_t{0});
  EXPECT_EQ(code(b, true), ErrorCode::kFormat);
  // The same bytes read without crypt info leave the crypt field as (hashed) filler.
  EXPECT_NO_THROW(parse_tensor_header(u8(b), b.size(), false, false));
}

TEST(TensorHeaderTest, CheckAgainstIndexEntry) {
  const std::vector<uint64_t> shape = {2};
  const auto f = fields("a", "<f4", shape, 8);
  const std::string b = encode_tensor_header(f, 900, 1).bytes;
  TensorHeader h = parse_tensor_header(u8(b), b.size(), false, false);
  IndexEntry e = make_entry("a", "<f4", {2}, 900, b.size(), 8);
  EXPECT_NO_THROW(check_header_matches_entry(h, e));
  auto mismatch = [&](auto change) {
    IndexEntry x = e;
    change(x);
    return error_code_of([&] { check_header_matches_entry(h, x); });
  };
  EXPECT_EQ(mismatch([](IndexEntry& x) { x.name = "b"; }), ErrorCode::kFormat);
  EXPECT_EQ(mismatch([](IndexEntry& x) { x.type = TensorType::kParam; }), ErrorCode::kFormat);
  EXPECT_EQ(mismatch([](IndexEntry& x) { x.dtype = "<i4"; }), ErrorCode::kFormat);
  EXPECT_EQ(mismatch([](IndexEntry& x) { x.shape = {1, 2}; }), ErrorCode::kFormat);
  EXPECT_EQ(mismatch([](IndexEntry& x) { x.data_length = 0; }), ErrorCode::kFormat);
}

// ---- Whole files, byte-exact with the reference writer ---------------------------------------

std::string write_unaligned(const std::string& path, const std::vector<WriteRequest>& reqs) {
  WriterOptions o;
  o.alignment = 1;
  o.large_alignment = 1;
  auto w = Writer::open(path, o);
  w->write(reqs);
  w->close();
  return test::read_file(path);
}

WriteRequest req(TensorPath p, const std::string& torch, std::vector<uint64_t> shape,
                 const void* data, bool meta = false) {
  WriteRequest r;
  r.path = std::move(p);
  r.dtype = dtype_string_for_torch(torch);
  r.shape = std::move(shape);
  r.data = data;
  r.meta = meta;
  return r;
}

TEST(WholeFileTest, WorkedExampleIsByteExact) {
  test::TempDir dir;
  const float w[6] = {0, 1, 2, 3, 4, 5};
  const uint16_t b[2] = {0x3f80, 0x4000};  // bfloat16 1, 2
  const std::string f = write_unaligned(
      dir.path("x.tensors"),
      {req(TensorPath("w"), "float32", {2, 3}, w), req(TensorPath("b"), "bfloat16", {2}, b)});
  ASSERT_EQ(f.size(), 262420u);
  EXPECT_EQ(hex(f.substr(0, 73)),
            "7c545a527c"
            "02000000" +
                std::string(64, '0') + "1c00000000000000" + std::string(16, '0') +
                "0200000000000000"
                "0000040000000000");
  EXPECT_EQ(hex(f.substr(73, 41)),
            "0100"
            "77"
            "02"
            "03"
            "3c6634"
            "02"
            "02000000"
            "03000000"
            "4900040000000000"
            "9700040000000000"
            "1800000000000000");
  EXPECT_EQ(hex(f.substr(114, 52)),
            "0100"
            "62"
            "02"
            "12"
            "3c563200746f7263682e62666c6f61743136"
            "01"
            "02000000"
            "af00040000000000"
            "0801040000000000"
            "0400000000000000");
  EXPECT_EQ(f.find_first_not_of('\0', 166), 262217u) << "unused index bytes are zero";
  EXPECT_EQ(hex(f.substr(262217, 8)), "4e00000000000000");
  EXPECT_EQ(hex(f.substr(262225, 19)),
            "0000"
            "02"
            "0100"
            "77"
            "03"
            "3c6634"
            "02"
            "02000000"
            "03000000");
  EXPECT_EQ(hex(f.substr(262244, 9)),
            "2900"
            "02"
            "0004"
            "9ffb2f2e");
  EXPECT_EQ(hex(f.substr(262253, 2)), "0120");
  EXPECT_EQ(hex(f.substr(262287, 8)), "1800000000000000");
  EXPECT_EQ(f.substr(262295, 24), std::string(reinterpret_cast<const char*>(w), 24));
  EXPECT_EQ(hex(f.substr(262319, 8)), "5900000000000000");  // 89 = 66 + 1 + 18 + 4
  EXPECT_EQ(hex(f.substr(262408, 4)), "803f0040");
  EXPECT_EQ(hex(f.substr(262412)), std::string(16, '0')) << "end marker";
  // The whole file as tensorizer 2.12.1 writes it (same bytes as 2.11.1 for version 2).
  EXPECT_EQ(test::sha256_hex(f.data(), f.size()),
            "e70d5801b9066ca950748a6bb35ad00cb6df180c41f423ac028130102db5f2d3");
}

TEST(WholeFileTest, StructuredNamesAreByteExact) {
  test::TempDir dir;
  const double x = 3;
  const uint8_t l0 = 1, l1 = 1;
  const std::string nasty = "\xc3\xa9\n\"\\\x7f\x01\t\xf0\x9f\x98\x80/";
  const std::string f =
      write_unaligned(dir.path("n.tensors"), {req(P({"x", nasty}), "float64", {1}, &x),
                                              req(P({"l", uint64_t{0}}), "uint8", {1}, &l0),
                                              req(P({"l", uint64_t{1}}), "bool", {1}, &l1)});
  EXPECT_EQ(f.size(), 262518u);
  EXPECT_EQ(f.substr(75, 0x30),
            "\x1e[\"x\",\"\\u00e9\\n\\\"\\\\\\u007f\\u0001\\t\\ud83d\\ude00/\"]");
  EXPECT_EQ(test::sha256_hex(f.data(), f.size()),
            "51e4d51060557fa5d61ad928f15ff47b587b1b1de2bed655a62f7b1700d1aa6a");
}

TEST(WholeFileTest, MetaTensorFileIsByteExact) {
  test::TempDir dir;
  const float real[3] = {1, 2, 3};
  const std::string f = write_unaligned(
      dir.path("m.tensors"), {req(TensorPath("real"), "float32", {3}, real),
                              req(TensorPath("ghost"), "float32", {3, 2}, nullptr, true)});
  EXPECT_EQ(codec::load_le<uint32_t>(f.data() + 5), 4u);
  EXPECT_EQ(f.size(), 262396u);
  EXPECT_EQ(test::sha256_hex(f.data(), f.size()),
            "7d3a07c2c56da4d53728c4b2da1ae1b5b7386f1fbb56b2453f646647df17d32f");
}

TEST(WholeFileTest, LongDimsVersion5IsByteExact) {
  // What tensorizer 2.12.1 writes for a dim >= 2^32: data version 5, feature flag 2 (versioned
  // index entries), every entry tagged with a u32 metadata version (1, or 5 with u64 dims in the
  // entry and in that tensor's header).
  test::TempDir dir;
  const float a[2] = {1, 2};
  const int16_t z = 7;
  const std::string f = write_unaligned(
      dir.path("l.tensors"), {req(TensorPath("a"), "float32", {2}, a),
                              req(TensorPath("long"), "float32", {uint64_t{1} << 32, 0}, nullptr),
                              req(TensorPath("z"), "int16", {1}, &z)});
  EXPECT_EQ(codec::load_le<uint32_t>(f.data() + 5), 5u);
  EXPECT_EQ(hex(f.substr(9, 32)), "02" + std::string(62, '0'));
  EXPECT_EQ(hex(f.substr(73, 4)), "01000000");
  EXPECT_EQ(f.size(), 262472u);
  EXPECT_EQ(test::sha256_hex(f.data(), f.size()),
            "eb13795edd409b3caf33737bafbb6c7e40c44c975e87d27fafeac3a8fbafac60");
  // And it reads back, hashes included.
  auto r = Reader::open(dir.path("l.tensors"));
  ASSERT_EQ(r->entries().size(), 3u);
  EXPECT_EQ(r->entries()[1].shape, (std::vector<uint64_t>{uint64_t{1} << 32, 0}));
  EXPECT_TRUE(r->verify_all(1).empty());
}

}  // namespace
}  // namespace tensorizer
