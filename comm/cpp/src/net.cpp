// Small POSIX socket helpers (see net.hpp).
#include "net.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "skyfn_comm/communicator.hpp"

namespace skyfn::comm::net {

TimePoint deadline_after(double seconds) {
  if (seconds < 0) seconds = 0;
  if (seconds > 1e7) seconds = 1e7;  // "forever" without overflowing the clock
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

int ms_until(TimePoint deadline, int cap_ms) {
  auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  // Round up so a poll does not wake just before the deadline and spin.
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1;
  return ms > cap_ms ? cap_ms : static_cast<int>(ms);
}

double seconds_since(TimePoint start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string errno_text(int err) { return std::strerror(err); }

sockaddr_in resolve_ipv4(const std::string& host, int port) {
  if (port <= 0 || port > 65535)
    throw CommError("invalid port " + std::to_string(port) + " for host '" + host + "': use 1..65535");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1) return a;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    throw CommError("cannot resolve rendezvous host '" + host + "': " + gai_strerror(rc) +
                    " (pass an IPv4 address or a resolvable name)");
  a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return a;
}

std::string to_string(const sockaddr_in& a) {
  char ip[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
  return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}

void set_blocking_with_timeout(int fd, int recv_timeout_ms) {
  int fl = fcntl(fd, F_GETFL, 0);
  if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
    throw CommError("fcntl(~O_NONBLOCK) failed: " + errno_text(errno));
  timeval tv{recv_timeout_ms / 1000, (recv_timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

Fd reusable_socket(uint16_t port) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) throw CommError("socket() failed: " + errno_text(errno));
  int one = 1;
  // Both options before bind, on every socket sharing the port (REFERENCE.md).
  if (setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
      setsockopt(fd.get(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0)
    throw CommError("setsockopt(SO_REUSEADDR/SO_REUSEPORT) failed: " + errno_text(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(port);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) < 0)
    throw CommError("bind(0.0.0.0:" + std::to_string(port) + ") failed: " + errno_text(errno));
  return fd;
}

uint16_t local_port(int fd) {
  sockaddr_in a{};
  socklen_t n = sizeof a;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) < 0)
    throw CommError("getsockname failed: " + errno_text(errno));
  return ntohs(a.sin_port);
}

sockaddr_in peer_address(int fd) {
  sockaddr_in a{};
  socklen_t n = sizeof a;
  getpeername(fd, reinterpret_cast<sockaddr*>(&a), &n);
  return a;
}

static bool poll_one(int fd, short events, TimePoint deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, ms_until(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) throw CommError("poll failed: " + errno_text(errno));
  }
}

bool wait_readable(int fd, TimePoint deadline) { return poll_one(fd, POLLIN, deadline); }

void connect_until(int fd, const sockaddr_in& to, TimePoint deadline, const std::string& what) {
  int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to);
  if (rc == 0) return;
  if (errno != EINPROGRESS)
    throw CommError("cannot connect to " + what + " at " + to_string(to) + ": " + errno_text(errno));
  if (!poll_one(fd, POLLOUT, deadline))
    throw TimeoutError("timed out connecting to " + what + " at " + to_string(to));
  int err = 0;
  socklen_t n = sizeof err;
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &n);
  if (err != 0)
    throw CommError("cannot connect to " + what + " at " + to_string(to) + ": " + errno_text(err));
}

void write_all_until(int fd, const void* data, size_t len, TimePoint deadline, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!poll_one(fd, POLLOUT, deadline)) throw TimeoutError("timed out writing to " + what);
      continue;
    }
    throw CommError("write to " + what + " failed: " + errno_text(errno));
  }
}

bool LineReader::read_line(int fd, std::string& line, TimePoint deadline, const std::string& what, size_t max_len) {
  for (;;) {
    auto nl = buf_.find('\n');
    if (nl != std::string::npos) {
      line.assign(buf_, 0, nl);
      buf_.erase(0, nl + 1);
      return true;
    }
    if (buf_.size() > max_len)
      throw CommError("line from " + what + " longer than " + std::to_string(max_len) + " bytes");
    char tmp[16384];
    ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
    if (n > 0) {
      buf_.append(tmp, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_readable(fd, deadline)) throw TimeoutError("timed out waiting for " + what);
      continue;
    }
    throw CommError("read from " + what + " failed: " + errno_text(errno));
  }
}

}  // namespace skyfn::comm::net
