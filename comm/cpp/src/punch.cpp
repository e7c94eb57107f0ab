// Concurrent hole punching and relay fallback for all pairs of a group (see punch.hpp).
//
// Decision rule (race-free for both sides of a pair, documented in docs/comm.md):
// the lower rank L of a pair decides. L takes the first direct connection whose HELLO
// validates before L's punch deadline and sends SELECT on it; if none by its deadline, L
// drops every direct candidate for the pair and opens a RELAY. The higher rank H keeps every
// validated direct candidate and waits for SELECT on one of them; at its own punch deadline
// H also opens a RELAY half, and uses whichever happens first: SELECT on a direct candidate
// (then it drops its relay half, which the server never matches) or RELAYED on the relay
// (which can only happen if L chose the relay). Both sides therefore always agree.
#include "punch.hpp"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <random>
#include <sstream>

#include "wire.hpp"

namespace skyfn::comm {

namespace {

using net::Clock;
using net::TimePoint;

// SKYFN_COMM_TRACE=1 prints every punching event to stderr (diagnosing NAT behaviour).
bool tracing() {
  static const bool on = [] {
    const char* v = std::getenv("SKYFN_COMM_TRACE");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

#define PUNCH_TRACE(...)                                                                     \
  do {                                                                                       \
    if (tracing()) {                                                                         \
      std::fprintf(stderr, "[skyfn-comm %d %.4f] ", me_, net::seconds_since(start_));       \
      std::fprintf(stderr, __VA_ARGS__);                                                     \
      std::fputc('\n', stderr);                                                              \
    }                                                                                        \
  } while (0)

// poll() timeout in ms without the round-up of net::ms_until (sub-ms retry delays).
int ms_until_precise(TimePoint t) {
  auto left = std::chrono::duration_cast<std::chrono::microseconds>(t - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(left / 1000);
}

enum class Phase {
  Connecting,   // non-blocking connect in flight
  Handshake,    // exchanging HELLO (both directions)
  AwaitSelect,  // H side: HELLO done, waiting for L's SELECT
  RelayLine,    // relay: RELAY line sent (or being sent), waiting for RELAYED
  Flush,        // L side: SELECT queued, flushing the out buffer
};

struct Conn {
  net::Fd fd;
  int peer = -1;  // -1 until an accepted connection's HELLO names it
  bool outgoing = false;
  bool relay = false;
  Phase phase = Phase::Connecting;
  TimePoint started;
  std::string out;  // bytes still to send
  size_t out_sent = 0;
  uint8_t in[16];
  size_t in_got = 0;
  bool hello_in_done = false;
  bool closed = false;
};

enum class PairState { Punching, Relaying, Done };

struct Pair {
  int peer = -1;
  bool decider = false;  // this rank is the lower one
  sockaddr_in addr{};
  PairState state = PairState::Punching;
  bool relay_opened = false;
  bool selecting = false;  // decider: SELECT queued on a candidate, being flushed
  Conn* attempt = nullptr;  // outgoing direct connect in flight
  TimePoint next_attempt;
  double backoff_s = 0.02;
  double refused_backoff_s = 0.001;
  Link link;
};

class Puncher {
 public:
  Puncher(ControlConnection& ctl, const JoinOptions& o, TimePoint deadline)
      : ctl_(ctl), o_(o), deadline_(deadline), me_(ctl.rank()), size_(ctl.size()),
        rng_(std::random_device{}() ^ static_cast<unsigned>(ctl.port()) * 2654435761u) {}

  std::vector<Link> run();

 private:
  Conn* add_conn(net::Fd fd, bool outgoing, bool relay, int peer, Phase phase);
  void start_attempt(Pair& p, TimePoint now);
  void open_relay(Pair& p);
  void accept_all();
  void on_event(Conn& c, short revents, TimePoint now);
  void fail_conn(Conn& c, const std::string& why, int err = 0);
  bool flush(Conn& c);
  void read_conn(Conn& c);
  void hello_validated(Conn& c);
  void finish(Pair& p, Conn& c, bool relay);
  void drop_candidates(Pair& p, const Conn* keep);
  void on_timers(TimePoint now);
  // Next connect attempt after a jittered backoff. A refused/reset connect (a router or
  // kernel answered) retries fast: with routers that reset unsolicited SYNs, a punch only
  // succeeds when both sides' SYNs cross within about one round trip, so attempts must be
  // frequent and desynchronized; silent failures back off further.
  void reschedule(Pair& p, TimePoint now, bool refused = false);
  void queue_hello(Conn& c);
  int pending() const;

  ControlConnection& ctl_;
  const JoinOptions& o_;
  TimePoint deadline_;
  TimePoint start_ = Clock::now();
  TimePoint punch_deadline_;
  TimePoint next_wake_;
  double attempt_timeout_s_ = 0.5;
  int me_, size_;
  std::mt19937 rng_;
  std::vector<Pair> pairs_;
  std::list<Conn> conns_;
};

Conn* Puncher::add_conn(net::Fd fd, bool outgoing, bool relay, int peer, Phase phase) {
  conns_.emplace_back();
  Conn& c = conns_.back();
  c.fd = std::move(fd);
  c.outgoing = outgoing;
  c.relay = relay;
  c.peer = peer;
  c.phase = phase;
  c.started = Clock::now();
  return &c;
}

void Puncher::queue_hello(Conn& c) {
  uint8_t h[wire::kHelloSize];
  wire::Hello hello;
  hello.sender = static_cast<uint32_t>(me_);
  hello.receiver = static_cast<uint32_t>(c.peer);
  wire::encode_hello(hello, h);
  c.out.append(reinterpret_cast<const char*>(h), sizeof h);
}

void Puncher::start_attempt(Pair& p, TimePoint now) {
  net::Fd fd;
  try {
    fd = net::reusable_socket(ctl_.port());
  } catch (const CommError&) {
    reschedule(p, now);  // the port is momentarily unavailable: retry
    return;
  }
  int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&p.addr), sizeof p.addr);
  PUNCH_TRACE("connect to rank %d at %s: %s", p.peer, net::to_string(p.addr).c_str(),
              rc == 0 ? "connected" : net::errno_text(errno).c_str());
  if (rc < 0 && errno != EINPROGRESS) {
    // ECONNREFUSED/ECONNRESET: a router or the peer's kernel answered early; EADDRNOTAVAIL:
    // the same address pair was already accepted by our listener (it will show up there).
    reschedule(p, now, errno == ECONNREFUSED || errno == ECONNRESET);
    return;
  }
  Conn* c = add_conn(std::move(fd), true, false, p.peer, Phase::Connecting);
  p.attempt = c;
  if (rc == 0) {
    c->phase = Phase::Handshake;
    queue_hello(*c);
  }
}

void Puncher::reschedule(Pair& p, TimePoint now, bool refused) {
  std::uniform_real_distribution<double> jitter(0.5, 1.5);
  double d;
  if (refused) {
    d = p.refused_backoff_s * jitter(rng_);
    p.refused_backoff_s = std::min(p.refused_backoff_s * 1.1, 0.02);
  } else {
    d = p.backoff_s * jitter(rng_);
    p.backoff_s = std::min(p.backoff_s * 1.6, 0.25);
  }
  p.next_attempt = now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(d));
}

void Puncher::open_relay(Pair& p) {
  PUNCH_TRACE("rank %d: opening a relay half", p.peer);
  p.relay_opened = true;
  net::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) throw CommError("socket() failed: " + net::errno_text(errno));
  const sockaddr_in& srv = ctl_.server();
  int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&srv), sizeof srv);
  if (rc < 0 && errno != EINPROGRESS)
    throw CommError("cannot reach the rendezvous server at " + net::to_string(srv) + " for a relay to rank " +
                    std::to_string(p.peer) + ": " + net::errno_text(errno));
  Conn* c = add_conn(std::move(fd), true, true, p.peer, rc == 0 ? Phase::RelayLine : Phase::Connecting);
  c->out = relay_line(o_, me_, p.peer);
}

