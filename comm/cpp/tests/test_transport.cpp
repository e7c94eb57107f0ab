// Transport tests on loopback against the real rendezvous server (python -m rendezvous):
// join, direct and relayed channels, tags and FIFO order, isend/irecv, large messages,
// keep-alive pings, bye, peer death, timeouts, bad tokens and bad arguments.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <sstream>
#include <thread>

#include "collectives.hpp"
#include "test_support.hpp"

using namespace skyfn::comm;
using namespace skyfn::comm::testing;

namespace {

RendezvousProcess* g_srv = nullptr;

class Transport : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { g_srv = new RendezvousProcess("transport-secret"); }
  static void TearDownTestSuite() {
    delete g_srv;
    g_srv = nullptr;
  }
  JoinOptions opts(const std::string& group, int size) { return options(*g_srv, group, size); }
};

Bytes pattern(size_t n, uint8_t seed) {
  Bytes v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + seed);
  return v;
}

std::string as_string(const BufferPtr& b) { return std::string(b->data.begin(), b->data.end()); }

// Joins `n` ranks on threads (rank assignment by the server) and runs fn on each.
void with_group(const JoinOptions& base, int n, const std::function<void(Communicator&)>& fn,
                const std::function<void(JoinOptions&, int)>& tweak = nullptr) {
  run_threads(n, [&](int i) {
    JoinOptions o = base;
    if (tweak) tweak(o, i);
    auto c = Communicator::join(o);
    fn(*c);
    c->close();
  });
}

}  // namespace

TEST_F(Transport, JoinAssignsEveryRankAndConnectsDirectly) {
  std::vector<int> ranks(4, -1);
  std::vector<std::vector<PeerStats>> stats(4);
  with_group(opts(unique_group("join"), 4), 4, [&](Communicator& c) {
    EXPECT_EQ(c.size(), 4);
    ranks[static_cast<size_t>(c.rank())] = c.rank();
    stats[static_cast<size_t>(c.rank())] = c.stats();
  });
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ranks[static_cast<size_t>(r)], r);
    const auto& s = stats[static_cast<size_t>(r)];
    ASSERT_EQ(s.size(), 4u);
    for (int p = 0; p < 4; ++p) {
      EXPECT_EQ(s[static_cast<size_t>(p)].rank, p);
      EXPECT_EQ(s[static_cast<size_t>(p)].mode, p == r ? "self" : "direct");
      if (p != r) EXPECT_EQ(s[static_cast<size_t>(p)].address.rfind("127.0.0.1:", 0), 0u);
    }
  }
}

TEST_F(Transport, ExplicitRanksAndTaggedMessagesKeepFifoOrderPerTag) {
  with_group(
      opts(unique_group("fifo"), 2), 2,
      [&](Communicator& c) {
        if (c.rank() == 0) {
          c.send("a1", 2, 1, 1);
          c.send("b1", 2, 1, 2);
          c.send("a2", 2, 1, 1);
          c.send("a3", 2, 1, 1);
          EXPECT_EQ(as_string(c.recv(1, 9)), "done");
        } else {
          EXPECT_EQ(as_string(c.recv(0, 2)), "b1");  // tag 2 overtakes the queued tag 1 messages
          EXPECT_EQ(as_string(c.recv(0, 1)), "a1");
          EXPECT_EQ(as_string(c.recv(0, 1)), "a2");
          EXPECT_EQ(as_string(c.recv(0, 1)), "a3");
          c.send("done", 4, 0, 9);
        }
      },
      [](JoinOptions& o, int i) { o.rank = 1 - i; });
}

