// The communicators (fastdecode/parallel/comm.h), with the ranks as threads of this process as the engine
// runs them: Gloo's collectives and point to point at sizes 2 and 4, deadlines, abort(), the local mailbox.
// Without Gloo in the build the Gloo tests skip with the reason, unless FD_REQUIRE_BINARIES is set (then
// they fail, so CI cannot pass without Gloo).
#include "fastdecode/parallel/comm.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "fastdecode/core/splitmix64.h"
#include "test_helpers.h"

using namespace fd;
using ::testing::HasSubstr;

namespace {

constexpr auto kHangGuard = std::chrono::seconds(30);  // a hang, not a speed limit: deadlines here are <= 5 s

// Runs body(rank's handle) in one thread per rank (ranks in `skip` run nothing: a missing peer) and returns
// each rank's error message ("" when it returned). If the ranks are not all back within kHangGuard, the
// test fails and the group is aborted so that the threads can be joined.
std::vector<std::string> run_ranks(CommGroup& g, const std::function<void(Communicator&)>& body,
                                   const std::vector<int>& skip = {}) {
  std::vector<std::string> err(g.size());
  std::mutex m;
  std::condition_variable cv;
  size_t done = 0;
  std::vector<std::thread> threads;
  for (size_t r = 0; r < g.size(); ++r) {
    const bool run = std::find(skip.begin(), skip.end(), static_cast<int>(r)) == skip.end();
    threads.emplace_back([&, r, run] {
      try {
        if (run) body(*g[r]);
      } catch (const std::exception& e) {
        err[r] = e.what();
        if (err[r].empty()) err[r] = "(empty message)";
      }
      std::lock_guard<std::mutex> lock(m);
      ++done;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(m);
    if (!cv.wait_for(lock, kHangGuard, [&] { return done == g.size(); })) {
      ADD_FAILURE() << "the ranks did not return within " << kHangGuard.count() << " s: aborting the group";
      lock.unlock();
      g[0]->abort();
    }
  }
  for (auto& t : threads) t.join();
  return err;
}

void expect_no_errors(const std::vector<std::string>& err) {
  for (size_t r = 0; r < err.size(); ++r) EXPECT_EQ(err[r], "") << "rank " << r;
}

// A value in [-1, 1) that depends on (rank, index) only.
float draw(int rank, size_t i) {
  const uint64_t u = splitmix64((static_cast<uint64_t>(rank) << 40) ^ i);
  return static_cast<float>(static_cast<double>(u >> 11) * 0x1p-53 * 2.0 - 1.0);
}

// Message i from src to dst: its length (0 now and then) and its bytes.
size_t msg_len(int src, int dst, int i) { return i % 25 == 7 ? 0 : 1 + (splitmix64(src * 131 + dst * 17 + i) % 600); }
std::vector<uint8_t> msg_bytes(int src, int dst, int i) {
  std::vector<uint8_t> v(msg_len(src, dst, i));
  for (size_t j = 0; j < v.size(); ++j) v[j] = static_cast<uint8_t>(splitmix64((uint64_t(src) << 48) ^ (uint64_t(dst) << 32) ^ (uint64_t(i) << 16) ^ j));
  return v;
}

// 100 rounds; in each every rank sends message i to every peer, then receives message i from every peer.
void interleaved_send_recv(Communicator& c) {
  const int n = c.size(), me = c.rank();
  std::vector<std::vector<uint8_t>> sent;  // unchanged until flush_sends (the Gloo contract)
  sent.reserve(100 * n);
  for (int i = 0; i < 100; ++i) {
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      sent.push_back(msg_bytes(me, p, i));
      c.send(sent.back().data(), sent.back().size(), p);
    }
    for (int q = 0; q < n; ++q) {
      if (q == me) continue;
      const auto want = msg_bytes(q, me, i);
      std::vector<uint8_t> got(want.size(), 0xAB);
      c.recv(got.data(), got.size(), q);
      if (got != want) FD_THROW("rank " << me << ": message " << i << " from rank " << q << " has the wrong bytes");
    }
  }
  c.flush_sends();
}

class GlooSizes : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(Comm, GlooSizes, ::testing::Values(2, 4), [](const auto& i) { return "size" + std::to_string(i.param); });

}  // namespace

TEST_P(GlooSizes, AllReduceSumGivesTheSameBitsOnEveryRankAndTheRightSum) {
  FD_REQUIRE_GLOO();
  const int n = GetParam();
  auto g = make_gloo_group(n, 5000);
  ASSERT_EQ(g.size(), static_cast<size_t>(n));
  EXPECT_THAT(g[0]->describe(), HasSubstr("gloo " + gloo_version() + " tcp 127.0.0.1"));
  // 300001 floats: more than one of Gloo's 1 MiB segments per rank, and not a multiple of the ring.
  const size_t count = 300001;
  std::vector<std::vector<float>> rnd(n), exact(n);
  std::vector<std::vector<int32_t>> ints(n);
  for (int r = 0; r < n; ++r) {
    rnd[r].resize(count);
    exact[r].resize(count);
    ints[r].resize(1001);
    for (size_t i = 0; i < count; ++i) {
      rnd[r][i] = draw(r, i);
      exact[r][i] = 0.25f * static_cast<float>(static_cast<int>(i % 97) - 40 + 3 * r);  // sums exactly in fp32
    }
    for (size_t i = 0; i < ints[r].size(); ++i) ints[r][i] = static_cast<int32_t>(i) * (r + 1) - 500;
  }
  const auto err = run_ranks(g, [&](Communicator& c) {
    c.all_reduce_sum(rnd[c.rank()].data(), count, CommType::F32);
    c.all_reduce_sum(exact[c.rank()].data(), count, CommType::F32);
    c.all_reduce_sum(ints[c.rank()].data(), ints[c.rank()].size(), CommType::I32);
  });
  expect_no_errors(err);
  for (int r = 1; r < n; ++r) {
    EXPECT_EQ(std::memcmp(rnd[r].data(), rnd[0].data(), count * sizeof(float)), 0) << "rank " << r << " differs from rank 0";
    EXPECT_EQ(std::memcmp(exact[r].data(), exact[0].data(), count * sizeof(float)), 0) << "rank " << r;
    EXPECT_EQ(ints[r], ints[0]) << "rank " << r;
  }
  size_t bad_exact = 0, bad_rnd = 0, bad_int = 0;
  for (size_t i = 0; i < count; ++i) {
    double sum = 0;
    float want = 0;
    for (int r = 0; r < n; ++r) {
      sum += draw(r, i);
      want += 0.25f * static_cast<float>(static_cast<int>(i % 97) - 40 + 3 * r);
    }
    bad_exact += exact[0][i] != want;
    bad_rnd += std::abs(rnd[0][i] - sum) > 1e-6 * n;
  }
  for (size_t i = 0; i < ints[0].size(); ++i) {
    int32_t want = 0;
    for (int r = 0; r < n; ++r) want += static_cast<int32_t>(i) * (r + 1) - 500;
    bad_int += ints[0][i] != want;
  }
  EXPECT_EQ(bad_exact, 0u) << "exactly representable sums that came out wrong";
  EXPECT_EQ(bad_rnd, 0u) << "random sums further than 1e-6 per rank from the double sum";
  EXPECT_EQ(bad_int, 0u);
  // Fewer elements than ranks (some ring segments are empty) still sum.
  for (const size_t small : {size_t{1}, size_t{3}}) {
    std::vector<std::vector<float>> v(n, std::vector<float>(small));
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < small; ++i) v[r][i] = static_cast<float>(r + 1) * static_cast<float>(i + 1);
    expect_no_errors(run_ranks(g, [&](Communicator& c) { c.all_reduce_sum(v[c.rank()].data(), small, CommType::F32); }));
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < small; ++i) EXPECT_EQ(v[r][i], static_cast<float>(n * (n + 1) / 2) * static_cast<float>(i + 1)) << "count " << small << ", rank " << r;
  }
}

