// Small POSIX socket helpers shared by the rendezvous client, the puncher and the engine:
// an owning fd, socket options, IPv4 address parsing, clocks and deadlines.
#pragma once

#include <netinet/in.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace skyfn::comm::net {

using Clock = std::chrono::steady_clock;
using TimePoint = Clock::time_point;

TimePoint deadline_after(double seconds);
// Milliseconds left until `deadline` for poll(): 0 when passed, capped at `cap_ms`.
int ms_until(TimePoint deadline, int cap_ms = 1 << 30);
double seconds_since(TimePoint start);

// Owning file descriptor (move-only).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { int f = fd_; fd_ = -1; return f; }
  void reset(int fd = -1);
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

std::string errno_text(int err);

// Resolve an IPv4 host name or dotted quad (throws CommError naming the host).
sockaddr_in resolve_ipv4(const std::string& host, int port);
std::string to_string(const sockaddr_in& a);  // "ip:port"

// A new non-blocking TCP socket with SO_REUSEADDR and SO_REUSEPORT set, bound to
// 0.0.0.0:`port` (0 = ephemeral). Throws CommError.
Fd reusable_socket(uint16_t port);
uint16_t local_port(int fd);
sockaddr_in peer_address(int fd);

// Clear O_NONBLOCK and make blocking receives give up after `recv_timeout_ms`.
void set_blocking_with_timeout(int fd, int recv_timeout_ms);
void set_nodelay(int fd);

// Blocking-style helpers on non-blocking sockets, bounded by a deadline. They throw
// TimeoutError(what) / CommError on failure.
void connect_until(int fd, const sockaddr_in& to, TimePoint deadline, const std::string& what);
void write_all_until(int fd, const void* data, size_t len, TimePoint deadline, const std::string& what);
// Buffered line reader for a stream that carries only lines (the control connection).
class LineReader {
 public:
  // false on EOF; throws TimeoutError(what) at the deadline, CommError on errors and
  // on lines longer than max_len.
  bool read_line(int fd, std::string& line, TimePoint deadline, const std::string& what,
                 size_t max_len = 1024);

 private:
  std::string buf_;
};
// Wait until fd is readable (or has an error/hangup); false on timeout.
bool wait_readable(int fd, TimePoint deadline);

}  // namespace skyfn::comm::net