void Puncher::accept_all() {
  Conn dummy;
  for (;;) {
    int fd = ::accept4(ctl_.listener().get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN or a transient error: the listener stays polled
    PUNCH_TRACE("accepted from %s", net::to_string(net::peer_address(fd)).c_str());
    add_conn(net::Fd(fd), false, false, -1, Phase::Handshake);
  }
}

void Puncher::fail_conn(Conn& c, const std::string& why, int err) {
  if (c.closed) return;
  PUNCH_TRACE("%s connection (rank %d) dropped: %s", c.outgoing ? "outgoing" : "accepted", c.peer, why.c_str());
  c.closed = true;
  c.fd.reset();
  if (c.relay) {
    // A relay half only fails for server-side reasons; the caller raises from read_conn.
    return;
  }
  if (c.peer >= 0) {
    Pair& p = pairs_[static_cast<size_t>(c.peer)];
    if (c.phase == Phase::Flush) p.selecting = false;
    if (p.attempt == &c) {
      p.attempt = nullptr;
      reschedule(p, Clock::now(), err == ECONNREFUSED || err == ECONNRESET);
    }
  }
}

bool Puncher::flush(Conn& c) {
  while (c.out_sent < c.out.size()) {
    ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (c.relay)
      throw CommError("relay connection to the rendezvous server for rank " + std::to_string(c.peer) +
                      " failed: " + net::errno_text(errno));
    fail_conn(c, net::errno_text(errno));
    return false;
  }
  c.out.clear();
  c.out_sent = 0;
  return true;
}

void Puncher::drop_candidates(Pair& p, const Conn* keep) {
  for (Conn& c : conns_) {
    if (&c == keep || c.closed || c.peer != p.peer) continue;
    c.closed = true;
    c.fd.reset();
  }
  p.attempt = nullptr;
}

void Puncher::finish(Pair& p, Conn& c, bool relay) {
  PUNCH_TRACE("rank %d: %s channel established (%s)", p.peer, relay ? "relay" : "direct",
              c.outgoing ? "connected by us" : "accepted");
  p.state = PairState::Done;
  p.link.relay = relay;
  p.link.address = relay ? net::to_string(ctl_.server()) : net::to_string(net::peer_address(c.fd.get()));
  p.link.fd = std::move(c.fd);
  c.closed = true;
  drop_candidates(p, nullptr);
}

void Puncher::hello_validated(Conn& c) {
  Pair& p = pairs_[static_cast<size_t>(c.peer)];
  if (c.relay) {
    finish(p, c, true);
    return;
  }
  if (p.state == PairState::Done || (p.decider && p.state == PairState::Relaying)) {
    fail_conn(c, "pair already decided");
    return;
  }
  if (p.decider) {
    // First valid direct channel before the deadline wins: SELECT it.
    uint8_t h[wire::kHeaderSize];
    wire::Header sel;
    sel.kind = wire::Kind::Select;
    wire::encode_header(sel, h);
    c.out.append(reinterpret_cast<const char*>(h), sizeof h);
    drop_candidates(p, &c);
    c.phase = Phase::Flush;
    p.selecting = true;
    if (flush(c)) finish(p, c, false);
  } else {
    c.phase = Phase::AwaitSelect;
    c.in_got = 0;
    if (p.attempt == &c) p.attempt = nullptr;
  }
}

void Puncher::read_conn(Conn& c) {
  if (c.phase == Phase::RelayLine) {
    char buf[256];
    ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_PEEK);
    if (n == 0)
      throw CommError("the rendezvous server closed the relay connection for rank " + std::to_string(c.peer) +
                      " before RELAYED");
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      throw CommError("relay connection for rank " + std::to_string(c.peer) + " failed: " + net::errno_text(errno));
    }
    const char* nl = static_cast<const char*>(memchr(buf, '\n', static_cast<size_t>(n)));
    if (!nl) {
      if (n == static_cast<ssize_t>(sizeof buf)) throw CommError("overlong line from the rendezvous server on a relay connection");
      return;  // wait for the rest of the line
    }
    size_t take = static_cast<size_t>(nl - buf) + 1;
    ::recv(c.fd.get(), buf, take, 0);  // consume exactly the line: the HELLO follows it
    std::string line(buf, take - 1);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind("ERROR ", 0) == 0) raise_server_error(line, "the relay to rank " + std::to_string(c.peer));
    if (line != "RELAYED")
      throw CommError("unexpected answer to RELAY from the rendezvous server: '" + line.substr(0, 100) + "'");
    c.phase = Phase::Handshake;
    queue_hello(c);
    flush(c);
    return;
  }
  size_t want = wire::kHelloSize - c.in_got;  // HELLO and SELECT are both 16 bytes
  ssize_t n = ::recv(c.fd.get(), c.in + c.in_got, want, 0);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    if (c.relay)
      throw CommError("the relay connection for rank " + std::to_string(c.peer) + " closed during the HELLO");
    fail_conn(c, n == 0 ? "closed" : net::errno_text(errno));
    return;
  }
  if (n < 0) return;
  c.in_got += static_cast<size_t>(n);
  if (c.in_got < wire::kHelloSize) return;
  if (c.phase == Phase::AwaitSelect) {
    wire::Header h;
    if (!wire::decode_header(c.in, &h).empty() || h.kind != wire::Kind::Select) {
      fail_conn(c, "expected SELECT");
      return;
    }
    Pair& p = pairs_[static_cast<size_t>(c.peer)];
    if (p.state == PairState::Done) {
      fail_conn(c, "pair already decided");
      return;
    }
    finish(p, c, false);
    return;
  }
  // HELLO
  wire::Hello h;
  std::string why = wire::check_hello(c.in, me_, size_, c.peer, &h);
  if (!why.empty()) {
    if (c.relay) throw CommError("relay channel to rank " + std::to_string(c.peer) + " refused: " + why);
    fail_conn(c, why);
    return;
  }
  c.hello_in_done = true;
  c.in_got = 0;
  if (c.peer < 0) {
    // Accepted connection: now we know who it is; answer with our HELLO.
    c.peer = static_cast<int>(h.sender);
    Pair& p = pairs_[static_cast<size_t>(c.peer)];
    if (p.state == PairState::Done || (p.decider && p.state == PairState::Relaying) || !o_.allow_direct) {
      fail_conn(c, "pair already decided");
      return;
    }
    queue_hello(c);
    if (!flush(c) && c.closed) return;
  }
  if (c.out.empty()) hello_validated(c);
}

