// Channel establishment for every pair of a group at once (docs/comm.md, "Punching and
// relay choice"): listen on the control port and connect from it, HELLO, the lower rank's
// SELECT, and the relay fallback through the rendezvous server.
#pragma once

#include <string>
#include <vector>

#include "net.hpp"
#include "rendezvous_client.hpp"

namespace skyfn::comm {

struct Link {
  net::Fd fd;              // connected, non-blocking, HELLO (and SELECT) already exchanged
  bool relay = false;
  std::string address;     // "ip:port" of the other end of the TCP connection
};

// Returns one Link per rank (the own rank's entry has no fd). Throws TimeoutError naming
// the ranks that could not be reached by `deadline`, CommError/AuthError on failures.
std::vector<Link> establish_channels(ControlConnection& ctl, const JoinOptions& o, net::TimePoint deadline);

}  // namespace skyfn::comm
