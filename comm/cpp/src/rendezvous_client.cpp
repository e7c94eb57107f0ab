// Control connection to the rendezvous server (see rendezvous_client.hpp, docs/comm.md).
#include "rendezvous_client.hpp"

#include <arpa/inet.h>
#include <sys/socket.h>

#include <regex>
#include <sstream>

namespace skyfn::comm {

void validate_options(const JoinOptions& o) {
  static const std::regex group_re("[A-Za-z0-9._:@-]{1,128}");
  if (!std::regex_match(o.group, group_re))
    throw CommError("invalid group id '" + o.group + "': use 1-128 characters from [A-Za-z0-9._:@-]");
  if (o.rendezvous_host.empty()) throw CommError("no rendezvous host given: pass rendezvous=\"host:port\"");
  if (o.rendezvous_port <= 0 || o.rendezvous_port > 65535)
    throw CommError("invalid rendezvous port " + std::to_string(o.rendezvous_port) + ": use 1..65535");
  if (o.token.empty() || o.token.find_first_of(" \t\r\n") != std::string::npos || o.token.size() > 512)
    throw CommError("invalid group token: pass the token made by rendezvous.make_token(secret, group)");
  if (o.size < 1) throw CommError("invalid group size " + std::to_string(o.size) + ": use size >= 1");
  if (o.rank < -1 || o.rank >= o.size)
    throw CommError("invalid rank " + std::to_string(o.rank) + " for size " + std::to_string(o.size) +
                    ": use 0..size-1, or -1 to let the server assign one");
  if (!(o.timeout_s > 0)) throw CommError("invalid timeout " + std::to_string(o.timeout_s) + ": use a positive number of seconds");
  if (!(o.punch_timeout_s > 0))
    throw CommError("invalid punch timeout " + std::to_string(o.punch_timeout_s) + ": use a positive number of seconds");
  if (!(o.keepalive_s > 0))
    throw CommError("invalid keepalive interval " + std::to_string(o.keepalive_s) + ": use a positive number of seconds");
}

void raise_server_error(const std::string& line, const std::string& context) {
  std::istringstream in(line);
  std::string word, code;
  in >> word >> code;
  std::string reason;
  std::getline(in, reason);
  if (!reason.empty() && reason[0] == ' ') reason.erase(0, 1);
  std::string msg = "rendezvous server refused " + context + ": " + code + (reason.empty() ? "" : " (" + reason + ")");
  if (code == "bad_token" || code == "expired_token") throw AuthError(msg);
  if (code == "timeout") throw TimeoutError(msg);
  if (code == "busy") throw ServerBusy(msg);
  if (code == "peer_lost") throw PeerLostError(msg);
  throw CommError(msg);
}

std::string ControlConnection::read_line(net::TimePoint deadline, const std::string& what) {
  std::string line;
  if (!reader_.read_line(fd_.get(), line, deadline, what))
    throw CommError("the rendezvous server closed the connection while waiting for " + what);
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return line;
}

void ControlConnection::join(const JoinOptions& o, bool listen, net::TimePoint deadline) {
  server_ = net::resolve_ipv4(o.rendezvous_host, o.rendezvous_port);
  fd_ = net::reusable_socket(0);
  port_ = net::local_port(fd_.get());
  if (listen) {
    listener_ = net::reusable_socket(port_);
    if (::listen(listener_.get(), SOMAXCONN) < 0)
      throw CommError("listen on port " + std::to_string(port_) + " failed: " + net::errno_text(errno));
  }
  net::connect_until(fd_.get(), server_, deadline, "the rendezvous server");
  net::set_nodelay(fd_.get());
  std::string join = "JOIN " + o.group + " " + o.token + " " + std::to_string(o.size) + " " + std::to_string(o.rank) + "\n";
  net::write_all_until(fd_.get(), join.data(), join.size(), deadline, "the rendezvous server");
  std::string line = read_line(deadline, "WELCOME from the rendezvous server");
  if (line.rfind("ERROR ", 0) == 0) raise_server_error(line, "the join of group '" + o.group + "'");
  std::istringstream in(line);
  std::string word;
  int rank = -1, size = -1;
  if (!(in >> word >> rank >> size) || word != "WELCOME" || rank < 0 || rank >= size || size != o.size)
    throw CommError("unexpected answer to JOIN from the rendezvous server: '" + line.substr(0, 200) + "'");
  if (o.rank >= 0 && rank != o.rank)
    throw CommError("the rendezvous server assigned rank " + std::to_string(rank) + ", asked for " + std::to_string(o.rank));
  rank_ = rank;
  size_ = size;
}

void ControlConnection::wait_peers(net::TimePoint deadline) {
  const std::string what = "the rest of the group (PEERS from the rendezvous server)";
  std::string line = read_line(deadline, what);
  if (line.rfind("ERROR ", 0) == 0) raise_server_error(line, "the group while waiting for all ranks");
  std::istringstream in(line);
  std::string word;
  int n = -1;
  if (!(in >> word >> n) || word != "PEERS" || n != size_)
    throw CommError("unexpected line from the rendezvous server (expected PEERS " + std::to_string(size_) +
                    "): '" + line.substr(0, 200) + "'");
  peers_.assign(static_cast<size_t>(size_), PeerAddress{});
  std::vector<bool> seen(static_cast<size_t>(size_), false);
  for (int i = 0; i < n; ++i) {
    line = read_line(deadline, "PEER lines from the rendezvous server");
    std::istringstream pin(line);
    int r = -1, port = 0;
    std::string ip;
    if (!(pin >> word >> r >> ip >> port) || word != "PEER" || r < 0 || r >= size_ || seen[static_cast<size_t>(r)])
      throw CommError("malformed PEER line from the rendezvous server: '" + line.substr(0, 200) + "'");
    seen[static_cast<size_t>(r)] = true;
    PeerAddress& p = peers_[static_cast<size_t>(r)];
    p.rank = r;
    p.addr.sin_family = AF_INET;
    if (inet_pton(AF_INET, ip.c_str(), &p.addr.sin_addr) != 1 || port <= 0 || port > 65535)
      throw CommError("PEER line with an address that is not IPv4: '" + line.substr(0, 200) + "'");
    p.addr.sin_port = htons(static_cast<uint16_t>(port));
  }
}

void ControlConnection::barrier(long epoch, net::TimePoint deadline) {
  std::string msg = "BARRIER " + std::to_string(epoch) + "\n";
  net::write_all_until(fd_.get(), msg.data(), msg.size(), deadline, "the rendezvous server");
  std::string line = read_line(deadline, "every rank to finish joining (BARRIER_OK " + std::to_string(epoch) + ")");
  if (line.rfind("ERROR ", 0) == 0) raise_server_error(line, "the bootstrap barrier");
  if (line != "BARRIER_OK " + std::to_string(epoch))
    throw CommError("unexpected answer to BARRIER from the rendezvous server: '" + line.substr(0, 200) + "'");
}

void ControlConnection::send_quiet(const std::string& line) {
  if (!fd_) return;
  // Short lines on an idle control socket: one non-blocking send; dropping them is harmless.
  ::send(fd_.get(), line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

void ControlConnection::close_quiet() {
  listener_.reset();
  if (fd_) send_quiet("BYE\n");
  fd_.reset();
}

std::string relay_line(const JoinOptions& o, int me, int peer) {
  return "RELAY " + o.group + " " + o.token + " " + std::to_string(me) + " " + std::to_string(peer) + "\n";
}

}  // namespace skyfn::comm
