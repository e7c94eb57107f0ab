// Public C++ API of the skyfn communicator (the Cython binding wraps exactly this).
// Contract: docs/comm.md. Errors are exceptions (CommError and subclasses), never exits.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace skyfn::comm {

class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class AuthError : public CommError {          // rendezvous rejected the token
 public:
  using CommError::CommError;
};
class TimeoutError : public CommError {       // an operation exceeded the timeout
 public:
  using CommError::CommError;
};
class PeerLostError : public CommError {      // a peer closed or died
 public:
  using CommError::CommError;
};

enum class DType : int { Int32 = 0, Int64 = 1, Float32 = 2, Float64 = 3 };
enum class ReduceOp : int { Sum = 0, Min = 1, Max = 2, Prod = 3 };

namespace detail {
void* buffer_alloc(size_t bytes);                  // src/buffer_pool.cpp
void buffer_free(void* p, size_t bytes) noexcept;
}  // namespace detail

// Allocator of message bytes. resize() leaves bytes uninitialized (the network or a
// memcpy overwrites them at once; zeroing first would cost a full extra pass), and blocks
// of 1 MiB and more are recycled through a small process-wide cache, so a stream of large
// messages does not page-fault fresh memory for every one. Use resize(n, 0) for zeros.
template <class T>
struct BufferAllocator {
  using value_type = T;
  BufferAllocator() noexcept = default;
  template <class U>
  BufferAllocator(const BufferAllocator<U>&) noexcept {}
  T* allocate(size_t n) { return static_cast<T*>(detail::buffer_alloc(n * sizeof(T))); }
  void deallocate(T* p, size_t n) noexcept { detail::buffer_free(p, n * sizeof(T)); }
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;  // default-initialization: no zeroing
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  friend bool operator==(const BufferAllocator&, const BufferAllocator&) noexcept { return true; }
  friend bool operator!=(const BufferAllocator&, const BufferAllocator&) noexcept { return false; }
};
// The byte vector of a Buffer. It converts to (and compares with) std::vector<uint8_t>,
// so code written against a plain byte vector keeps compiling.
class Bytes : public std::vector<uint8_t, BufferAllocator<uint8_t>> {
 public:
  using Base = std::vector<uint8_t, BufferAllocator<uint8_t>>;
  using Base::Base;
  Bytes() = default;
  operator std::vector<uint8_t>() const { return std::vector<uint8_t>(begin(), end()); }
  friend bool operator==(const Bytes& a, const std::vector<uint8_t>& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator==(const std::vector<uint8_t>& a, const Bytes& b) { return b == a; }
  friend bool operator!=(const Bytes& a, const std::vector<uint8_t>& b) { return !(a == b); }
  friend bool operator!=(const std::vector<uint8_t>& a, const Bytes& b) { return !(b == a); }
};

// A received message: owns its bytes (exposed to Python through the buffer protocol).
struct Buffer {
  Bytes data;
  size_t size() const { return data.size(); }
};
using BufferPtr = std::shared_ptr<Buffer>;

struct JoinOptions {
  std::string group;
  std::string rendezvous_host;
  int rendezvous_port = 0;
  std::string token;
  int size = 0;
  int rank = -1;                 // -1: the server assigns one
  double timeout_s = 30.0;       // every blocking operation, join included
  double punch_timeout_s = 3.0;  // then the pair falls back to the relay (at most timeout_s / 2)
  double keepalive_s = 15.0;
  bool allow_direct = true;      // false: relay every pair (tests, benchmarks)
};

struct PeerStats {
  int rank;
  std::string mode;     // "direct" | "relay" | "self"
  std::string address;  // ip:port of the other end as this peer connected it
  uint64_t bytes_sent;
  uint64_t bytes_received;
};

class Request {
 public:
  virtual ~Request() = default;
  virtual bool test() = 0;                 // progress; true when complete (raises on error)
  virtual void wait() = 0;                 // until complete or timeout (raises)
  virtual BufferPtr result() = 0;          // irecv: the message (after completion); isend: null
};
using RequestPtr = std::shared_ptr<Request>;

// Thread safety: one thread at a time may call a Communicator and its Requests (the
// core runs one background keep-alive thread of its own that only pings idle channels).
// Tags: users use tags >= 0; negative tags are reserved for the collectives (the core
// carries any tag; the Python API rejects negative ones).
class Communicator {
 public:
  static std::unique_ptr<Communicator> join(const JoinOptions& opts);
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Point to point. `data` must stay valid until the send completes (zero-copy).
  // Messages of one (source, tag) are received in the order they were sent. Raises
  // PeerLostError (naming the rank) when the peer closed or died, TimeoutError after
  // timeout_s, CommError for bad arguments or a closed communicator.
  virtual void send(const void* data, size_t len, int dest, int tag = 0) = 0;
  virtual BufferPtr recv(int source, int tag = 0) = 0;
  virtual RequestPtr isend(const void* data, size_t len, int dest, int tag = 0) = 0;
  virtual RequestPtr irecv(int source, int tag = 0) = 0;

  // Collectives over raw bytes; counts are in bytes. Every rank calls them in the same order.
  virtual void barrier() = 0;
  virtual BufferPtr bcast(const void* data, size_t len, int root) = 0;        // len ignored off-root
  virtual std::vector<BufferPtr> gatherv(const void* data, size_t len, int root) = 0;  // root: size() parts
  virtual BufferPtr scatterv(const std::vector<std::pair<const void*, size_t>>& parts, int root) = 0;
  virtual std::vector<BufferPtr> allgatherv(const void* data, size_t len) = 0;
  virtual std::vector<BufferPtr> alltoallv(const std::vector<std::pair<const void*, size_t>>& parts) = 0;
  // Element-wise reductions of `count` elements of `dtype`.
  virtual BufferPtr reduce(const void* data, size_t count, DType dtype, ReduceOp op, int root) = 0;
  virtual BufferPtr allreduce(const void* data, size_t count, DType dtype, ReduceOp op) = 0;

  virtual std::vector<PeerStats> stats() const = 0;
  virtual void close() = 0;  // idempotent; sends bye on every channel
};

// Benchmark/test helper: measures nothing itself; exposed so Python can ask the core
// for its library version.
const char* version();

}  // namespace skyfn::comm
