// Fixture tests: every file the reference tensorizer 2.11.1 wrote (tests/fixtures) is listed
// exactly as its manifest says, loads with the manifest's SHA-256 per tensor (unencrypted files),
// and the CLI's `inspect --json` and `verify` agree.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "tensorizer/dtype.h"
#include "tensorizer/error.h"
#include "tensorizer/format.h"
#include "tensorizer/reader.h"
#include "test_util.h"

namespace tensorizer {
namespace {

using nlohmann::json;

const json& file_manifest(const std::string& name) { return test::manifest()["files"][name]; }

bool is_encrypted(const json& m) { return m.contains("encryption") && !m["encryption"].is_null(); }

std::unique_ptr<Reader> open_fixture(const std::string& name) {
  ReaderOptions o;
  o.without_key = is_encrypted(file_manifest(name));
  return Reader::open(test::fixture_path(name), o);
}

uint64_t product(const json& shape) {
  uint64_t n = 1;
  for (const auto& d : shape) n *= d.get<uint64_t>();
  return n;
}

// Checks each loaded buffer against the manifest (meta tensors: zeros of their full size).
void expect_manifest_bytes(const Reader& r, const json& tensors, const std::vector<size_t>& which,
                           const std::vector<std::string>& buffers) {
  ASSERT_EQ(which.size(), buffers.size());
  for (size_t k = 0; k < which.size(); ++k) {
    const json& t = tensors[which[k]];
    SCOPED_TRACE(t["name"].dump());
    const std::string& b = buffers[k];
    ASSERT_EQ(b.size(), r.entries()[which[k]].expected_bytes());
    if (t["meta"].get<bool>()) {
      EXPECT_GT(b.size(), 0u);
      EXPECT_EQ(b.find_first_not_of('\0'), std::string::npos) << "meta tensors load as zeros";
    } else {
      EXPECT_EQ(test::sha256_hex(b.data(), b.size()), t["sha256"].get<std::string>());
    }
  }
}

TEST(FixturesTest, ManifestIsComplete) {
  const auto names = test::all_fixtures();
  EXPECT_GE(names.size(), 7u);
  for (const auto& n : names) {
    SCOPED_TRACE(n);
    const std::string bytes = test::read_file(test::fixture_path(n));
    EXPECT_EQ(test::sha256_hex(bytes.data(), bytes.size()),
              file_manifest(n)["file_sha256"].get<std::string>());
  }
}

TEST(FixturesTest, ReaderListsEveryFileAsTheManifestSays) {
  for (const auto& name : test::all_fixtures()) {
    SCOPED_TRACE(name);
    const json& m = file_manifest(name);
    auto r = open_fixture(name);
    EXPECT_EQ(r->header().version, m["version"].get<uint32_t>());
    EXPECT_EQ(r->header().flags, m["flags"].get<uint64_t>());
    EXPECT_EQ(r->source().size(), m["size"].get<uint64_t>());
    EXPECT_EQ(r->encrypted(), is_encrypted(m));
    const json& tensors = m["tensors"];
    ASSERT_EQ(r->entries().size(), tensors.size());
    EXPECT_EQ(r->header().tensor_count, tensors.size());
    uint64_t data_total = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const json& t = tensors[i];
      const IndexEntry& e = r->entries()[i];
      SCOPED_TRACE(t["name"].dump());
      EXPECT_EQ(e.path, test::path_from_json(t["name"]));
      EXPECT_EQ(e.path.is_plain(), t["name"].is_string());
      EXPECT_EQ(static_cast<int>(e.type), t["type"].get<int>());
      EXPECT_EQ(parse_dtype(e.dtype).torch_name(), t["torch_dtype"].get<std::string>());
      EXPECT_EQ(e.shape, t["shape"].get<std::vector<uint64_t>>());
      EXPECT_EQ(e.is_meta(), t["meta"].get<bool>());
      // nbytes is what is stored: 0 for meta tensors, which still load their full size.
      EXPECT_EQ(e.data_length, t["nbytes"].get<uint64_t>());
      EXPECT_EQ(e.expected_bytes(), product(t["shape"]) * e.itemsize());
      if (!t["meta"].get<bool>()) {
        EXPECT_EQ(e.expected_bytes(), t["nbytes"].get<uint64_t>());
      }
      const LoadedTensorInfo& info = r->read_header(i);
      EXPECT_EQ(info.module_idx, t["module_idx"].get<uint16_t>());
      EXPECT_EQ(info.header.has_crypt_field, r->encrypted());
      EXPECT_EQ(r->loaded_info(i), &info);
      EXPECT_EQ(r->find(e.name), i);
      data_total += e.data_length;
    }
    EXPECT_EQ(r->header().tensor_size, data_total);
  }
}

// The parts a Redis store keeps (object_parts): the prelude and index, then each tensor's header
// and data as the reference laid them out, which in its files tile the object up to the 8-byte
// end marker.
TEST(FixturesTest, ObjectPartsTileTheFile) {
  for (const auto& name : test::all_fixtures()) {
    SCOPED_TRACE(name);
    auto r = open_fixture(name);
    const std::vector<NamedRange> parts = object_parts(r->header(), r->entries());
    ASSERT_FALSE(parts.empty());
    EXPECT_EQ(parts[0].name, "header");
    EXPECT_EQ(parts[0].offset, 0u);
    EXPECT_EQ(parts[0].size, kPreludeSize + r->header().index_size);
    uint64_t end = 0;
    size_t data_parts = 0;
    for (const NamedRange& p : parts) {
      EXPECT_EQ(p.offset, end) << p.name;
      end = p.offset + p.size;
    }
    for (const IndexEntry& e : r->entries()) data_parts += e.data_length > 0;
    EXPECT_EQ(parts.size(), 1 + r->entries().size() + data_parts);
    EXPECT_EQ(end + 8, r->source().size());
  }
}

TEST(FixturesTest, UnencryptedFilesLoadWithTheManifestHashes) {
  for (const auto& name : test::unencrypted_fixtures()) {
    SCOPED_TRACE(name);
    const json& tensors = file_manifest(name)["tensors"];
    auto r = open_fixture(name);
    std::vector<size_t> all;
    for (size_t i = 0; i < tensors.size(); ++i) all.push_back(i);
    for (int workers : {1, 2}) {
      for (bool verify : {true, false}) {
        SCOPED_TRACE(workers);
        LoadOptions o;
        o.num_workers = workers;
        o.verify_hash = verify;
        auto buffers = test::load_entries(*r, o);
        expect_manifest_bytes(*r, tensors, all, buffers);
        for (size_t i = 0; i < tensors.size(); ++i) {
          ASSERT_NE(r->loaded_info(i), nullptr);
          EXPECT_EQ(r->loaded_info(i)->module_idx, tensors[i]["module_idx"].get<uint16_t>());
        }
      }
    }
    // A filtered subset, requested out of file order: every other tensor, backwards.
    std::vector<size_t> subset;
    for (size_t i = tensors.size(); i-- > 0;)
      if (i % 2 == 1 || tensors.size() == 1) subset.push_back(i);
    LoadOptions o;
    o.num_workers = 2;
    o.verify_hash = true;
    auto buffers = test::load_entries(*r, o, subset);
    expect_manifest_bytes(*r, tensors, subset, buffers);
    for (int workers : {1, 2}) EXPECT_TRUE(r->verify_all(workers).empty()) << workers;
  }
}

TEST(FixturesTest, EncryptedFilesNeedAKeyToOpenForLoading) {
  for (const auto& name : test::all_fixtures()) {
    if (!is_encrypted(file_manifest(name))) continue;
    SCOPED_TRACE(name);
    try {
      Reader::open(test::fixture_path(name));
      ADD_FAILURE() << "opened without a key";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCrypto);
    }
    auto r = open_fixture(name);  // without_key: the index is readable, loads are refused
    std::string buf(r->entries()[0].expected_bytes(), '\0');
    try {
      r->load({{0, buf.data()}});
      ADD_FAILURE() << "loaded without a key";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCrypto);
    }
  }
}