TEST_F(Transport, IsendIrecvPostedBeforeAndAfterArrival) {
  with_group(opts(unique_group("nb"), 3), 3, [&](Communicator& c) {
    const int n = 20;
    auto body = [&](int sender, int i) {
      return pattern(static_cast<size_t>(100 + i * 1000), static_cast<uint8_t>(sender * 50 + i));
    };
    std::vector<Bytes> out;
    for (int i = 0; i < n; ++i) out.push_back(body(c.rank(), i));
    std::vector<RequestPtr> sends;
    std::vector<std::vector<RequestPtr>> recvs(static_cast<size_t>(c.size()));
    for (int p = 0; p < c.size(); ++p)
      if (p != c.rank())
        for (int i = 0; i < n / 2; ++i) recvs[static_cast<size_t>(p)].push_back(c.irecv(p, 5));  // before arrival
    EXPECT_THROW(recvs[static_cast<size_t>(c.rank() == 0 ? 1 : 0)][0]->result(), CommError);  // not complete yet
    for (int p = 0; p < c.size(); ++p)
      if (p != c.rank())
        for (int i = 0; i < n; ++i)
          sends.push_back(c.isend(out[static_cast<size_t>(i)].data(), out[static_cast<size_t>(i)].size(), p, 5));
    for (int p = 0; p < c.size(); ++p)
      if (p != c.rank())
        for (int i = n / 2; i < n; ++i) recvs[static_cast<size_t>(p)].push_back(c.irecv(p, 5));
    // Drive some requests with test() only, the rest with wait().
    for (auto& rs : recvs)
      for (size_t k = 0; k < rs.size(); k += 2)
        while (!rs[k]->test()) {
        }
    for (auto& rs : recvs)
      for (auto& r : rs) r->wait();
    for (auto& s : sends) s->wait();
    EXPECT_EQ(sends[0]->result(), nullptr);
    for (int p = 0; p < c.size(); ++p)
      if (p != c.rank())
        for (int i = 0; i < n; ++i)
          EXPECT_EQ(recvs[static_cast<size_t>(p)][static_cast<size_t>(i)]->result()->data, body(p, i))
              << "message " << i << " from " << p;
  });
}

TEST_F(Transport, EmptyAndSelfMessages) {
  with_group(opts(unique_group("empty"), 2), 2, [&](Communicator& c) {
    int other = 1 - c.rank();
    c.send(nullptr, 0, other, 3);
    EXPECT_EQ(c.recv(other, 3)->size(), 0u);
    c.send("me", 2, c.rank(), 4);
    auto r = c.irecv(c.rank(), 4);
    r->wait();
    EXPECT_EQ(as_string(r->result()), "me");
  });
}

TEST_F(Transport, NegativeTagsAreTransportedForCollectives) {
  with_group(opts(unique_group("neg"), 2), 2, [&](Communicator& c) {
    int other = 1 - c.rank();
    c.send("x", 1, other, -7);
    c.send("y", 1, other, 7);
    EXPECT_EQ(as_string(c.recv(other, 7)), "y");
    EXPECT_EQ(as_string(c.recv(other, -7)), "x");
  });
}

TEST_F(Transport, LargeMessagesBothWaysAtOnceDoNotDeadlock) {
  // >= 256 MiB each way at the same time: each blocking send must keep reading the other
  // side's frames while it waits for the socket to drain.
  const size_t n = (size_t(256) << 20) + 12345;
  auto o = opts(unique_group("large"), 2);
  o.timeout_s = 120;
  with_group(o, 2, [&](Communicator& c) {
    int other = 1 - c.rank();
    std::vector<uint8_t> out(n);
    for (size_t i = 0; i < n; i += 4096) out[i] = static_cast<uint8_t>((i >> 12) + c.rank());
    out[n - 1] = static_cast<uint8_t>(0xA0 + c.rank());
    c.send(out.data(), out.size(), other, 1);
    BufferPtr in = c.recv(other, 1);
    ASSERT_EQ(in->size(), n);
    for (size_t i = 0; i < n; i += 4096) ASSERT_EQ(in->data[i], static_cast<uint8_t>((i >> 12) + other)) << i;
    EXPECT_EQ(in->data[n - 1], static_cast<uint8_t>(0xA0 + other));
    auto st = c.stats();
    EXPECT_GE(st[static_cast<size_t>(other)].bytes_sent, n);
    EXPECT_GE(st[static_cast<size_t>(other)].bytes_received, n);
  });
}

