// `tensorizer encrypt IN OUT` and `tensorizer decrypt IN OUT`: add or remove the encryption of an
// existing .tensors object on any transport (open_source / open_sink), streaming with bounded
// memory through convert_to_tensors (tensorizer/convert.h): every input tensor's stored hashes are
// checked on the way, so a corrupt input never becomes a freshly hashed output; on any error the
// output is discarded.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>

#include "cli/commands.h"
#include "tensorizer/convert.h"
#include "tensorizer/error.h"
#include "tensorizer/writer.h"

namespace tensorizer::cli {
namespace {

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
  wo.num_workers = workers;
  const FileHeader h = convert_to_tensors(in, out, wo);
  if (!quiet)
    std::fprintf(stderr, "wrote %s: %zu tensors, data version %u%s\n", out.c_str(),
                 in.entries().size(), h.version, h.has_crypt_info() ? ", encrypted" : "");
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
