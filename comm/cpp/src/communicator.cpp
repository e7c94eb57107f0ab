// Communicator::join and the concrete communicator: joins through the rendezvous server,
// establishes every channel (punch.cpp), then serves point to point through the engine
// and collectives through collectives.cpp.
#include <chrono>
#include <memory>
#include <random>
#include <thread>

#include "collectives.hpp"
#include "engine.hpp"
#include "punch.hpp"
#include "rendezvous_client.hpp"
#include "skyfn_comm/communicator.hpp"

namespace skyfn::comm {

namespace {

class CommunicatorImpl : public Communicator {
 public:
  CommunicatorImpl(std::unique_ptr<ControlConnection> ctl, std::shared_ptr<Engine> eng)
      : ctl_(std::move(ctl)), eng_(std::move(eng)) {}
  ~CommunicatorImpl() override { close(); }

  int rank() const override { return eng_->rank(); }
  int size() const override { return eng_->size(); }

  void send(const void* data, size_t len, int dest, int tag) override { eng_->send(data, len, dest, tag); }
  BufferPtr recv(int source, int tag) override { return eng_->recv(source, tag); }
  RequestPtr isend(const void* data, size_t len, int dest, int tag) override { return eng_->isend(data, len, dest, tag); }
  RequestPtr irecv(int source, int tag) override { return eng_->irecv(source, tag); }

  void barrier() override { comm::barrier(*this); }
  BufferPtr bcast(const void* data, size_t len, int root) override { return comm::bcast(*this, data, len, root); }
  std::vector<BufferPtr> gatherv(const void* data, size_t len, int root) override {
    return comm::gatherv(*this, data, len, root);
  }
  BufferPtr scatterv(const std::vector<std::pair<const void*, size_t>>& parts, int root) override {
    return comm::scatterv(*this, parts, root);
  }
  std::vector<BufferPtr> allgatherv(const void* data, size_t len) override { return comm::allgatherv(*this, data, len); }
  std::vector<BufferPtr> alltoallv(const std::vector<std::pair<const void*, size_t>>& parts) override {
    return comm::alltoallv(*this, parts);
  }
  BufferPtr reduce(const void* data, size_t count, DType dtype, ReduceOp op, int root) override {
    return comm::reduce(*this, data, count, dtype, op, root);
  }
  BufferPtr allreduce(const void* data, size_t count, DType dtype, ReduceOp op) override {
    return comm::allreduce(*this, data, count, dtype, op);
  }

  std::vector<PeerStats> stats() const override { return eng_->stats(); }
  void close() override {
    if (!eng_->closed()) eng_->close();
    if (ctl_) {
      ctl_->close_quiet();
      ctl_.reset();
    }
  }

 private:
  std::unique_ptr<ControlConnection> ctl_;
  std::shared_ptr<Engine> eng_;
};

}  // namespace

std::unique_ptr<Communicator> Communicator::join(const JoinOptions& opts) {
  validate_options(opts);
  net::TimePoint deadline = net::deadline_after(opts.timeout_s);
  std::unique_ptr<ControlConnection> ctl;
  std::mt19937 rng(std::random_device{}());
  for (double backoff = 0.05;; backoff = std::min(backoff * 2, 1.0)) {
    ctl = std::make_unique<ControlConnection>();
    try {
      ctl->join(opts, opts.allow_direct && opts.size > 1, deadline);
      break;
    } catch (const ServerBusy&) {
      // The server is at its connection/group limit: retry with jitter until the deadline.
      double wait = backoff * std::uniform_real_distribution<double>(0.5, 1.5)(rng);
      if (net::Clock::now() + std::chrono::duration_cast<net::Clock::duration>(std::chrono::duration<double>(wait)) >= deadline)
        throw;
      std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    }
  }
  ctl->wait_peers(deadline);
  // Establishing the channels is its own blocking operation: it gets a full timeout_s
  // from PEERS on, however long the group took to fill.
  std::vector<Link> links = establish_channels(*ctl, opts, net::deadline_after(opts.timeout_s));
  ctl->listener().reset();  // every pair is connected: stop accepting
  std::string results;
  for (int r = 0; r < ctl->size(); ++r)
    if (r != ctl->rank())
      results += "RESULT " + std::to_string(r) + (links[static_cast<size_t>(r)].relay ? " relay\n" : " direct\n");
  ctl->send_quiet(results);
  // Bootstrap barrier: join returns only when every rank has all its channels, so a rank
  // that failed to connect makes the others' join fail (peer_lost) instead of their first
  // collective hanging.
  ctl->barrier(0, net::deadline_after(opts.timeout_s));
  auto eng = std::make_shared<Engine>(ctl->rank(), ctl->size(), std::move(links), opts);
  return std::make_unique<CommunicatorImpl>(std::move(ctl), std::move(eng));
}

const char* version() { return "skyfn-comm 1.0 (wire version 1)"; }

}  // namespace skyfn::comm
