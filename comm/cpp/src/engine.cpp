// Progress engine: channels, matching, send queues, poll loop, keep-alive (see engine.hpp).
#include "engine.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace skyfn::comm {

namespace {

// Per-channel staging buffer for headers and small payloads (one syscall reads many).
constexpr size_t kStageSize = 64 * 1024;
// Payloads with at least this much left are read straight into the message buffer.
constexpr size_t kDirectRead = 32 * 1024;
constexpr size_t kMaxIo = size_t(1) << 30;  // per syscall; Linux caps one call near 2 GiB
// Channel sockets are blocking (every call but the blocking-receive shortcut passes
// MSG_DONTWAIT); a blocking recv() gives up after this slice so deadlines are checked.
constexpr int kRecvSliceMs = 100;
// Messages up to this size are copied behind their header and written with one send().
constexpr size_t kSmallSend = 1024;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(net::Clock::now().time_since_epoch()).count();
}

uint64_t key(int source, int tag) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(source)) << 32) | static_cast<uint32_t>(tag);
}

std::string describe(int peer, int tag) {
  return "rank " + std::to_string(peer) + " (tag " + std::to_string(tag) + ")";
}

class SendRequest : public Request {
 public:
  SendRequest(std::shared_ptr<Engine> e, SendOpPtr op, int dest, int tag)
      : e_(std::move(e)), op_(std::move(op)), dest_(dest), tag_(tag) {}
  bool test() override {
    if (!op_) return true;
    if (e_->send_done(*op_, dest_, tag_)) return true;
    e_->progress_nonblocking();
    return e_->send_done(*op_, dest_, tag_);
  }
  void wait() override {
    if (!op_) return;
    e_->wait_until([this] { return e_->send_done(*op_, dest_, tag_); }, {false, dest_, tag_});
  }
  BufferPtr result() override { return nullptr; }

 private:
  std::shared_ptr<Engine> e_;
  SendOpPtr op_;  // null: completed at post time
  int dest_, tag_;
};

class RecvRequest : public Request {
 public:
  RecvRequest(std::shared_ptr<Engine> e, RecvStatePtr st) : e_(std::move(e)), st_(std::move(st)) {}
  bool test() override {
    if (e_->recv_done(*st_)) return true;
    e_->progress_nonblocking();
    return e_->recv_done(*st_);
  }
  void wait() override {
    e_->wait_until([this] { return e_->recv_done(*st_); }, {true, st_->source, st_->tag});
  }
  BufferPtr result() override {
    if (!st_->msg || !st_->msg->complete)
      throw CommError("irecv from " + describe(st_->source, st_->tag) + " has not completed: call wait() or test() first");
    return st_->msg->buf;
  }

 private:
  std::shared_ptr<Engine> e_;
  RecvStatePtr st_;
};

}  // namespace

Engine::Engine(int rank, int size, std::vector<Link> links, const JoinOptions& opts)
    : rank_(rank), size_(size), timeout_s_(opts.timeout_s), keepalive_s_(opts.keepalive_s) {
  ch_.resize(static_cast<size_t>(size));
  int64_t t = now_ns();
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    auto c = std::make_unique<Channel>();
    Link& l = links[static_cast<size_t>(r)];
    c->peer = r;
    c->relay = l.relay;
    c->address = l.address;
    c->fd = std::move(l.fd);
    net::set_nodelay(c->fd.get());
    net::set_blocking_with_timeout(c->fd.get(), kRecvSliceMs);
    c->stage.resize(kStageSize);
    c->last_send_ns = t;
    c->last_recv_ns = t;
    ch_[static_cast<size_t>(r)] = std::move(c);
  }
  if (size > 1) keepalive_ = std::thread([this] { keepalive_loop(); });
}

Engine::~Engine() { close(); }

void Engine::check_open() const {
  if (closed_) throw CommError("the communicator is closed");
}

void Engine::check_peer(int peer, const char* op) const {
  if (peer < 0 || peer >= size_)
    throw CommError(std::string(op) + ": rank " + std::to_string(peer) + " is out of range for a group of size " +
                    std::to_string(size_) + " (use 0.." + std::to_string(size_ - 1) + ")");
}

Channel& Engine::channel(int peer, const char* op) {
  check_peer(peer, op);
  return *ch_[static_cast<size_t>(peer)];
}