TEST_P(GlooSizes, AllGatherIsRankMajor) {
  FD_REQUIRE_GLOO();
  const int n = GetParam();
  auto g = make_gloo_group(n, 5000);
  const size_t count = 1001;  // odd: Gloo splits each rank's part in two unequal chunks
  std::vector<std::vector<int32_t>> out(n, std::vector<int32_t>(count * n, -1));
  std::vector<std::vector<uint8_t>> out8(n, std::vector<uint8_t>(3 * n, 0));
  std::vector<std::vector<float>> inplace(n, std::vector<float>(count * n, 0.f));
  const auto err = run_ranks(g, [&](Communicator& c) {
    const int r = c.rank();
    std::vector<int32_t> in(count);
    for (size_t i = 0; i < count; ++i) in[i] = r * 100000 + static_cast<int32_t>(i);
    c.all_gather(in.data(), out[r].data(), count, CommType::I32);
    const uint8_t in8[3] = {uint8_t(r), uint8_t(10 + r), uint8_t(20 + r)};
    c.all_gather(in8, out8[r].data(), 3, CommType::U8);
    float* mine = inplace[r].data() + r * count;  // in place: the input already sits at this rank's part
    for (size_t i = 0; i < count; ++i) mine[i] = draw(r, i);
    c.all_gather(mine, inplace[r].data(), count, CommType::F32);
  });
  expect_no_errors(err);
  for (int r = 0; r < n; ++r) {
    for (int s = 0; s < n; ++s) {
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(out[r][s * count + i], s * 100000 + static_cast<int32_t>(i)) << "rank " << r << ", part " << s << ", element " << i;
        ASSERT_EQ(inplace[r][s * count + i], draw(s, i)) << "rank " << r << ", part " << s << ", element " << i;
      }
      for (int k = 0; k < 3; ++k) ASSERT_EQ(out8[r][s * 3 + k], 10 * k + s) << "rank " << r << ", u8 part " << s;
    }
  }
}

