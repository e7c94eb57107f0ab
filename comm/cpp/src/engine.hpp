// The progress engine of a joined communicator: one Channel per peer (framing of
// docs/comm.md), per-(source, tag) FIFO matching with an unexpected-message queue, send
// queues, the poll loop that drives all of them, and the keep-alive thread.
//
// Threading: one user thread at a time calls into the engine (send/recv/test/wait/...);
// a background keep-alive thread only writes pings on idle channels, under the channel's
// send mutex, and never reads. Blocking operations do their syscalls on the calling thread.
#pragma once

#include <poll.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "net.hpp"
#include "punch.hpp"
#include "skyfn_comm/communicator.hpp"
#include "wire.hpp"

namespace skyfn::comm {

// One frame being written: the header, then `len` bytes from the caller's buffer.
struct SendOp {
  uint8_t header[wire::kHeaderSize];
  const uint8_t* payload = nullptr;
  size_t len = 0;
  size_t sent = 0;  // of kHeaderSize + len
  bool done = false;
  bool failed = false;
  std::string error;
};
using SendOpPtr = std::shared_ptr<SendOp>;

// One incoming data message, from its header on.
struct Incoming {
  BufferPtr buf;
  size_t got = 0;
  bool complete = false;
};
using IncomingPtr = std::shared_ptr<Incoming>;

// A posted receive: matched to an Incoming when its header arrives (or at post time).
struct RecvState {
  int source = 0;
  int tag = 0;
  IncomingPtr msg;
};
using RecvStatePtr = std::shared_ptr<RecvState>;

enum class ChannelState : int { Open = 0, PeerClosed = 1, Lost = 2, Closed = 3 };

struct Channel {
  int peer = -1;
  bool relay = false;
  std::string address;
  net::Fd fd;

  std::mutex send_mu;  // guards sendq, writes to fd and state transitions
  std::deque<SendOpPtr> sendq;
  std::atomic<int> state{static_cast<int>(ChannelState::Open)};
  std::string reason;  // why the channel is no longer open (set under send_mu)

  // Receive side (user thread only).
  std::vector<uint8_t> stage;
  size_t rbeg = 0, rend = 0;  // unparsed bytes are stage[rbeg, rend)
  IncomingPtr cur;  // payload being received

  std::atomic<int64_t> last_send_ns{0};
  std::atomic<int64_t> last_recv_ns{0};
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> bytes_received{0};

  ChannelState st() const { return static_cast<ChannelState>(state.load(std::memory_order_acquire)); }
};

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  Engine(int rank, int size, std::vector<Link> links, const JoinOptions& opts);
  ~Engine();

  int rank() const { return rank_; }
  int size() const { return size_; }
  double timeout_s() const { return timeout_s_; }

  void send(const void* data, size_t len, int dest, int tag);
  BufferPtr recv(int source, int tag);
  RequestPtr isend(const void* data, size_t len, int dest, int tag);
  RequestPtr irecv(int source, int tag);

  // Used by the requests.
  bool send_done(const SendOp& op, int dest, int tag);        // throws on failure
  bool recv_done(const RecvState& st);                        // throws on failure
  void progress_nonblocking();
  // What a blocking wait is for: names it in a TimeoutError (built only on timeout) and
  // lets a receive from the only open channel block in recv() itself.
  struct Awaited {
    bool is_recv;
    int peer;
    int tag;
  };
  void wait_until(const std::function<bool()>& done, const Awaited& what);

  std::vector<PeerStats> stats() const;
  void close();
  bool closed() const { return closed_; }

 private:
  void check_open() const;
  Channel& channel(int peer, const char* op);
  void check_peer(int peer, const char* op) const;
  [[noreturn]] void raise_lost(const Channel& c) const;
  SendOpPtr start_send(Channel& c, const void* data, size_t len, int tag);
  void deliver_self(const void* data, size_t len, int tag);
  void match(int source, int tag, const IncomingPtr& in);
  // One pass of the poll loop: waits up to timeout_ms for any channel event.
  void progress_once(int timeout_ms);
  // Blocking receive on `peer`'s channel when nothing else can need progress (it is the
  // only open channel and has nothing queued to send): one recv() syscall, as a plain
  // socket would do. Returns false when that shortcut does not apply.
  bool progress_blocking_recv(int peer);
  void read_channel(Channel& c, bool block = false);
  void check_silence(Channel& c, int64_t now);
  void parse_stage(Channel& c);
  void write_queue(Channel& c);  // caller holds send_mu
  void mark_down(Channel& c, ChannelState why, const std::string& reason);
  void mark_down_locked(Channel& c, ChannelState why, const std::string& reason);
  void keepalive_loop();

  int rank_, size_;
  double timeout_s_, keepalive_s_;
  std::vector<std::unique_ptr<Channel>> ch_;  // by rank; null for self
  std::unordered_map<uint64_t, std::deque<IncomingPtr>> unexpected_;
  std::unordered_map<uint64_t, std::deque<RecvStatePtr>> posted_;
  std::vector<pollfd> pfds_;
  std::vector<int> poll_ranks_;
  bool closed_ = false;

  std::thread keepalive_;
  std::mutex ka_mu_;
  std::condition_variable ka_cv_;
  bool ka_stop_ = false;
};

}  // namespace skyfn::comm