TEST(FixturesTest, RequestingDecryptionOfAPlainFileFails) {
  ReaderOptions o;
  o.decryption = DecryptionParams::from_key(Key{});
  for (const auto& name : test::unencrypted_fixtures()) {
    try {
      Reader::open(test::fixture_path(name), o);
      ADD_FAILURE() << name;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCrypto) << name;
    }
  }
}

// ---- The CLI over the fixtures ----------------------------------------------------------------

TEST(FixturesCliTest, InspectJsonMatchesTheManifest) {
  if (test::cli_path().empty()) GTEST_SKIP() << "CLI not built";
  for (const auto& name : test::all_fixtures()) {
    SCOPED_TRACE(name);
    const json& m = file_manifest(name);
    std::string out;
    ASSERT_EQ(test::run_cli("inspect --json " + test::shell_quote(test::fixture_path(name)), &out),
              0)
        << out;
    json j = json::parse(out);
    EXPECT_EQ(j["version"], m["version"]);
    EXPECT_EQ(j["flags"], m["flags"]);
    EXPECT_EQ(j["file_size"], m["size"]);
    EXPECT_EQ(j["encrypted"].get<bool>(), is_encrypted(m));
    ASSERT_EQ(j["tensors"].size(), m["tensors"].size());
    EXPECT_EQ(j["tensor_count"].get<size_t>(), m["tensors"].size());
    for (size_t i = 0; i < m["tensors"].size(); ++i) {
      const json &t = m["tensors"][i], &o = j["tensors"][i];
      SCOPED_TRACE(t["name"].dump());
      EXPECT_EQ(o["name"], t["name"]);
      EXPECT_EQ(o["type"], t["type"]);
      EXPECT_EQ(o["module_idx"], t["module_idx"]);
      EXPECT_EQ(o["torch_dtype"], t["torch_dtype"]);
      EXPECT_EQ(o["shape"], t["shape"]);
      EXPECT_EQ(o["nbytes"], t["nbytes"]);  // stored bytes, exactly as the manifest (0 for meta)
      EXPECT_EQ(o["loaded_bytes"].get<uint64_t>(),
                product(t["shape"]) * parse_dtype(o["dtype"].get<std::string>()).itemsize);
      EXPECT_EQ(o["encrypted"].get<bool>(), is_encrypted(m) && t["nbytes"].get<uint64_t>() > 0);
    }
  }
}