TEST_P(GlooSizes, InterleavedSendRecvArriveInOrderWithTheirBytes) {
  FD_REQUIRE_GLOO();
  auto g = make_gloo_group(GetParam(), 5000);
  expect_no_errors(run_ranks(g, interleaved_send_recv));
}

TEST_P(GlooSizes, AMissingPeerFailsTheCollectiveWithinTheTimeoutNamingTheOp) {
  FD_REQUIRE_GLOO();
  const int n = GetParam();
  const int timeout_ms = 500;
  auto g = make_gloo_group(n, timeout_ms);
  const auto t0 = std::chrono::steady_clock::now();
  // The last rank never calls: every other rank must fail, none may hang.
  const auto err = run_ranks(g, [&](Communicator& c) {
    std::vector<float> x(4096, 1.f);
    c.all_reduce_sum(x.data(), x.size(), CommType::F32);
  }, {n - 1});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int r = 0; r < n - 1; ++r) {
    EXPECT_THAT(err[r], HasSubstr("gloo communicator rank " + std::to_string(r) + " of " + std::to_string(n))) << r;
    EXPECT_THAT(err[r], HasSubstr("all_reduce_sum of 4096 f32")) << r;
  }
  // The missing rank's ring neighbours time out; the others may see a closed connection first.
  int timed_out = 0;
  for (int r = 0; r < n - 1; ++r) timed_out += err[r].find("timed out after 500 ms") != std::string::npos;
  EXPECT_GE(timed_out, 1) << err[0];
  EXPECT_THAT(err[0], HasSubstr("(ring: from rank " + std::to_string(n - 1) + ", to rank 1)"));
  std::printf("missing peer: the ranks failed after %.2f s (timeout %d ms)\n", s, timeout_ms);
  // Later calls on a failed handle refuse at once, naming the first error.
  EXPECT_THAT(test::error_message([&] { g[0]->all_gather(nullptr, nullptr, 0, CommType::U8); }), HasSubstr("broken by an earlier error"));
}

TEST(Comm, GlooRecvFromAMissingPeerFailsNamingPeerAndOp) {
  FD_REQUIRE_GLOO();
  auto g = make_gloo_group(2, 500);
  const auto err = run_ranks(g, [](Communicator& c) {
    std::vector<uint8_t> b(64);
    c.recv(b.data(), b.size(), 1);
  }, {1});
  EXPECT_THAT(err[0], HasSubstr("gloo communicator rank 0 of 2: recv of 64 bytes from rank 1 failed: timed out after 500 ms"));
  // A send returns at once; waiting for its delivery to a receiver that never comes fails the same way.
  auto h = make_gloo_group(2, 500);
  const auto err2 = run_ranks(h, [](Communicator& c) {
    std::vector<uint8_t> b(64);
    c.send(b.data(), b.size(), 1);
    c.flush_sends();
  }, {1});
  EXPECT_THAT(err2[0], HasSubstr("rank 0 of 2: flush_sends (a send of 64 bytes to rank 1) failed: timed out after 500 ms"));
}