void Puncher::on_event(Conn& c, short revents, TimePoint now) {
  (void)now;
  if (c.phase == Phase::Connecting) {
    int err = 0;
    socklen_t n = sizeof err;
    getsockopt(c.fd.get(), SOL_SOCKET, SO_ERROR, &err, &n);
    if (err != 0) {
      if (c.relay)
        throw CommError("cannot reach the rendezvous server at " + net::to_string(ctl_.server()) +
                        " for a relay to rank " + std::to_string(c.peer) + ": " + net::errno_text(err));
      fail_conn(c, net::errno_text(err), err);
      return;
    }
    if (!(revents & POLLOUT)) return;
    PUNCH_TRACE("%s to rank %d connected", c.relay ? "relay" : "direct connect", c.peer);
    if (c.relay) {
      c.phase = Phase::RelayLine;
    } else {
      c.phase = Phase::Handshake;
      queue_hello(c);
      Pair& p = pairs_[static_cast<size_t>(c.peer)];
      if (p.attempt == &c) p.attempt = nullptr;  // connected: no longer an attempt to time out
    }
    net::set_nodelay(c.fd.get());
  }
  if (!c.out.empty()) {
    bool done = flush(c);
    if (c.closed) return;
    if (done) {
      if (c.phase == Phase::Flush) {
        finish(pairs_[static_cast<size_t>(c.peer)], c, false);
        return;
      }
      if (c.phase == Phase::Handshake && c.hello_in_done) {
        hello_validated(c);
        if (c.closed) return;
      }
    }
  }
  if (revents & (POLLIN | POLLHUP | POLLERR)) read_conn(c);
}

