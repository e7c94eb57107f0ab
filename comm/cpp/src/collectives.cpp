// Collective algorithms over the point-to-point API (see collectives.hpp):
//   barrier     dissemination (ceil(log2 n) rounds of empty messages)
//   bcast       binomial tree, pipelined in 1 MiB chunks (large messages stream down);
//               root sends whole messages to its leaf children (nothing to pipeline)
//   gatherv     direct to root, all receives posted at once
//   scatterv    direct from root, all sends posted at once
//   allgatherv  pairwise exchange, all n-1 pairs in flight at once
//   alltoallv   pairwise exchange, all n-1 pairs in flight at once
//   reduce      binomial tree (small) | ring reduce-scatter + gather to root (large)
//   allreduce   recursive doubling (small) | ring reduce-scatter + ring allgather (large)
#include "collectives.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace skyfn::comm {

namespace {

// A valid address for zero-length sends.
const uint8_t kEmpty[1] = {0};

BufferPtr copy_buffer(const void* data, size_t len) {
  auto b = std::make_shared<Buffer>();
  if (len) b->data.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + len);
  return b;
}

const void* ptr_or_empty(const void* p, size_t len) { return (len && p) ? p : kEmpty; }

void check_rank(const Communicator& c, int rank, const char* what, const char* op) {
  if (rank < 0 || rank >= c.size()) {
    throw std::invalid_argument(std::string(op) + ": " + what + " " + std::to_string(rank) +
                                " is out of range: ranks are 0.." + std::to_string(c.size() - 1));
  }
}

// On an error path: let in-flight sends finish (they read caller memory), ignoring errors.
void drain(std::vector<RequestPtr>& reqs) noexcept {
  for (auto& r : reqs) {
    try {
      if (r) r->wait();
    } catch (...) {
    }
  }
}

BufferPtr take(RequestPtr& r) {
  r->wait();
  BufferPtr b = r->result();
  if (!b) throw CommError("receive completed without a message (transport bug)");
  return b;
}

void expect_size(const BufferPtr& b, size_t want, int from, const char* op) {
  if (b->size() != want) {
    throw CommError(std::string(op) + ": rank " + std::to_string(from) + " sent " +
                    std::to_string(b->size()) + " bytes where " + std::to_string(want) +
                    " were expected: every rank must pass the same element count and dtype");
  }
}

// ---- element-wise kernels ----

template <typename T>
struct Wrap {  // two's-complement wrap-around for signed integers (signed overflow is UB)
  using U = std::make_unsigned_t<T>;
  static T add(T a, T b) { return static_cast<T>(static_cast<U>(a) + static_cast<U>(b)); }
  static T mul(T a, T b) { return static_cast<T>(static_cast<U>(a) * static_cast<U>(b)); }
};

template <typename T>
void kernel(T* dst, const T* a, const T* b, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      if constexpr (std::is_integral_v<T>) {
        for (size_t i = 0; i < n; ++i) dst[i] = Wrap<T>::add(a[i], b[i]);
      } else {
        for (size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
      }
      return;
    case ReduceOp::Prod:
      if constexpr (std::is_integral_v<T>) {
        for (size_t i = 0; i < n; ++i) dst[i] = Wrap<T>::mul(a[i], b[i]);
      } else {
        for (size_t i = 0; i < n; ++i) dst[i] = a[i] * b[i];
      }
      return;
    case ReduceOp::Min:
      if constexpr (std::is_floating_point_v<T>) {
        for (size_t i = 0; i < n; ++i) {
          T x = a[i], y = b[i];
          dst[i] = std::isnan(x) ? x : (std::isnan(y) ? y : (y < x ? y : x));
        }
      } else {
        for (size_t i = 0; i < n; ++i) dst[i] = b[i] < a[i] ? b[i] : a[i];
      }
      return;
    case ReduceOp::Max:
      if constexpr (std::is_floating_point_v<T>) {
        for (size_t i = 0; i < n; ++i) {
          T x = a[i], y = b[i];
          dst[i] = std::isnan(x) ? x : (std::isnan(y) ? y : (y > x ? y : x));
        }
      } else {
        for (size_t i = 0; i < n; ++i) dst[i] = b[i] > a[i] ? b[i] : a[i];
      }
      return;
  }
  throw std::invalid_argument("unknown reduce op " + std::to_string(static_cast<int>(op)));
}

