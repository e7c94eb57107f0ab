// Test helpers (see test_support.hpp).
#include "test_support.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace skyfn::comm::testing {

RendezvousProcess::RendezvousProcess(const std::string& secret, double join_timeout_s,
                                     const std::vector<std::string>& extra_args)
    : secret_(secret) {
  char tmpl[] = "/tmp/skyfn-rdv-port-XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd < 0) throw std::runtime_error("mkstemp failed");
  ::close(fd);
  ::unlink(tmpl);
  port_file_ = tmpl;
  std::string jt = std::to_string(join_timeout_s);
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);  // never outlive a crashed test binary
    if (chdir(SKYFN_REPO_ROOT) != 0) _exit(127);
    std::vector<std::string> args = {SKYFN_PYTHON, "-m", "rendezvous", "--host", "127.0.0.1", "--port", "0",
                                     "--secret", secret, "--join-timeout", jt, "--log-level", "warning",
                                     "--port-file", port_file_};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(SKYFN_PYTHON, argv.data());
    _exit(127);
  }
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream in(port_file_);
    int p = 0;
    if (in >> p && p > 0) {
      port_ = p;
      return;
    }
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error("the rendezvous server exited at start-up (is .venv installed?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  stop();
  throw std::runtime_error("the rendezvous server did not start within 30 s");
}

RendezvousProcess::~RendezvousProcess() { stop(); }

void RendezvousProcess::stop() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 100 && waitpid(pid_, &status, WNOHANG) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (waitpid(pid_, &status, WNOHANG) == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
    pid_ = -1;
  }
  if (!port_file_.empty()) ::unlink(port_file_.c_str());
}

std::string make_token(const std::string& secret, const std::string& group, double ttl_s) {
  std::string cmd = "cd " SKYFN_REPO_ROOT " && " SKYFN_PYTHON
                    " -c 'import sys, rendezvous; print(rendezvous.make_token(sys.argv[1], sys.argv[2], "
                    "float(sys.argv[3])))' '" + secret + "' '" + group + "' " + std::to_string(ttl_s);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed");
  char buf[256] = {0};
  std::string out;
  while (fgets(buf, sizeof buf, p)) out += buf;
  int rc = pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  if (rc != 0 || out.empty()) throw std::runtime_error("make_token failed: " + out);
  return out;
}

std::string unique_group(const std::string& prefix) {
  static std::atomic<int> n{0};
  return prefix + "-" + std::to_string(getpid()) + "-" + std::to_string(n++);
}

JoinOptions options(const RendezvousProcess& srv, const std::string& group, int size) {
  JoinOptions o;
  o.group = group;
  o.rendezvous_host = "127.0.0.1";
  o.rendezvous_port = srv.port();
  o.token = make_token(srv.secret(), group);
  o.size = size;
  o.timeout_s = 20;
  o.punch_timeout_s = 2;
  return o;
}

void run_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  std::mutex mu;
  std::exception_ptr first;
  for (int i = 0; i < n; ++i) {
    ts.emplace_back([&, i] {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : ts) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace skyfn::comm::testing
