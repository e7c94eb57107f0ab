// Client side of the rendezvous protocol (docs/comm.md): the control connection (JOIN,
// WELCOME, PEERS, BARRIER, RESULT, BYE) and the text part of a RELAY connection.
#pragma once

#include <netinet/in.h>

#include <string>
#include <vector>

#include "net.hpp"
#include "skyfn_comm/communicator.hpp"

namespace skyfn::comm {

struct PeerAddress {
  int rank = -1;
  sockaddr_in addr{};  // public address as the server saw it
};

// Throws CommError naming the bad field and the fix.
void validate_options(const JoinOptions& o);

// ERROR busy: the server is at its connection or group limit; join() retries.
class ServerBusy : public CommError {
 public:
  using CommError::CommError;
};

// Raise the exception an "ERROR <code> <reason>" line stands for (AuthError for token
// problems, CommError otherwise). `context` says which exchange failed.
[[noreturn]] void raise_server_error(const std::string& line, const std::string& context);

class ControlConnection {
 public:
  // Binds a reusable socket to an ephemeral port; when `listen` is set, also listens on that
  // port (before connecting, so peers can reach it as soon as they learn it); then connects
  // to the server and joins. Returns after WELCOME.
  void join(const JoinOptions& o, bool listen, net::TimePoint deadline);
  // Blocks until PEERS and the n PEER lines arrived.
  void wait_peers(net::TimePoint deadline);
  // BARRIER <epoch> / BARRIER_OK <epoch>: every rank of the group reached this point.
  void barrier(long epoch, net::TimePoint deadline);
  // Best-effort lines (RESULT, BYE): never throw.
  void send_quiet(const std::string& line);
  void close_quiet();

  int rank() const { return rank_; }
  int size() const { return size_; }
  uint16_t port() const { return port_; }
  const sockaddr_in& server() const { return server_; }
  const std::vector<PeerAddress>& peers() const { return peers_; }
  net::Fd& listener() { return listener_; }

 private:
  std::string read_line(net::TimePoint deadline, const std::string& what);

  net::Fd fd_;
  net::Fd listener_;
  net::LineReader reader_;
  sockaddr_in server_{};
  uint16_t port_ = 0;
  int rank_ = -1;
  int size_ = 0;
  std::vector<PeerAddress> peers_;
};

// "RELAY <group> <token> <me> <peer>\n"
std::string relay_line(const JoinOptions& o, int me, int peer);

}  // namespace skyfn::comm