// Block i of a ring over `count` elements split into n nearly equal blocks.
struct Blocks {
  size_t count;
  int n;
  size_t begin(int i) const {
    size_t q = count / n, r = count % n;
    return q * i + std::min<size_t>(i, r);
  }
  size_t len(int i) const { return count / n + (static_cast<size_t>(i) < count % n ? 1 : 0); }
};

// One step of a ring or of recursive doubling: send `len` bytes at `data` to `dest` while
// receiving from `source`. The send has completed when this returns: callers overwrite
// the memory it reads next.
BufferPtr sendrecv(Communicator& c, const void* data, size_t len, int dest, int source, int tag) {
  std::vector<RequestPtr> reqs{c.isend(data, len, dest, tag)};
  RequestPtr rr = c.irecv(source, tag);
  BufferPtr in;
  try {
    in = take(rr);
  } catch (...) {
    drain(reqs);
    throw;
  }
  wait_all(reqs);
  return in;
}

int mod(int a, int n) { return ((a % n) + n) % n; }

// Ring reduce-scatter on acc (count elements): afterwards rank r holds the fully reduced
// block (r + 1) mod n. Every block is reduced along the ring in the same order.
void ring_reduce_scatter(Communicator& c, uint8_t* acc, const Blocks& bl, DType dt, ReduceOp op,
                         int tag, const char* name) {
  const int n = c.size(), r = c.rank();
  const size_t esz = dtype_size(dt);
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  for (int s = 0; s < n - 1; ++s) {
    int sb = mod(r - s, n), rb = mod(r - s - 1, n);
    BufferPtr in = sendrecv(c, ptr_or_empty(acc + bl.begin(sb) * esz, bl.len(sb)), bl.len(sb) * esz, right,
                            left, tag);
    expect_size(in, bl.len(rb) * esz, left, name);
    uint8_t* blk = acc + bl.begin(rb) * esz;
    // The left neighbour's partial covers lower ring positions of this block: it goes first.
    combine(blk, in->data.data(), blk, bl.len(rb), dt, op);
  }
}

}  // namespace

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::Int32: return 4;
    case DType::Int64: return 8;
    case DType::Float32: return 4;
    case DType::Float64: return 8;
  }
  throw std::invalid_argument("unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
  }
  return "unknown";
}

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
    case ReduceOp::Prod: return "prod";
  }
  return "unknown";
}