void Puncher::on_timers(TimePoint now) {
  bool past_punch = now >= punch_deadline_;
  next_wake_ = std::min(deadline_, now + std::chrono::milliseconds(20));
  if (!past_punch) next_wake_ = std::min(next_wake_, punch_deadline_);
  for (Pair& p : pairs_) {
    if (p.peer == me_ || p.state == PairState::Done || p.selecting) continue;
    if (p.state == PairState::Punching && (past_punch || !o_.allow_direct)) {
      if (p.decider) {
        p.state = PairState::Relaying;
        drop_candidates(p, nullptr);
        open_relay(p);
        continue;
      }
      if (!p.relay_opened) open_relay(p);
    }
    if (p.state != PairState::Punching || !o_.allow_direct) continue;
    // Connect attempts: one in flight at a time; none while a handshaken candidate exists.
    if (p.attempt && p.attempt->phase == Phase::Connecting &&
        net::seconds_since(p.attempt->started) > attempt_timeout_s_) {
      Conn* a = p.attempt;
      a->closed = true;
      a->fd.reset();
      p.attempt = nullptr;
      reschedule(p, now);
    }
    if (p.attempt) continue;
    bool candidate = false;
    for (const Conn& c : conns_)
      if (!c.closed && !c.relay && c.peer == p.peer) candidate = true;
    if (!candidate && now >= p.next_attempt) start_attempt(p, now);
    if (!candidate && !p.attempt) next_wake_ = std::min(next_wake_, p.next_attempt);
  }
}

