// Cancelling engine work (tensorizer/cancel.h): a cancelled token stops loads on every route and
// writes (publishing nothing), a passed deadline is a kDeadline error naming the operation, and a
// token cancelled from another thread ends an HTTP open that waits on a server that never answers
// (its stall timeout is far longer than the test runs), with workers inheriting the token, and a
// long Argon2id derivation (which itself cannot stop) stops being waited for.
#include "tensorizer/cancel.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "common/worker_pool.h"
#include "tensorizer/crypto.h"
#include "tensorizer/host_load.h"
#include "tensorizer/reader.h"
#include "tensorizer/transport.h"
#include "tensorizer/writer.h"
#include "test_util.h"

namespace tensorizer {
namespace {

std::string sample_file(test::TempDir& dir) {
  const std::string path = dir.path("m.tensors");
  test::write_sample_tensors(path, {{"a", std::string(1 << 20, 'a')}, {"b", std::string(64, 'b')}},
                             "<f4");
  return path;
}

ErrorCode code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return ErrorCode::kInvalidArgument;  // not thrown: never what a test expects
}

TEST(Cancel, ACancelledTokenStopsLoadsOnEveryRouteAndWorkersInheritIt) {
  test::TempDir dir;
  const std::string path = sample_file(dir);
  CancelToken token;
  token.cancel();
  CancelScope scope(&token);
  auto r = Reader::open(path);  // opening checks nothing: only work items do
  std::vector<uint8_t> a(r->entries()[0].expected_bytes()), b(r->entries()[1].expected_bytes());
  EXPECT_EQ(code_of([&] { r->load({{0, a.data()}, {1, b.data()}}); }), ErrorCode::kCancelled);
  for (HostRoute route : {HostRoute::kAuto, HostRoute::kMap, HostRoute::kDirect, HostRoute::kCopy})
    EXPECT_EQ(code_of([&] { load_to_host(*r, {0, 1}, {}, route); }), ErrorCode::kCancelled);
  std::atomic<int> ran{0};
  EXPECT_EQ(code_of([&] { parallel_for(100, 4, [&](size_t) { ++ran; }); }), ErrorCode::kCancelled);
  EXPECT_EQ(ran.load(), 0);
  {
    CancelScope none(nullptr);  // scopes nest: the innermost wins
    EXPECT_NO_THROW(r->load({{0, a.data()}, {1, b.data()}}));
  }
}

TEST(Cancel, ACancelledWritePublishesNothing) {
  test::TempDir dir;
  const float w[4] = {1, 2, 3, 4};
  std::vector<WriteRequest> reqs(1);
  reqs[0].path = TensorPath("w");
  reqs[0].dtype = "<f4";
  reqs[0].shape = {4};
  reqs[0].data = w;
  {
    auto writer = Writer::open(dir.path("out.tensors"), {});
    CancelToken token;
    token.cancel();
    CancelScope scope(&token);
    EXPECT_EQ(code_of([&] { writer->write(reqs); }), ErrorCode::kCancelled);
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path(".")));
}

TEST(Cancel, APassedDeadlineNamesTheOperation) {
  test::TempDir dir;
  const std::string path = sample_file(dir);
  CancelToken token;
  token.set_deadline(CancelToken::Clock::now(), 0.5, "loading 'm.tensors'");
  CancelScope scope(&token);
  auto r = Reader::open(path);
  try {
    load_to_host(*r, {0, 1});
    ADD_FAILURE() << "loaded past the deadline";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDeadline);
    EXPECT_NE(std::string(e.what()).find("loading 'm.tensors' did not finish within its deadline "
                                         "of 0.5 s"),
              std::string::npos)
        << e.what();
  }
}

TEST(Cancel, AnHttpOpenWaitingOnAMuteServerEndsWhenCancelledFromAnotherThread) {
  const int server = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(server, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ASSERT_EQ(::listen(server, 4), 0);
  std::atomic<bool> requested{false};
  std::thread mute([&] {  // reads the request, answers nothing, until the client hangs up
    const int conn = ::accept(server, nullptr, nullptr);
    char buf[4096];
    for (ssize_t n; (n = ::recv(conn, buf, sizeof buf, 0)) > 0;) requested = true;
    ::close(conn);
  });

  CancelToken token;
  std::thread canceller([&] {
    while (!requested) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    token.cancel();
  });
  TransportOptions t;
  t.retry.stall_timeout_s = 600;  // far beyond the test: only the cancel can end the open
  {
    CancelScope scope(&token);
    EXPECT_EQ(code_of([&] {
                auto s = open_source(
                    "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) + "/m.tensors", t);
                s->size();
              }),
              ErrorCode::kCancelled);
  }
  canceller.join();
  mute.join();  // the client closed its connection
  ::close(server);
}

TEST(Cancel, ATokenCancelledDuringKeyDerivationEndsTheWaitWhileTheDerivationFinishesAlone) {
  KdfParams slow;  // several seconds of Argon2id, far longer than the cancellation takes
  slow.opslimit = 40;
  slow.memlimit = 64ull << 20;
  CancelToken token;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    token.cancel();
  });
  const auto start = std::chrono::steady_clock::now();
  ErrorCode code;
  {
    CancelScope scope(&token);
    code = code_of([&] { derive_key("passphrase", slow); });
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  canceller.join();
  EXPECT_EQ(code, ErrorCode::kCancelled);
  EXPECT_LT(waited, std::chrono::seconds(2));  // the derivation alone takes several seconds
  // Without a token it derives inline, and the result matches a derivation that was waited for.
  KdfParams quick;
  quick.opslimit = 1;
  quick.memlimit = 8192;
  const Key inline_key = derive_key("passphrase", quick);
  CancelToken idle;
  CancelScope scope(&idle);
  EXPECT_EQ(derive_key("passphrase", quick), inline_key);
}

}  // namespace
}  // namespace tensorizer