void combine(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::Int32:
      return kernel(static_cast<int32_t*>(dst), static_cast<const int32_t*>(a),
                    static_cast<const int32_t*>(b), count, op);
    case DType::Int64:
      return kernel(static_cast<int64_t*>(dst), static_cast<const int64_t*>(a),
                    static_cast<const int64_t*>(b), count, op);
    case DType::Float32:
      return kernel(static_cast<float*>(dst), static_cast<const float*>(a),
                    static_cast<const float*>(b), count, op);
    case DType::Float64:
      return kernel(static_cast<double*>(dst), static_cast<const double*>(a),
                    static_cast<const double*>(b), count, op);
  }
  throw std::invalid_argument("unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

void wait_all(std::vector<RequestPtr>& reqs) {
  std::exception_ptr first;
  for (auto& r : reqs) {
    if (!r) continue;
    try {
      r->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

// ---------------------------------------------------------------- barrier

void barrier(Communicator& c) {
  const int n = c.size(), r = c.rank();
  for (int k = 1; k < n; k <<= 1) {
    std::vector<RequestPtr> reqs{c.isend(kEmpty, 0, mod(r + k, n), kTagBarrier)};
    RequestPtr rr = c.irecv(mod(r - k, n), kTagBarrier);
    try {
      rr->wait();
    } catch (...) {
      drain(reqs);
      throw;
    }
    wait_all(reqs);
  }
}

// ---------------------------------------------------------------- bcast

BufferPtr bcast(Communicator& c, const void* data, size_t len, int root) {
  check_rank(c, root, "root", "bcast");
  const int n = c.size(), r = c.rank();
  const int vr = mod(r - root, n);
  // Binomial tree on ranks relative to root: the parent clears vr's lowest set bit.
  int mask = 1, parent = -1;
  while (mask < n) {
    if (vr & mask) {
      parent = mod(vr - mask + root, n);
      break;
    }
    mask <<= 1;
  }
  // A child vr+m has children of its own unless m == 1 or vr+m is the last rank.
  auto is_leaf = [n](int child_vr, int m) { return m == 1 || child_vr + 1 >= n; };
  std::vector<int> children;       // forward chunks to these (they forward further)
  std::vector<int> root_leaves;    // root only: leaves get the message whole, in one frame
  for (int m = mask >> 1; m > 0; m >>= 1) {
    if (vr + m >= n) continue;
    int child = mod(vr + m + root, n);
    if (parent < 0 && is_leaf(vr + m, m)) {
      root_leaves.push_back(child);
    } else {
      children.push_back(child);
    }
  }

  std::vector<RequestPtr> sends;
  if (parent < 0) {  // root: stream chunks to subtrees, whole to leaves, then keep a copy
    const auto* p = static_cast<const uint8_t*>(ptr_or_empty(data, len));
    try {
      for (int leaf : root_leaves) sends.push_back(c.isend(p, len, leaf, kTagBcast));
      for (size_t off = 0; !children.empty(); off += kBcastChunk) {
        size_t clen = std::min(kBcastChunk, len - off);
        for (int ch : children) sends.push_back(c.isend(p + off, clen, ch, kTagBcast));
        if (clen < kBcastChunk) break;
      }
    } catch (...) {
      drain(sends);
      throw;
    }
    wait_all(sends);
    return copy_buffer(data, len);
  }

  if (children.empty() && parent == root) {  // a leaf under root: one whole message
    RequestPtr rr = c.irecv(parent, kTagBcast);
    return take(rr);
  }
  std::vector<BufferPtr> chunks;
  try {
    for (;;) {
      RequestPtr rr = c.irecv(parent, kTagBcast);
      BufferPtr chunk = take(rr);
      if (chunk->size() > kBcastChunk) {
        throw CommError("bcast: rank " + std::to_string(parent) + " sent a " +
                        std::to_string(chunk->size()) + "-byte chunk (protocol mismatch)");
      }
      chunks.push_back(chunk);
      for (int ch : children) {
        sends.push_back(c.isend(ptr_or_empty(chunk->data.data(), chunk->size()), chunk->size(), ch,
                                kTagBcast));
      }
      if (chunk->size() < kBcastChunk) break;
    }
  } catch (...) {
    drain(sends);
    throw;
  }
  wait_all(sends);
  if (chunks.size() == 1) return chunks[0];
  size_t total = 0;
  for (auto& ch : chunks) total += ch->size();
  auto out = std::make_shared<Buffer>();
  out->data.resize(total);
  size_t off = 0;
  for (auto& ch : chunks) {
    if (ch->size()) std::memcpy(out->data.data() + off, ch->data.data(), ch->size());
    off += ch->size();
    ch.reset();  // free each chunk as soon as it is copied (peak stays near 2x the message)
  }
  return out;
}

// ---------------------------------------------------------------- gatherv / scatterv

std::vector<BufferPtr> gatherv(Communicator& c, const void* data, size_t len, int root) {
  check_rank(c, root, "root", "gatherv");
  const int n = c.size(), r = c.rank();
  if (r != root) {
    std::vector<RequestPtr> reqs{c.isend(ptr_or_empty(data, len), len, root, kTagGather)};
    wait_all(reqs);
    return {};
  }
  std::vector<RequestPtr> recvs(n);
  for (int i = 0; i < n; ++i) {
    if (i != root) recvs[i] = c.irecv(i, kTagGather);
  }
  std::vector<BufferPtr> out(n);
  out[root] = copy_buffer(data, len);
  for (int i = 0; i < n; ++i) {
    if (i != root) out[i] = take(recvs[i]);
  }
  return out;
}

BufferPtr scatterv(Communicator& c, const std::vector<std::pair<const void*, size_t>>& parts,
                   int root) {
  check_rank(c, root, "root", "scatterv");
  const int n = c.size(), r = c.rank();
  if (r != root) {
    RequestPtr rr = c.irecv(root, kTagScatter);
    return take(rr);
  }
  if (parts.size() != static_cast<size_t>(n)) {
    throw std::invalid_argument("scatterv: root must pass one part per rank (" +
                                std::to_string(n) + "), got " + std::to_string(parts.size()));
  }
  std::vector<RequestPtr> sends;
  try {
    for (int s = 1; s < n; ++s) {
      int i = mod(root + s, n);
      sends.push_back(c.isend(ptr_or_empty(parts[i].first, parts[i].second), parts[i].second, i,
                              kTagScatter));
    }
  } catch (...) {
    drain(sends);
    throw;
  }
  wait_all(sends);
  return copy_buffer(parts[root].first, parts[root].second);
}

// ---------------------------------------------------------------- allgatherv / alltoallv

namespace {

// Pairwise exchange: in "step" s a rank sends to r+s and receives from r-s; all n-1 steps
// are posted at once so every pair's transfer runs concurrently.
std::vector<BufferPtr> exchange(Communicator& c,
                                const std::vector<std::pair<const void*, size_t>>& parts,
                                int tag) {
  const int n = c.size(), r = c.rank();
  std::vector<RequestPtr> sends, recvs(n);
  std::vector<BufferPtr> out(n);
  try {
    for (int s = 1; s < n; ++s) {
      int src = mod(r - s, n);
      recvs[src] = c.irecv(src, tag);
    }
    for (int s = 1; s < n; ++s) {
      int dst = mod(r + s, n);
      sends.push_back(c.isend(ptr_or_empty(parts[dst].first, parts[dst].second),
                              parts[dst].second, dst, tag));
    }
    out[r] = copy_buffer(parts[r].first, parts[r].second);
    for (int s = 1; s < n; ++s) {
      int src = mod(r - s, n);
      out[src] = take(recvs[src]);
    }
  } catch (...) {
    drain(sends);
    throw;
  }
  wait_all(sends);
  return out;
}

}  // namespace

std::vector<BufferPtr> allgatherv(Communicator& c, const void* data, size_t len) {
  std::vector<std::pair<const void*, size_t>> parts(c.size(), {data, len});
  return exchange(c, parts, kTagAllgather);
}

std::vector<BufferPtr> alltoallv(Communicator& c,
                                 const std::vector<std::pair<const void*, size_t>>& parts) {
  if (parts.size() != static_cast<size_t>(c.size())) {
    throw std::invalid_argument("alltoallv: pass one part per rank (" + std::to_string(c.size()) +
                                "), got " + std::to_string(parts.size()));
  }
  return exchange(c, parts, kTagAlltoall);
}

// ---------------------------------------------------------------- reduce / allreduce

BufferPtr reduce(Communicator& c, const void* data, size_t count, DType dt, ReduceOp op,
                 int root) {
  check_rank(c, root, "root", "reduce");
  const int n = c.size(), r = c.rank();
  const size_t esz = dtype_size(dt), nbytes = count * esz;
  BufferPtr acc = copy_buffer(data, nbytes);
  if (n == 1 || count == 0) return r == root ? acc : nullptr;

  if (nbytes <= kRingThreshold || count < static_cast<size_t>(n)) {
    // Binomial tree towards root on relative ranks; a child's subtree holds higher
    // relative ranks, so the local partial goes first.
    const int vr = mod(r - root, n);
    for (int mask = 1; mask < n; mask <<= 1) {
      if (vr & mask) {
        std::vector<RequestPtr> reqs{
            c.isend(ptr_or_empty(acc->data.data(), nbytes), nbytes, mod(vr - mask + root, n),
                    kTagReduce)};
        wait_all(reqs);
        return nullptr;
      }
      if (vr + mask < n) {
        int child = mod(vr + mask + root, n);
        RequestPtr rr = c.irecv(child, kTagReduce);
        BufferPtr in = take(rr);
        expect_size(in, nbytes, child, "reduce");
        combine(acc->data.data(), acc->data.data(), in->data.data(), count, dt, op);
      }
    }
    return acc;
  }

  // Large: ring reduce-scatter, then every rank sends its finished block to root.
  Blocks bl{count, n};
  ring_reduce_scatter(c, acc->data.data(), bl, dt, op, kTagReduce, "reduce");
  const int mine = mod(r + 1, n);
  if (r != root) {
    std::vector<RequestPtr> reqs{c.isend(ptr_or_empty(acc->data.data() + bl.begin(mine) * esz,
                                                      bl.len(mine)),
                                         bl.len(mine) * esz, root, kTagReduce)};
    wait_all(reqs);
    return nullptr;
  }
  std::vector<RequestPtr> recvs(n);
  for (int i = 0; i < n; ++i) {
    if (i != root) recvs[i] = c.irecv(i, kTagReduce);
  }
  for (int i = 0; i < n; ++i) {
    if (i == root) continue;
    BufferPtr in = take(recvs[i]);
    int blk = mod(i + 1, n);
    expect_size(in, bl.len(blk) * esz, i, "reduce");
    if (in->size()) std::memcpy(acc->data.data() + bl.begin(blk) * esz, in->data.data(), in->size());
  }
  return acc;
}

BufferPtr allreduce(Communicator& c, const void* data, size_t count, DType dt, ReduceOp op) {
  const int n = c.size(), r = c.rank();
  const size_t esz = dtype_size(dt), nbytes = count * esz;
  BufferPtr acc = copy_buffer(data, nbytes);
  if (n == 1 || count == 0) return acc;
  uint8_t* a = acc->data.data();

  if (nbytes <= kRingThreshold || count < static_cast<size_t>(n)) {
    // Recursive doubling over the largest power of two p <= n; the first 2*rem ranks
    // pair up first (even folds into odd) and get the result back at the end.
    int p = 1;
    while (p * 2 <= n) p *= 2;
    const int rem = n - p;
    int newr;
    if (r < 2 * rem) {
      if (r % 2 == 0) {
        std::vector<RequestPtr> reqs{c.isend(a, nbytes, r + 1, kTagAllreduce)};
        wait_all(reqs);
        RequestPtr rr = c.irecv(r + 1, kTagAllreduce);
        BufferPtr res = take(rr);
        expect_size(res, nbytes, r + 1, "allreduce");
        return res;
      }
      RequestPtr rr = c.irecv(r - 1, kTagAllreduce);
      BufferPtr in = take(rr);
      expect_size(in, nbytes, r - 1, "allreduce");
      combine(a, in->data.data(), a, count, dt, op);
      newr = r / 2;
    } else {
      newr = r - rem;
    }
    for (int mask = 1; mask < p; mask <<= 1) {
      int pnew = newr ^ mask;
      int partner = pnew < rem ? pnew * 2 + 1 : pnew + rem;
      BufferPtr in = sendrecv(c, a, nbytes, partner, partner, kTagAllreduce);
      expect_size(in, nbytes, partner, "allreduce");
      if (pnew < newr) {
        combine(a, in->data.data(), a, count, dt, op);
      } else {
        combine(a, a, in->data.data(), count, dt, op);
      }
    }
    if (r < 2 * rem) {  // odd rank of a folded pair: hand the result back
      std::vector<RequestPtr> reqs{c.isend(a, nbytes, r - 1, kTagAllreduce)};
      wait_all(reqs);
    }
    return acc;
  }

  // Large: ring reduce-scatter, then ring allgather of the finished blocks.
  Blocks bl{count, n};
  ring_reduce_scatter(c, a, bl, dt, op, kTagAllreduce, "allreduce");
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  for (int s = 0; s < n - 1; ++s) {
    int sb = mod(r + 1 - s, n), rb = mod(r - s, n);
    BufferPtr in = sendrecv(c, ptr_or_empty(a + bl.begin(sb) * esz, bl.len(sb)), bl.len(sb) * esz, right,
                            left, kTagAllreduce);
    expect_size(in, bl.len(rb) * esz, left, "allreduce");
    if (in->size()) std::memcpy(a + bl.begin(rb) * esz, in->data.data(), in->size());
  }
  return acc;
}

}  // namespace skyfn::comm