int Puncher::pending() const {
  int n = 0;
  for (const Pair& p : pairs_)
    if (p.peer != me_ && p.state != PairState::Done) ++n;
  return n;
}

std::vector<Link> Puncher::run() {
  TimePoint start = Clock::now();
  // Leave at least half of the channel timeout for the relay fallback.
  double punch_s = std::min(o_.punch_timeout_s, o_.timeout_s / 2);
  punch_deadline_ = net::deadline_after(punch_s);
  attempt_timeout_s_ = std::clamp(punch_s / 4, 0.2, 1.0);
  pairs_.resize(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    Pair& p = pairs_[static_cast<size_t>(r)];
    p.peer = r;
    p.decider = me_ < r;
    p.addr = ctl_.peers()[static_cast<size_t>(r)].addr;
    p.next_attempt = start;
  }
  std::vector<pollfd> pfds;
  std::vector<Conn*> owners;
  while (pending() > 0) {
    TimePoint now = Clock::now();
    if (now >= deadline_) {
      std::ostringstream ranks;
      for (const Pair& p : pairs_)
        if (p.peer != me_ && p.state != PairState::Done) ranks << (ranks.tellp() > 0 ? "," : "") << p.peer;
      throw TimeoutError("timed out after " + std::to_string(net::seconds_since(start)) +
                         " s establishing channels (direct and relay) to rank(s) " + ranks.str());
    }
    on_timers(now);
    conns_.remove_if([](const Conn& c) { return c.closed; });
    if (pending() == 0) break;
    pfds.clear();
    owners.clear();
    if (ctl_.listener()) {
      pfds.push_back({ctl_.listener().get(), POLLIN, 0});
      owners.push_back(nullptr);
    }
    for (Conn& c : conns_) {
      short ev = POLLIN;
      if (c.phase == Phase::Connecting || !c.out.empty()) ev |= POLLOUT;
      if (c.phase == Phase::Connecting) ev = POLLOUT;
      pfds.push_back({c.fd.get(), ev, 0});
      owners.push_back(&c);
    }
    int rc = ::poll(pfds.data(), pfds.size(), ms_until_precise(next_wake_));
    if (rc < 0 && errno != EINTR) throw CommError("poll failed: " + net::errno_text(errno));
    if (rc <= 0) continue;
    now = Clock::now();
    for (size_t i = 0; i < pfds.size(); ++i) {
      if (!pfds[i].revents) continue;
      if (!owners[i]) {
        accept_all();
        continue;
      }
      Conn& c = *owners[i];
      if (!c.closed) on_event(c, pfds[i].revents, now);
    }
  }
  std::vector<Link> links(static_cast<size_t>(size_));
  for (Pair& p : pairs_)
    if (p.peer != me_) links[static_cast<size_t>(p.peer)] = std::move(p.link);
  return links;
}

}  // namespace

std::vector<Link> establish_channels(ControlConnection& ctl, const JoinOptions& o, net::TimePoint deadline) {
  Puncher p(ctl, o, deadline);
  return p.run();
}

}  // namespace skyfn::comm