TEST_F(Transport, RelayForcedCarriesEveryByte) {
  auto o = opts(unique_group("relay"), 3);
  o.allow_direct = false;
  std::string server = "127.0.0.1:" + std::to_string(g_srv->port());
  with_group(o, 3, [&](Communicator& c) {
    for (const auto& s : c.stats()) {
      if (s.rank == c.rank()) continue;
      EXPECT_EQ(s.mode, "relay");
      EXPECT_EQ(s.address, server);
    }
    std::vector<uint8_t> big = pattern(3 << 20, static_cast<uint8_t>(c.rank()));
    std::vector<RequestPtr> reqs;
    for (int p = 0; p < c.size(); ++p)
      if (p != c.rank()) reqs.push_back(c.isend(big.data(), big.size(), p, 0));
    for (int p = 0; p < c.size(); ++p)
      if (p != c.rank()) EXPECT_EQ(c.recv(p, 0)->data, pattern(3 << 20, static_cast<uint8_t>(p)));
    for (auto& r : reqs) r->wait();
  });
}

TEST_F(Transport, OneSideRefusingDirectMakesThePairRelay) {
  // Rank 1 forbids direct channels, rank 0 and 2 allow them: both sides of every pair
  // with rank 1 must agree on the relay, the 0-2 pair stays direct.
  auto o = opts(unique_group("mixed"), 3);
  o.punch_timeout_s = 0.5;
  with_group(
      o, 3,
      [&](Communicator& c) {
        auto st = c.stats();
        for (int p = 0; p < 3; ++p) {
          if (p == c.rank()) continue;
          bool relay = p == 1 || c.rank() == 1;
          EXPECT_EQ(st[static_cast<size_t>(p)].mode, relay ? "relay" : "direct") << c.rank() << "->" << p;
        }
        for (int p = 0; p < 3; ++p)
          if (p != c.rank()) c.send(&p, sizeof p, p, 0);
        for (int p = 0; p < 3; ++p)
          if (p != c.rank()) {
            int v = -1;
            std::memcpy(&v, c.recv(p, 0)->data.data(), sizeof v);
            EXPECT_EQ(v, c.rank());
          }
      },
      [](JoinOptions& x, int i) {
        x.rank = i;
        x.allow_direct = i != 1;
      });
}

TEST_F(Transport, KeepalivePingsFlowOnIdleChannelsAndAreDiscarded) {
  auto o = opts(unique_group("ka"), 2);
  o.keepalive_s = 0.05;
  with_group(o, 2, [&](Communicator& c) {
    int other = 1 - c.rank();
    uint64_t before = c.stats()[static_cast<size_t>(other)].bytes_sent;
    std::this_thread::sleep_for(std::chrono::milliseconds(600));  // idle: only pings
    uint64_t after = c.stats()[static_cast<size_t>(other)].bytes_sent;
    EXPECT_GE(after - before, 16u) << "no ping written on an idle channel";
    EXPECT_EQ((after - before) % 16, 0u) << "pings are bare 16-byte headers";
    c.send("after-idle", 10, other, 2);
    EXPECT_EQ(as_string(c.recv(other, 2)), "after-idle");  // pings never surface as messages
    if (c.rank() == 0) {
      auto r = c.irecv(1, 0);
      EXPECT_FALSE(r->test());  // rank 1 sends only after "go": pings alone complete nothing
      c.send("go", 2, 1, 3);
      r->wait();
      EXPECT_EQ(as_string(r->result()), "x");
    } else {
      EXPECT_EQ(as_string(c.recv(0, 3)), "go");
      c.send("x", 1, 0, 0);
    }
  });
}