TEST(Comm, GlooAbortWakesABlockedRecvAndABlockedCollective) {
  FD_REQUIRE_GLOO();
  for (const bool collective : {false, true}) {
    auto g = make_gloo_group(3, 60000);  // a deadline far past the hang guard: only abort() can wake them
    std::atomic<int> entered{0};
    std::thread aborter([&] {
      while (entered.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let them block (not needed for correctness)
      g[2]->abort();  // rank 2 never called anything
    });
    const auto err = run_ranks(g, [&](Communicator& c) {
      std::vector<float> b(256);
      ++entered;
      if (collective) c.all_reduce_sum(b.data(), b.size(), CommType::F32);
      else c.recv(b.data(), b.size() * 4, 2);
    }, {2});
    aborter.join();
    for (int r = 0; r < 2; ++r) {
      EXPECT_THAT(err[r], HasSubstr(collective ? "all_reduce_sum" : "recv of 1024 bytes from rank 2")) << r;
      EXPECT_THAT(err[r], HasSubstr("aborted (abort() was called on rank 2)")) << r;
    }
    // Every later call on any rank refuses.
    EXPECT_THAT(test::error_message([&] { g[2]->flush_sends(); }), HasSubstr("aborted"));
  }
}

TEST(Comm, GlooRefusesMismatchedSizesStreamsAndBadPeers) {
  FD_REQUIRE_GLOO();
  auto g = make_gloo_group(2, 2000);
  const auto err = run_ranks(g, [](Communicator& c) {
    std::vector<uint8_t> b(16);
    if (c.rank() == 0) c.send(b.data(), 16, 1);
    else c.recv(b.data(), 8, 0);
  });
  // Whichever side comes second refuses (before Gloo sees the mismatch).
  EXPECT_THAT(err[0] + err[1], HasSubstr("bytes on the other side (sender and receiver must name the same size)"));
  auto h = make_gloo_group(2, 2000);
  int dummy = 0;
  EXPECT_THAT(test::error_message([&] { h[0]->send(&dummy, 4, 0); }), HasSubstr("names peer 0"));
  EXPECT_THAT(test::error_message([&] { h[0]->recv(&dummy, 4, 2); }), HasSubstr("names peer 2"));
  EXPECT_THAT(test::error_message([&] { h[0]->all_reduce_sum(&dummy, 1, CommType::F32, &dummy); }),
              HasSubstr("host buffers only"));
  EXPECT_THAT(test::error_message([&] { h[0]->all_reduce_sum(&dummy, 1, CommType::U8); }), HasSubstr("only f32 and i32"));
  EXPECT_THAT(test::error_message<ConfigError>([] { make_gloo_group(0, 100); }), HasSubstr("group size 0"));
  EXPECT_THAT(test::error_message<ConfigError>([] { make_gloo_group(2, 0); }), HasSubstr("timeout_ms 0"));
}

TEST(Comm, GlooGroupOfOneAndTheBusyTimer) {
  FD_REQUIRE_GLOO();
  auto one = make_gloo_group(1, 1000);
  float x[3] = {1.f, 2.f, 3.f}, out[3] = {};
  one[0]->all_reduce_sum(x, 3, CommType::F32);
  one[0]->all_gather(x, out, 3, CommType::F32);
  EXPECT_EQ(x[2], 3.f);
  EXPECT_EQ(out[2], 3.f);
  auto g = make_gloo_group(2, 5000);
  expect_no_errors(run_ranks(g, interleaved_send_recv));
  for (auto& c : g) {
    EXPECT_GT(c->busy_ms_and_reset(), 0.0) << "rank " << c->rank();
    EXPECT_EQ(c->busy_ms_and_reset(), 0.0) << "rank " << c->rank() << ": the reset";
  }
}

TEST(Comm, AGlooGroupLeavesSigpipeIgnored) {
  FD_REQUIRE_GLOO();
  // A peer's closed socket must give Gloo an EPIPE error, not end the process with SIGPIPE.
  auto g = make_gloo_group(2, 1000);
  struct sigaction now {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_IGN);
}

TEST(Comm, TheGlooFactoryRefusesExactlyWhenGlooIsNotBuilt) {
  if (have_gloo()) {
    EXPECT_EQ(gloo_version(), "0.5.0");  // the version this was written against (Debian 12's libgloo-dev)
    EXPECT_NO_THROW(make_gloo_group(2, 1000));
  } else {
    EXPECT_EQ(gloo_version(), "");
    EXPECT_THAT(test::error_message<ConfigError>([] { make_gloo_group(2, 1000); }), HasSubstr("no Gloo communicator"));
  }
}

TEST(Comm, LocalSendRecvInOrderAtSizesTwoAndFour) {
  for (const int n : {2, 4}) {
    auto g = make_local_group(n, 5000, 2);  // capacity 2: sends into a full mailbox wait for the receiver
    EXPECT_EQ(g[0]->describe(), "local mailbox 2");
    expect_no_errors(run_ranks(g, interleaved_send_recv));
  }
}

TEST(Comm, LocalRefusesCollectives) {
  auto g = make_local_group(2, 1000);
  float x = 0;
  const char* why = "the local communicator has no collectives (tensor parallel needs gloo or nccl)";
  EXPECT_THAT(test::error_message([&] { g[0]->all_reduce_sum(&x, 1, CommType::F32); }), HasSubstr(why));
  EXPECT_THAT(test::error_message([&] { g[1]->all_gather(&x, &x, 1, CommType::F32); }), HasSubstr(why));
}

TEST(Comm, LocalDeadlinesAbortAndRefusals) {
  {  // A receiver that never comes: the second send into a mailbox of 1 times out, naming the peer.
    auto g = make_local_group(2, 300, 1);
    const auto err = run_ranks(g, [](Communicator& c) {
      int v = 7;
      c.send(&v, 4, 1);
      c.send(&v, 4, 1);
    }, {1});
    EXPECT_THAT(err[0], HasSubstr("local communicator rank 0 of 2: send of 4 bytes to rank 1 failed: timed out after 300 ms"));
    EXPECT_THAT(err[0], HasSubstr("is full"));
  }
  {  // A sender that never comes.
    auto g = make_local_group(2, 300);
    const auto err = run_ranks(g, [](Communicator& c) {
      int v = 0;
      c.recv(&v, 4, 0);
    }, {0});
    EXPECT_THAT(err[1], HasSubstr("recv of 4 bytes from rank 0 failed: timed out after 300 ms"));
  }
  {  // abort() wakes a blocked recv long before its deadline.
    auto g = make_local_group(2, 60000);
    std::atomic<bool> entered{false};
    std::thread aborter([&] {
      while (!entered.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      g[1]->abort();
    });
    const auto err = run_ranks(g, [&](Communicator& c) {
      int v = 0;
      entered = true;
      c.recv(&v, 4, 1);
    }, {1});
    aborter.join();
    EXPECT_THAT(err[0], HasSubstr("recv of 4 bytes from rank 1 failed: aborted (abort() was called on rank 1)"));
    int v = 0;
    EXPECT_THAT(test::error_message([&] { g[1]->send(&v, 4, 0); }), HasSubstr("aborted"));
  }
  {  // Sizes must match; streams, peers and arguments are checked.
    auto g = make_local_group(2, 1000);
    int v[2] = {1, 2};
    g[0]->send(v, 8, 1);
    EXPECT_THAT(test::error_message([&] { g[1]->recv(v, 4, 0); }), HasSubstr("rank 0 sent 8 bytes"));
    auto h = make_local_group(2, 1000);
    EXPECT_THAT(test::error_message([&] { h[0]->send(v, 4, 1, v); }), HasSubstr("host buffers only"));
    EXPECT_THAT(test::error_message([&] { h[0]->send(v, 4, -1); }), HasSubstr("names peer -1"));
    EXPECT_THAT(test::error_message<ConfigError>([] { make_local_group(65, 100); }), HasSubstr("group size 65"));
    EXPECT_THAT(test::error_message<ConfigError>([] { make_local_group(2, 100, 0); }), HasSubstr("capacity 0"));
  }
}

// Without NCCL (every CPU build) the factory refuses plainly; with it, a GPU named twice is refused before
// NCCL is asked (tests/gpu/test_parallel_gpu.cpp runs the communicator itself).
TEST(Comm, NcclRefusesWhatItCannotServe) {
  if (!have_nccl()) {
    EXPECT_EQ(nccl_version(), "");
    EXPECT_THAT(test::error_message<ConfigError>([] { make_nccl_group({0, 1}); }),
                HasSubstr("this build has no NCCL communicator"));
  } else {
    EXPECT_NE(nccl_version(), "");
    EXPECT_THROW(make_nccl_group({0, 0}), ConfigError);
  }
}