void Engine::raise_lost(const Channel& c) const {
  std::string why;
  {
    std::lock_guard<std::mutex> lk(const_cast<Channel&>(c).send_mu);
    why = c.reason;
  }
  throw PeerLostError("rank " + std::to_string(c.peer) + " is unreachable: " + why);
}

// ---- sending -------------------------------------------------------------------------

SendOpPtr Engine::start_send(Channel& c, const void* data, size_t len, int tag) {
  if (c.st() != ChannelState::Open) raise_lost(c);
  wire::Header h;
  h.kind = wire::Kind::Data;
  h.tag = tag;
  h.length = len;
  std::unique_lock<std::mutex> lk(c.send_mu);
  if (c.st() != ChannelState::Open) {
    lk.unlock();
    raise_lost(c);
  }
  size_t sent = 0;
  uint8_t hdr[wire::kHeaderSize];
  wire::encode_header(h, hdr);
  if (c.sendq.empty() && len <= kSmallSend) {
    // Small message: one contiguous send() (cheaper than building a msghdr).
    uint8_t frame[wire::kHeaderSize + kSmallSend];
    std::memcpy(frame, hdr, wire::kHeaderSize);
    if (len) std::memcpy(frame + wire::kHeaderSize, data, len);
    ssize_t w;
    do {
      w = ::send(c.fd.get(), frame, wire::kHeaderSize + len, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (w < 0 && errno == EINTR);
    if (w > 0) {
      sent = static_cast<size_t>(w);
      c.bytes_sent.fetch_add(static_cast<uint64_t>(w), std::memory_order_relaxed);
      c.last_send_ns.store(now_ns(), std::memory_order_relaxed);
      if (sent == wire::kHeaderSize + len) return nullptr;
    } else if (!(w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) {
      mark_down_locked(c, ChannelState::Lost, "sending failed (" + net::errno_text(errno) + ")");
      lk.unlock();
      raise_lost(c);
    }
    // Partial or no write: the rest goes through the send queue below.
  } else if (c.sendq.empty()) {
    // Fast path: write header and payload from the caller's buffer right now.
    for (;;) {
      iovec iov[2];
      int n = 0;
      if (sent < wire::kHeaderSize) iov[n++] = {hdr + sent, wire::kHeaderSize - sent};
      size_t poff = sent > wire::kHeaderSize ? sent - wire::kHeaderSize : 0;
      if (len > poff) iov[n++] = {const_cast<uint8_t*>(static_cast<const uint8_t*>(data)) + poff, std::min(len - poff, kMaxIo)};
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = static_cast<size_t>(n);
      ssize_t w = ::sendmsg(c.fd.get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        sent += static_cast<size_t>(w);
        c.bytes_sent.fetch_add(static_cast<uint64_t>(w), std::memory_order_relaxed);
        c.last_send_ns.store(now_ns(), std::memory_order_relaxed);
        if (sent == wire::kHeaderSize + len) return nullptr;
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      mark_down_locked(c, ChannelState::Lost, "sending failed (" + net::errno_text(errno) + ")");
      lk.unlock();
      raise_lost(c);
    }
  }
  auto op = std::make_shared<SendOp>();
  std::memcpy(op->header, hdr, sizeof hdr);
  op->payload = static_cast<const uint8_t*>(data);
  op->len = len;
  op->sent = sent;
  c.sendq.push_back(op);
  return op;
}

void Engine::write_queue(Channel& c) {
  while (!c.sendq.empty()) {
    SendOp& op = *c.sendq.front();
    iovec iov[2];
    int n = 0;
    if (op.sent < wire::kHeaderSize) iov[n++] = {op.header + op.sent, wire::kHeaderSize - op.sent};
    size_t poff = op.sent > wire::kHeaderSize ? op.sent - wire::kHeaderSize : 0;
    if (op.len > poff) iov[n++] = {const_cast<uint8_t*>(op.payload) + poff, std::min(op.len - poff, kMaxIo)};
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(n);
    ssize_t w = ::sendmsg(c.fd.get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      op.sent += static_cast<size_t>(w);
      c.bytes_sent.fetch_add(static_cast<uint64_t>(w), std::memory_order_relaxed);
      c.last_send_ns.store(now_ns(), std::memory_order_relaxed);
      if (op.sent == wire::kHeaderSize + op.len) {
        op.done = true;
        c.sendq.pop_front();
      }
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    mark_down_locked(c, ChannelState::Lost, "sending failed (" + net::errno_text(errno) + ")");
    return;
  }
}

bool Engine::send_done(const SendOp& op, int dest, int tag) {
  if (op.done) return true;
  if (op.failed) {
    const Channel& c = *ch_[static_cast<size_t>(dest)];
    (void)tag;
    if (c.st() != ChannelState::Open) raise_lost(c);
    throw CommError("send to " + describe(dest, tag) + " failed: " + op.error);
  }
  return false;
}

void Engine::deliver_self(const void* data, size_t len, int tag) {
  auto in = std::make_shared<Incoming>();
  in->buf = std::make_shared<Buffer>();
  if (len) in->buf->data.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + len);
  in->got = len;
  in->complete = true;
  match(rank_, tag, in);
}

void Engine::send(const void* data, size_t len, int dest, int tag) {
  check_open();
  check_peer(dest, "send");
  if (len && !data) throw CommError("send: null buffer with non-zero length");
  if (dest == rank_) {
    deliver_self(data, len, tag);
    return;
  }
  Channel& c = channel(dest, "send");
  SendOpPtr op = start_send(c, data, len, tag);
  if (!op) return;
  try {
    wait_until([&] { return send_done(*op, dest, tag); }, {false, dest, tag});
  } catch (...) {
    // The caller's buffer is about to go away. A frame not started yet is simply dropped;
    // a half-written one cannot be finished, so the channel is unusable from here on.
    std::lock_guard<std::mutex> lk(c.send_mu);
    if (!op->done && !op->failed) {
      if (op->sent == 0) {
        c.sendq.erase(std::remove(c.sendq.begin(), c.sendq.end(), op), c.sendq.end());
        op->failed = true;
        op->error = "abandoned";
      } else {
        mark_down_locked(c, ChannelState::Lost, "a send was abandoned part-way through a message (timeout)");
      }
    }
    throw;
  }
}

RequestPtr Engine::isend(const void* data, size_t len, int dest, int tag) {
  check_open();
  check_peer(dest, "isend");
  if (len && !data) throw CommError("isend: null buffer with non-zero length");
  if (dest == rank_) {
    deliver_self(data, len, tag);
    return std::make_shared<SendRequest>(shared_from_this(), nullptr, dest, tag);
  }
  Channel& c = channel(dest, "isend");
  return std::make_shared<SendRequest>(shared_from_this(), start_send(c, data, len, tag), dest, tag);
}

// ---- receiving -----------------------------------------------------------------------

void Engine::match(int source, int tag, const IncomingPtr& in) {
  auto it = posted_.find(key(source, tag));
  if (it != posted_.end() && !it->second.empty()) {
    it->second.front()->msg = in;
    it->second.pop_front();
    return;
  }
  unexpected_[key(source, tag)].push_back(in);
}

bool Engine::recv_done(const RecvState& st) {
  if (st.msg && st.msg->complete) return true;
  if (st.source != rank_) {
    const Channel& c = *ch_[static_cast<size_t>(st.source)];
    if (c.st() != ChannelState::Open) raise_lost(c);
  }
  return false;
}

RequestPtr Engine::irecv(int source, int tag) {
  check_open();
  check_peer(source, "irecv");
  auto st = std::make_shared<RecvState>();
  st->source = source;
  st->tag = tag;
  auto it = unexpected_.find(key(source, tag));
  if (it != unexpected_.end() && !it->second.empty()) {
    st->msg = it->second.front();
    it->second.pop_front();
  } else {
    posted_[key(source, tag)].push_back(st);
  }
  return std::make_shared<RecvRequest>(shared_from_this(), st);
}

BufferPtr Engine::recv(int source, int tag) {
  check_open();
  check_peer(source, "recv");
  // Same matching as irecv, without a Request object.
  auto st = std::make_shared<RecvState>();
  st->source = source;
  st->tag = tag;
  const uint64_t k = key(source, tag);
  auto it = unexpected_.find(k);
  if (it != unexpected_.end() && !it->second.empty()) {
    st->msg = it->second.front();
    it->second.pop_front();
    if (st->msg->complete) return st->msg->buf;
  } else {
    posted_[k].push_back(st);
  }
  try {
    wait_until([&] { return recv_done(*st); }, {true, source, tag});
  } catch (...) {
    // Nobody will collect this receive: give its message (matched or not yet) back to
    // the next receive of (source, tag), in order.
    if (st->msg) {
      unexpected_[k].push_front(st->msg);
    } else {
      auto& q = posted_[k];
      q.erase(std::remove(q.begin(), q.end(), st), q.end());
    }
    throw;
  }
  return st->msg->buf;
}

void Engine::read_channel(Channel& c, bool block) {
  int flags = block ? 0 : MSG_DONTWAIT;
  for (;;) {
    if (c.st() != ChannelState::Open && c.st() != ChannelState::PeerClosed) return;
    ssize_t n;
    size_t asked;
    bool direct = c.cur && c.rbeg == c.rend && c.cur->buf->data.size() - c.cur->got >= kDirectRead;
    if (direct) {
      asked = std::min(c.cur->buf->data.size() - c.cur->got, kMaxIo);
      n = ::recv(c.fd.get(), c.cur->buf->data.data() + c.cur->got, asked, flags);
    } else {
      if (c.rbeg == c.rend) {
        c.rbeg = c.rend = 0;
      } else if (c.rbeg > 0 && c.stage.size() - c.rend < wire::kHeaderSize) {
        std::memmove(c.stage.data(), c.stage.data() + c.rbeg, c.rend - c.rbeg);
        c.rend -= c.rbeg;
        c.rbeg = 0;
      }
      asked = c.stage.size() - c.rend;
      n = ::recv(c.fd.get(), c.stage.data() + c.rend, asked, flags);
    }
    flags = MSG_DONTWAIT;
    if (n > 0) {
      c.bytes_received.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
      c.last_recv_ns.store(now_ns(), std::memory_order_relaxed);
      if (direct) {
        c.cur->got += static_cast<size_t>(n);
        if (c.cur->got == c.cur->buf->data.size()) {
          c.cur->complete = true;
          c.cur.reset();
        }
      } else {
        c.rend += static_cast<size_t>(n);
        parse_stage(c);
      }
      if (static_cast<size_t>(n) < asked) return;  // drained for now
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (c.st() == ChannelState::PeerClosed) {
      mark_down(c, ChannelState::PeerClosed, "it closed its communicator");
      return;
    }
    if (n == 0)
      mark_down(c, ChannelState::Lost, "its connection closed without a goodbye (process exited or was killed)");
    else
      mark_down(c, ChannelState::Lost, "connection error (" + net::errno_text(errno) + ")");
    return;
  }
}

void Engine::parse_stage(Channel& c) {
  while (c.rbeg < c.rend) {
    size_t avail = c.rend - c.rbeg;
    if (c.cur) {
      size_t take = std::min(avail, c.cur->buf->data.size() - c.cur->got);
      std::memcpy(c.cur->buf->data.data() + c.cur->got, c.stage.data() + c.rbeg, take);
      c.cur->got += take;
      c.rbeg += take;
      if (c.cur->got == c.cur->buf->data.size()) {
        c.cur->complete = true;
        c.cur.reset();
      }
      continue;
    }
    if (avail < wire::kHeaderSize) return;
    wire::Header h;
    std::string bad = wire::decode_header(c.stage.data() + c.rbeg, &h);
    c.rbeg += wire::kHeaderSize;
    if (!bad.empty()) {
      mark_down(c, ChannelState::Lost, "protocol error (" + bad + ")");
      return;
    }
    switch (h.kind) {
      case wire::Kind::Ping:
      case wire::Kind::Select:
        break;
      case wire::Kind::Bye:
        mark_down(c, ChannelState::PeerClosed, "it closed its communicator");
        break;
      case wire::Kind::Data: {
        auto in = std::make_shared<Incoming>();
        in->buf = std::make_shared<Buffer>();
        try {
          in->buf->data.resize(h.length);
        } catch (const std::exception&) {
          mark_down(c, ChannelState::Lost, "cannot allocate " + std::to_string(h.length) + " bytes for its message");
          return;
        }
        if (h.length == 0) {
          in->complete = true;
        } else {
          c.cur = in;
        }
        match(c.peer, h.tag, in);
        break;
      }
    }
  }
}

void Engine::mark_down(Channel& c, ChannelState why, const std::string& reason) {
  std::lock_guard<std::mutex> lk(c.send_mu);
  mark_down_locked(c, why, reason);
}

void Engine::mark_down_locked(Channel& c, ChannelState why, const std::string& reason) {
  ChannelState now = c.st();
  if (now == ChannelState::Lost || now == ChannelState::Closed) return;
  if (now == ChannelState::PeerClosed) {
    // Anything after its bye (EOF, a reset, a failed write) just finishes the channel;
    // the reason stays "it closed its communicator".
    c.state = static_cast<int>(ChannelState::Closed);
  } else {
    c.state = static_cast<int>(why);
    c.reason = reason;
  }
  for (auto& op : c.sendq) {
    op->failed = true;
    op->error = reason;
  }
  c.sendq.clear();
}

// ---- progress ------------------------------------------------------------------------

void Engine::progress_once(int timeout_ms) {
  pfds_.clear();
  poll_ranks_.clear();
  for (auto& cp : ch_) {
    if (!cp) continue;
    Channel& c = *cp;
    ChannelState s = c.st();
    if (s != ChannelState::Open && s != ChannelState::PeerClosed) continue;
    short ev = POLLIN;
    {
      std::lock_guard<std::mutex> lk(c.send_mu);
      if (!c.sendq.empty()) ev |= POLLOUT;
    }
    pfds_.push_back({c.fd.get(), ev, 0});
    poll_ranks_.push_back(c.peer);
  }
  if (pfds_.empty()) {
    if (timeout_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(std::min(timeout_ms, 10)));
    return;
  }
  int rc = ::poll(pfds_.data(), pfds_.size(), timeout_ms);
  if (rc < 0) {
    if (errno == EINTR) return;
    throw CommError("poll failed: " + net::errno_text(errno));
  }
  int64_t t = now_ns();
  for (size_t i = 0; i < pfds_.size(); ++i) {
    Channel& c = *ch_[static_cast<size_t>(poll_ranks_[i])];
    short re = pfds_[i].revents;
    if (re & (POLLIN | POLLHUP | POLLERR)) read_channel(c);
    if (re & POLLOUT) {
      std::lock_guard<std::mutex> lk(c.send_mu);
      if (c.st() == ChannelState::Open) write_queue(c);
    } else if (!(re & POLLIN)) {
      check_silence(c, t);
    }
  }
}

void Engine::check_silence(Channel& c, int64_t t) {
  // The peer's keep-alive thread pings every keepalive_s on an idle channel; this much
  // silence means its process or the network path is gone.
  const int64_t limit = static_cast<int64_t>(keepalive_s_ * 4e9) + 1000000000;
  int64_t last = c.last_recv_ns.load(std::memory_order_relaxed);
  if (c.st() == ChannelState::Open && t - last > limit)
    mark_down(c, ChannelState::Lost,
              "nothing received for " + std::to_string((t - last) / 1000000000) + " s, not even keep-alive pings");
}

bool Engine::progress_blocking_recv(int peer) {
  if (peer == rank_) return false;
  Channel& c = *ch_[static_cast<size_t>(peer)];
  ChannelState s = c.st();
  if (s != ChannelState::Open && s != ChannelState::PeerClosed) return false;
  for (auto& cp : ch_) {
    if (!cp || cp.get() == &c) continue;
    ChannelState o = cp->st();
    if (o == ChannelState::Open || o == ChannelState::PeerClosed) return false;
  }
  {
    std::lock_guard<std::mutex> lk(c.send_mu);
    if (!c.sendq.empty()) return false;
  }
  // The socket is in blocking mode with SO_RCVTIMEO (kRecvSliceMs): recv() returns within
  // that slice even when nothing arrives, so the caller's deadline is honoured.
  read_channel(c, true);
  check_silence(c, now_ns());
  return true;
}

void Engine::progress_nonblocking() {
  check_open();
  progress_once(0);
}

void Engine::wait_until(const std::function<bool()>& done, const Awaited& what) {
  check_open();
  if (done()) return;
  net::TimePoint deadline = net::deadline_after(timeout_s_);
  for (;;) {
    int ms = net::ms_until(deadline, 1000);
    if (ms == 0) {
      progress_once(0);
      if (done()) return;
      throw TimeoutError("timed out after " + std::to_string(timeout_s_) + " s waiting for " +
                         (what.is_recv ? "a message from " + describe(what.peer, what.tag)
                                       : "a send to " + describe(what.peer, what.tag) + " to complete"));
    }
    if (!(what.is_recv && progress_blocking_recv(what.peer))) progress_once(ms);
    if (done()) return;
  }
}

// ---- keep-alive, stats, close --------------------------------------------------------

void Engine::keepalive_loop() {
  const int64_t idle_ns = static_cast<int64_t>(keepalive_s_ * 1e9);
  auto period = std::chrono::duration<double>(std::min(1.0, std::max(0.01, keepalive_s_ / 4)));
  std::unique_lock<std::mutex> lk(ka_mu_);
  while (!ka_stop_) {
    ka_cv_.wait_for(lk, period);
    if (ka_stop_) break;
    int64_t t = now_ns();
    for (auto& cp : ch_) {
      if (!cp) continue;
      Channel& c = *cp;
      if (c.st() != ChannelState::Open || t - c.last_send_ns.load(std::memory_order_relaxed) < idle_ns) continue;
      std::unique_lock<std::mutex> sl(c.send_mu, std::try_to_lock);
      if (!sl.owns_lock() || !c.sendq.empty() || c.st() != ChannelState::Open) continue;
      uint8_t h[wire::kHeaderSize];
      wire::Header ping;
      ping.kind = wire::Kind::Ping;
      wire::encode_header(ping, h);
      ssize_t w = ::send(c.fd.get(), h, sizeof h, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w == static_cast<ssize_t>(sizeof h) || w > 0) {
        c.bytes_sent.fetch_add(static_cast<uint64_t>(w), std::memory_order_relaxed);
        if (w < static_cast<ssize_t>(sizeof h)) {
          // Leave the rest of the ping for the progress engine, ahead of any later frame.
          auto op = std::make_shared<SendOp>();
          std::memcpy(op->header, h, sizeof h);
          op->sent = static_cast<size_t>(w);
          c.sendq.push_back(op);
        }
      }
      // A full buffer (EAGAIN) means the channel is not idle on the wire; errors surface
      // on the next user operation.
      c.last_send_ns.store(t, std::memory_order_relaxed);
    }
  }
}

std::vector<PeerStats> Engine::stats() const {
  std::vector<PeerStats> out;
  for (int r = 0; r < size_; ++r) {
    const auto& cp = ch_[static_cast<size_t>(r)];
    if (!cp) {
      out.push_back(PeerStats{r, "self", "", 0, 0});
      continue;
    }
    out.push_back(PeerStats{r, cp->relay ? "relay" : "direct", cp->address,
                            cp->bytes_sent.load(std::memory_order_relaxed),
                            cp->bytes_received.load(std::memory_order_relaxed)});
  }
  return out;
}

void Engine::close() {
  if (closed_) return;
  {
    std::lock_guard<std::mutex> lk(ka_mu_);
    ka_stop_ = true;
  }
  ka_cv_.notify_all();
  if (keepalive_.joinable()) keepalive_.join();
  // Finish queued sends (isends never waited on) within the timeout, reading meanwhile.
  auto pending = [this] {
    for (auto& cp : ch_) {
      if (!cp || cp->st() != ChannelState::Open) continue;
      std::lock_guard<std::mutex> lk(cp->send_mu);
      if (!cp->sendq.empty()) return true;
    }
    return false;
  };
  net::TimePoint deadline = net::deadline_after(timeout_s_);
  try {
    while (pending() && net::Clock::now() < deadline) progress_once(net::ms_until(deadline, 100));
  } catch (const CommError&) {
    // close() must not throw: whatever could not be flushed is dropped.
  }
  closed_ = true;
  for (auto& cp : ch_) {
    if (!cp) continue;
    Channel& c = *cp;
    std::lock_guard<std::mutex> lk(c.send_mu);
    if (c.st() == ChannelState::Open && c.sendq.empty()) {
      uint8_t h[wire::kHeaderSize];
      wire::Header bye;
      bye.kind = wire::Kind::Bye;
      wire::encode_header(bye, h);
      ::send(c.fd.get(), h, sizeof h, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    for (auto& op : c.sendq) {
      op->failed = true;
      op->error = "the communicator was closed before the send completed";
    }
    c.sendq.clear();
    if (c.fd) ::shutdown(c.fd.get(), SHUT_WR);
    c.state = static_cast<int>(ChannelState::Closed);
    if (c.reason.empty()) c.reason = "this communicator is closed";
    c.fd.reset();
  }
}

}  // namespace skyfn::comm