TEST_F(Transport, PeerThatClosesIsReportedAfterItsMessages) {
  with_group(
      opts(unique_group("bye"), 2), 2,
      [&](Communicator& c) {
        if (c.rank() == 1) {
          // Rank 0's unread message is still in this socket when it closes (the kernel
          // then resets the connection): what rank 1 sent before must still arrive.
          EXPECT_EQ(as_string(c.recv(0, 1)), "sent");
          c.send("last", 4, 0, 0);
          c.close();
          c.close();  // idempotent
          EXPECT_THROW(c.send("x", 1, 0, 0), CommError);
          return;
        }
        std::vector<uint8_t> unread(1 << 20, 1);
        c.send(unread.data(), unread.size(), 1, 2);  // never received by rank 1
        c.send("sent", 4, 1, 1);
        EXPECT_EQ(as_string(c.recv(1, 0)), "last");  // delivered although rank 1 is gone
        try {
          c.recv(1, 0);
          FAIL() << "expected PeerLostError";
        } catch (const PeerLostError& e) {
          EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("closed its communicator"), std::string::npos) << e.what();
        }
        EXPECT_THROW(c.send("x", 1, 1, 0), PeerLostError);
      },
      [](JoinOptions& o, int i) { o.rank = i; });
}

TEST_F(Transport, RecvTimeoutNamesWhatWasAwaited) {
  auto o = opts(unique_group("timeout"), 2);
  with_group(
      o, 2,
      [&](Communicator& c) {
        if (c.rank() == 0) {
          try {
            c.recv(1, 7);
            FAIL() << "expected TimeoutError";
          } catch (const TimeoutError& e) {
            EXPECT_NE(std::string(e.what()).find("rank 1 (tag 7)"), std::string::npos) << e.what();
          }
          c.send("go", 2, 1, 1);
          // The timed-out receive was withdrawn: the late message goes to the next one.
          EXPECT_EQ(as_string(c.recv(1, 7)), "late");
        } else {
          EXPECT_EQ(as_string(c.recv(0, 1)), "go");
          c.send("late", 4, 0, 7);
        }
      },
      [](JoinOptions& x, int i) {
        x.rank = i;
        x.timeout_s = i == 0 ? 0.5 : 20;
      });
}

TEST_F(Transport, CollectivesRunOverTheRealTransport) {
  with_group(opts(unique_group("coll"), 4), 4, [&](Communicator& c) {
    c.barrier();
    int64_t mine = c.rank() + 1;
    BufferPtr sum = c.allreduce(&mine, 1, DType::Int64, ReduceOp::Sum);
    int64_t v = 0;
    std::memcpy(&v, sum->data.data(), sizeof v);
    EXPECT_EQ(v, 10);
    std::string root = "from-root";
    BufferPtr b = c.bcast(root.data(), c.rank() == 2 ? root.size() : 0, 2);
    EXPECT_EQ(as_string(b), "from-root");
    std::vector<std::string> parts;
    std::vector<std::pair<const void*, size_t>> views;
    for (int p = 0; p < 4; ++p) parts.push_back(std::string(static_cast<size_t>(c.rank() + p), 'a' + static_cast<char>(c.rank())));
    for (auto& s : parts) views.emplace_back(s.data(), s.size());
    auto got = c.alltoallv(views);
    for (int p = 0; p < 4; ++p)
      EXPECT_EQ(as_string(got[static_cast<size_t>(p)]), std::string(static_cast<size_t>(p + c.rank()), 'a' + static_cast<char>(p)));
  });
}

TEST_F(Transport, BadAndExpiredTokensRaiseAuthError) {
  auto o = opts(unique_group("auth"), 2);
  o.token = make_token("wrong-secret", o.group);
  try {
    Communicator::join(o);
    FAIL() << "expected AuthError";
  } catch (const AuthError& e) {
    EXPECT_NE(std::string(e.what()).find("bad_token"), std::string::npos) << e.what();
  }
  o.token = make_token(g_srv->secret(), o.group, -10);
  try {
    Communicator::join(o);
    FAIL() << "expected AuthError";
  } catch (const AuthError& e) {
    EXPECT_NE(std::string(e.what()).find("expired_token"), std::string::npos) << e.what();
  }
}

