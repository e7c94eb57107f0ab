// Collective algorithms of the skyfn communicator, written as free functions over the
// public point-to-point API (isend/irecv/wait), so every transport gets them unchanged.
//
// Every rank calls a collective in the same order with consistent arguments. Each
// collective uses its own reserved negative tag (user tags are >= 0); messages of one
// pair on one tag are matched in the order they were sent, which is what makes reusing a
// tag across steps and across consecutive calls safe. All requests of a step are posted
// before any is waited on, so ranks progress concurrently and nothing deadlocks.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "skyfn_comm/communicator.hpp"

namespace skyfn::comm {

// Reserved tags of the collectives (docs/comm.md: user tags are >= 0).
enum CollectiveTag : int {
  kTagBarrier = -1,
  kTagBcast = -2,
  kTagGather = -3,
  kTagScatter = -4,
  kTagAllgather = -5,
  kTagAlltoall = -6,
  kTagReduce = -7,
  kTagAllreduce = -8,
};

// bcast streams the message in chunks of this size down the tree; a chunk shorter than
// this (possibly empty) ends the message, so receivers need no length header.
constexpr size_t kBcastChunk = size_t(1) << 20;
// reduce/allreduce switch from latency-optimal trees (recursive doubling) to
// bandwidth-optimal rings above this many bytes.
constexpr size_t kRingThreshold = size_t(64) << 10;

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
const char* op_name(ReduceOp op);

// dst[i] = op(a[i], b[i]) for `count` elements; dst may alias a or b. Integer sum and
// product wrap around (two's complement, like numpy); float min/max propagate NaN (like
// numpy.minimum/maximum). Callers pass the lower ranks' partial result as `a` so every
// rank combines in the same order and gets bit-identical results.
void combine(void* dst, const void* a, const void* b, size_t count, DType dtype, ReduceOp op);

// Waits for every request; if one fails, still waits for the others (so no send is left
// reading caller memory after return) and then rethrows the first error.
void wait_all(std::vector<RequestPtr>& reqs);

void barrier(Communicator& c);
// Root passes data/len; other ranks' data/len are ignored. Every rank gets the message.
BufferPtr bcast(Communicator& c, const void* data, size_t len, int root);
// Root gets size() buffers (its own part copied); other ranks get an empty vector.
std::vector<BufferPtr> gatherv(Communicator& c, const void* data, size_t len, int root);
// Root passes size() parts; other ranks pass anything (ignored). Each rank gets its part.
BufferPtr scatterv(Communicator& c, const std::vector<std::pair<const void*, size_t>>& parts,
                   int root);
std::vector<BufferPtr> allgatherv(Communicator& c, const void* data, size_t len);
// parts[i] goes to rank i; result[j] came from rank j.
std::vector<BufferPtr> alltoallv(Communicator& c,
                                 const std::vector<std::pair<const void*, size_t>>& parts);
// Root gets the reduced `count` elements; other ranks get nullptr.
BufferPtr reduce(Communicator& c, const void* data, size_t count, DType dtype, ReduceOp op,
                 int root);
BufferPtr allreduce(Communicator& c, const void* data, size_t count, DType dtype, ReduceOp op);

}  // namespace skyfn::comm
