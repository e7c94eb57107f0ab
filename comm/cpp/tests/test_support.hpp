// Test helpers: a real rendezvous server (python -m rendezvous) as a child process,
// tokens minted by rendezvous.make_token, and running a group of ranks on threads.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "skyfn_comm/communicator.hpp"

namespace skyfn::comm::testing {

class RendezvousProcess {
 public:
  // Starts the server on 127.0.0.1 (any free port) and waits until it listens.
  explicit RendezvousProcess(const std::string& secret = "test-secret", double join_timeout_s = 20,
                             const std::vector<std::string>& extra_args = {});
  ~RendezvousProcess();
  void stop();
  int port() const { return port_; }
  const std::string& secret() const { return secret_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string secret_;
  std::string port_file_;
};

// rendezvous.make_token(secret, group, ttl_s)
std::string make_token(const std::string& secret, const std::string& group, double ttl_s = 3600);

// A fresh group id per call (tests share one server).
std::string unique_group(const std::string& prefix);

JoinOptions options(const RendezvousProcess& srv, const std::string& group, int size);

// Runs fn(rank_index) on n threads; rethrows the first exception after all finished.
void run_threads(int n, const std::function<void(int)>& fn);

}  // namespace skyfn::comm::testing