TEST_F(Transport, InvalidArgumentsNameTheProblem) {
  auto o = opts(unique_group("args"), 2);
  auto expect_msg = [](JoinOptions x, const std::string& part) {
    try {
      Communicator::join(x);
      FAIL() << "expected CommError mentioning " << part;
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  JoinOptions x = o;
  x.rank = 2;
  expect_msg(x, "invalid rank 2");
  x = o;
  x.size = 0;
  expect_msg(x, "invalid group size");
  x = o;
  x.group = "bad group";
  expect_msg(x, "invalid group id");
  x = o;
  x.token = "";
  expect_msg(x, "invalid group token");
  x = o;
  x.rendezvous_port = 0;
  expect_msg(x, "invalid rendezvous port");

  with_group(o, 2, [&](Communicator& c) {
    EXPECT_THROW(c.send("x", 1, 5, 0), CommError);
    EXPECT_THROW(c.recv(-1, 0), CommError);
    c.barrier();
  });
}

TEST_F(Transport, JoinTimesOutWhenTheGroupNeverFills) {
  auto o = opts(unique_group("alone"), 2);
  o.timeout_s = 0.7;
  try {
    Communicator::join(o);
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("PEERS"), std::string::npos) << e.what();
  }
}

TEST_F(Transport, SingleRankGroup) {
  auto c = Communicator::join(opts(unique_group("one"), 1));
  EXPECT_EQ(c->rank(), 0);
  c->send("s", 1, 0, 0);
  EXPECT_EQ(as_string(c->recv(0, 0)), "s");
  int32_t v = 5;
  BufferPtr r = c->allreduce(&v, 1, DType::Int32, ReduceOp::Sum);
  EXPECT_EQ(r->size(), 4u);
  ASSERT_EQ(c->stats().size(), 1u);
  EXPECT_EQ(c->stats()[0].mode, "self");
  c->close();
}

// A peer process killed with SIGKILL (no bye): the survivor's pending recv and its later
// sends raise PeerLostError naming the rank, well before the timeout.
TEST_F(Transport, KilledPeerRaisesPeerLostError) {
  auto o = opts(unique_group("death"), 2);
  o.timeout_s = 20;
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    try {
      JoinOptions co = o;
      co.rank = 1;
      auto c = Communicator::join(co);
      c->send("hello", 5, 0, 0);
      char b = 'r';
      if (write(ready[1], &b, 1) != 1) _exit(3);
      pause();  // killed by the parent
    } catch (...) {
      _exit(2);
    }
    _exit(0);
  }
  ::close(ready[1]);
  JoinOptions po = o;
  po.rank = 0;
  auto c = Communicator::join(po);
  EXPECT_EQ(as_string(c->recv(1, 0)), "hello");
  char b = 0;
  ASSERT_EQ(read(ready[0], &b, 1), 1);
  ::close(ready[0]);
  auto req = c->irecv(1, 0);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  auto t0 = std::chrono::steady_clock::now();
  try {
    req->wait();
    FAIL() << "expected PeerLostError";
  } catch (const PeerLostError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("without a goodbye"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), o.timeout_s);
  EXPECT_THROW(c->send("x", 1, 1, 0), PeerLostError);
  EXPECT_THROW(c->recv(1, 3), PeerLostError);
  c->close();
}