TEST(FixturesCliTest, VerifyPassesOnUnencryptedFixtures) {
  if (test::cli_path().empty()) GTEST_SKIP() << "CLI not built";
  for (const auto& name : test::unencrypted_fixtures()) {
    std::string out;
    EXPECT_EQ(test::run_cli("verify " + test::shell_quote(test::fixture_path(name)), &out), 0)
        << name << ": " << out;
    EXPECT_NE(out.find("OK"), std::string::npos) << out;
  }
}

TEST(FixturesCliTest, VerifyNamesTheTensorWithAFlippedDataByte) {
  if (test::cli_path().empty()) GTEST_SKIP() << "CLI not built";
  test::TempDir dir;
  auto r = open_fixture("dtypes.tensors");
  const auto& entries = r->entries();
  for (const char* victim : {"big.f16", "t.bfloat16", "scalar.i64"}) {
    SCOPED_TRACE(victim);
    auto i = r->find(victim);
    ASSERT_TRUE(i.has_value());
    std::string bytes = test::read_file(test::fixture_path("dtypes.tensors"));
    bytes[entries[*i].data_offset + entries[*i].data_length / 2] ^= 0x01;
    const std::string copy = dir.path(std::string(victim) + ".tensors");
    test::write_file(copy, bytes);
    std::string out;
    EXPECT_EQ(test::run_cli("verify " + test::shell_quote(copy), &out), 1) << out;
    EXPECT_NE(out.find("MISMATCH tensor '" + std::string(victim) + "'"), std::string::npos) << out;
    // Only that tensor is named.
    size_t count = 0;
    for (size_t p = out.find("MISMATCH"); p != std::string::npos; p = out.find("MISMATCH", p + 1))
      ++count;
    EXPECT_EQ(count, 1u) << out;
  }
}

}  // namespace
}  // namespace tensorizer
