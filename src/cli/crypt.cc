// `tensorizer encrypt IN OUT` and `tensorizer decrypt IN OUT`: add or remove the encryption of an
// existing .tensors object on any transport (open_source / open_sink), streaming with bounded
// memory: small tensors in batches (loaded, checked and written on all cores), large ones piece by
// piece (Reader::read_streamed into Writer::write_streamed). Every input tensor's stored hashes
// are checked on the way, so a corrupt input never becomes a freshly hashed output; on any error
// the output is discarded.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>

#include "cli/commands.h"
#include "tensorizer/error.h"
#include "tensorizer/writer.h"

namespace tensorizer::cli {
namespace {

constexpr uint64_t kBatchBytes = 64ull << 20;   // memory for a batch of small tensors
constexpr uint64_t kStreamAbove = 16ull << 20;  // tensors larger than this are streamed

struct CryptOptions {
  std::string in, out;
  std::string opslimit = "moderate", memlimit = "moderate";
  bool quiet = false;
};

uint64_t kdf_limit(const std::string& v, bool ops) {
  if (v == "min") return ops ? OpsLimit::kMin : MemLimit::kMin;
  if (v == "interactive") return ops ? OpsLimit::kInteractive : MemLimit::kInteractive;
  if (v == "moderate") return ops ? OpsLimit::kModerate : MemLimit::kModerate;
  if (v == "sensitive") return ops ? OpsLimit::kSensitive : MemLimit::kSensitive;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0')
    fail(ErrorCode::kInvalidArgument,
         std::string(ops ? "--opslimit" : "--memlimit") + " '" + v +
             "': expected min, interactive, moderate, sensitive or a number");
  return n;
}

EncryptionParams encryption_params(const CommonOptions& common, const CryptOptions& o) {
  if (common.key_file.empty() == common.passphrase_env.empty())
    fail(ErrorCode::kInvalidArgument, "give exactly one of --key-file and --passphrase-env");
  if (!common.passphrase_env.empty()) {
    const char* p = std::getenv(common.passphrase_env.c_str());
    if (!p || !*p)
      fail(ErrorCode::kInvalidArgument,
           "environment variable '" + common.passphrase_env + "' is not set");
    return EncryptionParams::from_passphrase(p, kdf_limit(o.opslimit, true),
                                             kdf_limit(o.memlimit, false));
  }
  // The key file is read exactly as for decryption (32 raw bytes).
  return EncryptionParams::from_key(*reader_options(common).decryption->key);
}

// Copies every tensor of `in` into a new object at `out`, re-encoded by `wo`.
void copy_tensors(Reader& in, const std::string& out, WriterOptions wo, int workers, bool quiet) {
  const auto& entries = in.entries();
  uint64_t index_bytes = 0;
  for (const auto& e : entries) index_bytes += index_entry_size(e, true);
  wo.index_reserve = std::max<uint64_t>(kReferenceIndexSize, index_bytes);
  wo.num_workers = workers;
  auto writer = Writer::open(out, wo);
  LoadOptions lo;
  lo.num_workers = workers;
  lo.verify_hash = true;

  auto request = [&](size_t i, const LoadedTensorInfo& info) {
    const IndexEntry& e = entries[i];
    WriteRequest r;
    r.path = e.path;
    r.type = e.type;
    r.module_idx = info.module_idx;
    r.dtype = e.dtype;
    r.shape = e.shape;
    r.meta = e.is_meta();
    return r;
  };

  std::vector<size_t> batch;
  uint64_t batch_bytes = 0;
  auto flush = [&] {
    if (batch.empty()) return;
    std::unique_ptr<uint8_t[]> buf(new uint8_t[std::max<uint64_t>(batch_bytes, 1)]);
    std::vector<TensorDestination> dests;
    std::vector<const void*> data(batch.size(), nullptr);
    uint64_t off = 0;
    for (size_t k = 0; k < batch.size(); ++k) {
      if (entries[batch[k]].is_meta()) continue;  // no bytes: only its header is needed
      dests.push_back({batch[k], buf.get() + off});
      data[k] = buf.get() + off;
      off += entries[batch[k]].data_length;
    }
    in.load(dests, lo);
    std::vector<WriteRequest> reqs;
    for (size_t k = 0; k < batch.size(); ++k) {
      const LoadedTensorInfo* info = in.loaded_info(batch[k]);
      reqs.push_back(request(batch[k], info ? *info : in.read_header(batch[k])));
      reqs.back().data = data[k];
    }
    writer->write(reqs);
    batch.clear();
    batch_bytes = 0;
  };

  for (size_t i = 0; i < entries.size(); ++i) {
    const IndexEntry& e = entries[i];
    if (e.data_length <= kStreamAbove) {
      if (batch_bytes + e.data_length > kBatchBytes) flush();
      batch.push_back(i);
      batch_bytes += e.data_length;
      continue;
    }
    flush();
    const LoadedTensorInfo& info = in.read_header(i);
    writer->write_streamed(request(i, info), [&](const Writer::Emit& emit) {
      in.read_streamed(
          i, [&](uint64_t, const uint8_t* data, size_t n) { emit(data, n); }, lo);
    });
  }
  flush();
  writer->close();
  if (!quiet)
    std::fprintf(stderr, "wrote %s: %zu tensors, data version %u%s\n", out.c_str(), entries.size(),
                 writer->header().version, writer->header().has_crypt_info() ? ", encrypted" : "");
}

void run_encrypt(const CommonOptions& common, const CryptOptions& o) {
  const EncryptionParams params = encryption_params(common, o);
  ReaderOptions ro;
  ro.transport = common.transport;
  ro.without_key = true;
  auto in = Reader::open(o.in, ro);
  if (in->encrypted())
    fail(ErrorCode::kInvalidArgument, "'" + o.in + "' is already encrypted; decrypt it first");
  WriterOptions wo;
  wo.transport = common.transport;
  wo.encryption = params;
  copy_tensors(*in, o.out, wo, common.workers, o.quiet);
}

void run_decrypt(const CommonOptions& common, const CryptOptions& o) {
  if (common.key_file.empty() == common.passphrase_env.empty())
    fail(ErrorCode::kInvalidArgument, "give exactly one of --key-file and --passphrase-env");
  auto in = Reader::open(o.in, reader_options(common));
  WriterOptions wo;
  wo.transport = common.transport;
  copy_tensors(*in, o.out, wo, common.workers, o.quiet);
}

CLI::App* add_crypt_command(CLI::App& app, const char* name, const char* help,
                            CommonOptions& common, std::shared_ptr<CryptOptions> o) {
  auto* cmd = app.add_subcommand(name, help);
  cmd->add_option("IN", o->in, "path or URI to read")->required();
  cmd->add_option("OUT", o->out, "path or URI to write")->required();
  cmd->add_flag("--quiet,-q", o->quiet, "no summary line");
  add_common_options(cmd, common);
  return cmd;
}

}  // namespace

void register_crypt(CLI::App& app, CommonOptions& common) {
  auto enc = std::make_shared<CryptOptions>();
  auto* e =
      add_crypt_command(app, "encrypt",
                        "encrypt an unencrypted .tensors object (key from --key-file, or derived "
                        "from the passphrase in --passphrase-env with Argon2id)",
                        common, enc);
  e->add_option("--opslimit", enc->opslimit,
                "Argon2id cost: min, interactive, moderate (default), sensitive or N");
  e->add_option("--memlimit", enc->memlimit,
                "Argon2id memory: min, interactive, moderate (default), sensitive or bytes");
  e->callback([enc, &common] { run_encrypt(common, *enc); });

  auto dec = std::make_shared<CryptOptions>();
  auto* d =
      add_crypt_command(app, "decrypt", "remove the encryption of a .tensors object", common, dec);
  d->callback([dec, &common] { run_decrypt(common, *dec); });
}

}  // namespace tensorizer::cli