// A peer that goes silent without closing (SIGSTOP: no FIN, no pings, like a host that
// vanished behind a NAT): after 4 * keepalive_s + 1 s of silence the survivor's pending
// receive raises PeerLostError naming the rank, before its own timeout.
TEST_F(Transport, SilentPeerIsDeclaredLostByMissingKeepalives) {
  auto o = opts(unique_group("silent"), 2);
  o.keepalive_s = 0.25;
  o.timeout_s = 20;
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    try {
      JoinOptions co = o;
      co.rank = 1;
      auto c = Communicator::join(co);
      char b = 'r';
      if (write(ready[1], &b, 1) != 1) _exit(3);
      pause();
    } catch (...) {
      _exit(2);
    }
    _exit(0);
  }
  ::close(ready[1]);
  JoinOptions po = o;
  po.rank = 0;
  auto c = Communicator::join(po);
  char b = 0;
  ASSERT_EQ(read(ready[0], &b, 1), 1);
  ::close(ready[0]);
  kill(child, SIGSTOP);
  try {
    c->recv(1, 0);
    FAIL() << "expected PeerLostError";
  } catch (const PeerLostError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("keep-alive"), std::string::npos) << e.what();
  }
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  c->close();
}

TEST_F(Transport, TwelveRanksEveryPairExchanges) {
  const int n = 12;
  with_group(opts(unique_group("twelve"), n), n, [&](Communicator& c) {
    std::vector<int> mine(static_cast<size_t>(n));
    std::vector<RequestPtr> reqs;
    for (int p = 0; p < n; ++p) {
      mine[static_cast<size_t>(p)] = c.rank() * 100 + p;
      if (p != c.rank()) reqs.push_back(c.isend(&mine[static_cast<size_t>(p)], sizeof(int), p, 4));
    }
    for (int p = 0; p < n; ++p) {
      if (p == c.rank()) continue;
      int v = -1;
      std::memcpy(&v, c.recv(p, 4)->data.data(), sizeof v);
      EXPECT_EQ(v, p * 100 + c.rank());
    }
    for (auto& r : reqs) r->wait();
    for (const auto& s : c.stats())
      if (s.rank != c.rank()) EXPECT_EQ(s.mode, "direct");
  });
}

namespace {

// Minimal blocking socket helpers for the raw-protocol peer below.
int raw_connect(const sockaddr_in& to) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0) return -1;
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

bool raw_read(int fd, void* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::recv(fd, static_cast<char*>(p) + got, n - got, 0);
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

std::string raw_line(int fd) {
  std::string s;
  char ch;
  while (::recv(fd, &ch, 1, 0) == 1 && ch != '\n') s += ch;
  return s;
}

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint32_t get_u32(const uint8_t* p) { return p[0] | (p[1] << 8) | (p[2] << 16) | (uint32_t(p[3]) << 24); }

std::vector<uint8_t> hello(uint32_t from, uint32_t to) {
  std::vector<uint8_t> h(16);
  std::memcpy(h.data(), "SKYC", 4);
  put_u32(&h[4], 1);
  put_u32(&h[8], from);
  put_u32(&h[12], to);
  return h;
}

}  // namespace

// The wire protocol from the outside: a hand-written rank 1 (plain blocking sockets, no
// library code) joins through the server, is refused with a HELLO naming the wrong pair,
// then completes HELLO, receives rank 0's SELECT, and exchanges data frames and the bye.
TEST_F(Transport, RawPeerSpeaksTheWireProtocol) {
  auto o = opts(unique_group("raw"), 2);
  o.punch_timeout_s = 10;  // rank 0 must choose our direct channel, not the relay
  std::string got_in_rank0;
  std::string rank0_error;
  std::thread rank0([&] {
    try {
      JoinOptions r0 = o;
      r0.rank = 0;
      auto c = Communicator::join(r0);
      got_in_rank0 = as_string(c->recv(1, 5));
      c->send("ok", 2, 1, 6);
      c->close();
    } catch (const std::exception& e) {
      rank0_error = e.what();
    }
  });
  sockaddr_in srv{};
  srv.sin_family = AF_INET;
  srv.sin_port = htons(static_cast<uint16_t>(g_srv->port()));
  srv.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int ctl = raw_connect(srv);
  ASSERT_GE(ctl, 0);
  std::string join = "JOIN " + o.group + " " + o.token + " 2 1\n";
  ASSERT_EQ(::send(ctl, join.data(), join.size(), 0), static_cast<ssize_t>(join.size()));
  EXPECT_EQ(raw_line(ctl), "WELCOME 1 2");
  EXPECT_EQ(raw_line(ctl), "PEERS 2");
  sockaddr_in rank0_addr{};
  for (int i = 0; i < 2; ++i) {
    std::istringstream in(raw_line(ctl));
    std::string word, ip;
    int r = -1, port = 0;
    in >> word >> r >> ip >> port;
    if (r == 0) {
      rank0_addr.sin_family = AF_INET;
      rank0_addr.sin_port = htons(static_cast<uint16_t>(port));
      inet_pton(AF_INET, ip.c_str(), &rank0_addr.sin_addr);
    }
  }
  ASSERT_NE(rank0_addr.sin_port, 0);

  // A HELLO addressed to another rank is refused: rank 0 closes the connection.
  int bad = raw_connect(rank0_addr);
  ASSERT_GE(bad, 0);
  auto h = hello(1, 7);
  ASSERT_EQ(::send(bad, h.data(), h.size(), 0), 16);
  uint8_t tmp[16];
  EXPECT_FALSE(raw_read(bad, tmp, 1)) << "a wrong HELLO must be answered by a close";
  ::close(bad);

  int ch = raw_connect(rank0_addr);
  ASSERT_GE(ch, 0);
  h = hello(1, 0);
  ASSERT_EQ(::send(ch, h.data(), h.size(), 0), 16);
  uint8_t their[16];
  ASSERT_TRUE(raw_read(ch, their, 16));
  EXPECT_EQ(std::memcmp(their, "SKYC", 4), 0);
  EXPECT_EQ(get_u32(their + 4), 1u);
  EXPECT_EQ(get_u32(their + 8), 0u);
  EXPECT_EQ(get_u32(their + 12), 1u);
  uint8_t sel[16];
  ASSERT_TRUE(raw_read(ch, sel, 16));
  EXPECT_EQ(get_u32(sel), 3u) << "the lower rank selects the channel";

  // The bootstrap barrier ends the join of every rank.
  ASSERT_EQ(::send(ctl, "BARRIER 0\n", 10, 0), 10);
  EXPECT_EQ(raw_line(ctl), "BARRIER_OK 0");

  uint8_t frame[19] = {0};
  put_u32(frame, 0);
  put_u32(frame + 4, 5);
  frame[8] = 3;  // u64 length 3
  std::memcpy(frame + 16, "raw", 3);
  ASSERT_EQ(::send(ch, frame, sizeof frame, 0), 19);

  // Expect rank 0's data frame (tag 6, "ok"), then its bye; pings would be skipped.
  bool got_data = false, got_bye = false;
  for (int i = 0; i < 10 && !got_bye; ++i) {
    uint8_t hdr[16];
    if (!raw_read(ch, hdr, 16)) break;
    uint32_t kind = get_u32(hdr);
    uint64_t len = 0;
    for (int k = 7; k >= 0; --k) len = (len << 8) | hdr[8 + k];
    if (kind == 0) {
      std::string body(len, '\0');
      ASSERT_TRUE(raw_read(ch, body.data(), len));
      EXPECT_EQ(static_cast<int32_t>(get_u32(hdr + 4)), 6);
      EXPECT_EQ(body, "ok");
      got_data = true;
    } else if (kind == 2) {
      EXPECT_EQ(len, 0u);
      got_bye = true;
    }
  }
  rank0.join();
  EXPECT_EQ(rank0_error, "");
  EXPECT_TRUE(got_data);
  EXPECT_TRUE(got_bye);
  EXPECT_EQ(got_in_rank0, "raw");
  ::close(ch);
  ::close(ctl);
}

TEST_F(Transport, UnreachableRendezvousIsAClearError) {
  auto o = opts(unique_group("nosrv"), 2);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);  // find a port nobody listens on
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t n = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  o.rendezvous_port = ntohs(a.sin_port);
  try {
    Communicator::join(o);
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot connect to the rendezvous server at 127.0.0.1:"), std::string::npos)
        << e.what();
  }
  ::close(fd);
}

// ERROR busy (the server's limit of filling groups is reached) is retried with backoff
// until the deadline: the join completes once the other group has filled.
TEST(TransportBusy, BusyServerIsRetriedUntilItHasRoom) {
  RendezvousProcess srv("busy-secret", 20, {"--max-groups", "1"});
  auto a = options(srv, unique_group("filling"), 2);
  auto b = options(srv, unique_group("waiting"), 1);
  std::unique_ptr<Communicator> a0, a1, b0;
  std::thread first([&] {
    JoinOptions o = a;
    o.rank = 0;
    a0 = Communicator::join(o);  // waits for rank 1: group A is "filling"
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::thread second([&] { b0 = Communicator::join(b); });  // gets ERROR busy, retries
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  JoinOptions o = a;
  o.rank = 1;
  a1 = Communicator::join(o);
  first.join();
  second.join();
  ASSERT_TRUE(b0);
  EXPECT_EQ(b0->rank(), 0);
  a0->close();
  a1->close();
  b0->close();
}

// A rank that leaves during the join (its control connection closes before the bootstrap
// barrier) makes the others' join fail with PeerLostError instead of returning a group
// whose first collective would hang.
TEST_F(Transport, RankLeavingDuringJoinFailsTheOthersJoin) {
  auto o = opts(unique_group("leave"), 2);
  o.punch_timeout_s = 10;
  std::string rank0_error;
  std::thread rank0([&] {
    try {
      JoinOptions r0 = o;
      r0.rank = 0;
      Communicator::join(r0);
    } catch (const PeerLostError& e) {
      rank0_error = e.what();
    } catch (const std::exception& e) {
      rank0_error = std::string("wrong exception type: ") + e.what();
    }
  });
  sockaddr_in srv{};
  srv.sin_family = AF_INET;
  srv.sin_port = htons(static_cast<uint16_t>(g_srv->port()));
  srv.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int ctl = raw_connect(srv);
  ASSERT_GE(ctl, 0);
  std::string join = "JOIN " + o.group + " " + o.token + " 2 1\n";
  ASSERT_EQ(::send(ctl, join.data(), join.size(), 0), static_cast<ssize_t>(join.size()));
  EXPECT_EQ(raw_line(ctl), "WELCOME 1 2");
  EXPECT_EQ(raw_line(ctl), "PEERS 2");
  sockaddr_in rank0_addr{};
  for (int i = 0; i < 2; ++i) {
    std::istringstream in(raw_line(ctl));
    std::string word, ip;
    int r = -1, port = 0;
    in >> word >> r >> ip >> port;
    if (r == 0) {
      rank0_addr.sin_family = AF_INET;
      rank0_addr.sin_port = htons(static_cast<uint16_t>(port));
      inet_pton(AF_INET, ip.c_str(), &rank0_addr.sin_addr);
    }
  }
  int ch = raw_connect(rank0_addr);
  ASSERT_GE(ch, 0);
  auto h = hello(1, 0);
  ASSERT_EQ(::send(ch, h.data(), h.size(), 0), 16);
  uint8_t buf[32];
  ASSERT_TRUE(raw_read(ch, buf, 32));  // rank 0's HELLO and SELECT: its channels are complete
  ::close(ctl);                        // ... and this rank leaves before the barrier
  rank0.join();
  EXPECT_NE(rank0_error.find("peer_lost"), std::string::npos) << rank0_error;
  ::close(ch);
}
