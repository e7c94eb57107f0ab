// Unit tests of the collective algorithms (collectives.cpp) and the reduction kernels.
// The algorithms are exercised over an in-process transport: n threads, one per rank,
// exchanging messages through shared mailboxes with the same ordering guarantee as the
// TCP channels (FIFO per source, destination and tag). The real transport is covered by
// tests/comm in Python; here the point is every algorithm branch for n = 1..9 quickly.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <tuple>

#include "collectives.hpp"

using namespace skyfn::comm;

namespace {

struct Mailboxes {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::tuple<int, int, int>, std::deque<BufferPtr>> boxes;  // (src, dst, tag)
};

class MailboxRecv : public Request {
 public:
  MailboxRecv(Mailboxes& m, int src, int dst, int tag) : m_(m), key_(src, dst, tag) {}
  bool test() override {
    std::lock_guard<std::mutex> lk(m_.mu);
    return pop_locked();
  }
  void wait() override {
    std::unique_lock<std::mutex> lk(m_.mu);
    if (!m_.cv.wait_for(lk, std::chrono::seconds(20), [&] { return pop_locked(); })) {
      throw TimeoutError("in-process recv timed out");
    }
  }
  BufferPtr result() override { return got_; }

 private:
  bool pop_locked() {
    if (got_) return true;
    auto& q = m_.boxes[key_];
    if (q.empty()) return false;
    got_ = q.front();
    q.pop_front();
    return true;
  }
  Mailboxes& m_;
  std::tuple<int, int, int> key_;
  BufferPtr got_;
};

class DoneSend : public Request {
 public:
  bool test() override { return true; }
  void wait() override {}
  BufferPtr result() override { return nullptr; }
};

class InProcessComm : public Communicator {
 public:
  InProcessComm(Mailboxes& m, int rank, int size) : m_(m), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void send(const void* data, size_t len, int dest, int tag) override { isend(data, len, dest, tag); }
  BufferPtr recv(int source, int tag) override {
    auto r = irecv(source, tag);
    r->wait();
    return r->result();
  }
  RequestPtr isend(const void* data, size_t len, int dest, int tag) override {
    auto b = std::make_shared<Buffer>();
    b->data.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + len);
    {
      std::lock_guard<std::mutex> lk(m_.mu);
      m_.boxes[{rank_, dest, tag}].push_back(b);
      bytes_sent += len;
    }
    m_.cv.notify_all();
    return std::make_shared<DoneSend>();
  }
  RequestPtr irecv(int source, int tag) override {
    return std::make_shared<MailboxRecv>(m_, source, rank_, tag);
  }
  void barrier() override { skyfn::comm::barrier(*this); }
  BufferPtr bcast(const void* d, size_t l, int root) override { return skyfn::comm::bcast(*this, d, l, root); }
  std::vector<BufferPtr> gatherv(const void* d, size_t l, int root) override {
    return skyfn::comm::gatherv(*this, d, l, root);
  }
  BufferPtr scatterv(const std::vector<std::pair<const void*, size_t>>& p, int root) override {
    return skyfn::comm::scatterv(*this, p, root);
  }
  std::vector<BufferPtr> allgatherv(const void* d, size_t l) override {
    return skyfn::comm::allgatherv(*this, d, l);
  }
  std::vector<BufferPtr> alltoallv(const std::vector<std::pair<const void*, size_t>>& p) override {
    return skyfn::comm::alltoallv(*this, p);
  }
  BufferPtr reduce(const void* d, size_t n, DType t, ReduceOp o, int root) override {
    return skyfn::comm::reduce(*this, d, n, t, o, root);
  }
  BufferPtr allreduce(const void* d, size_t n, DType t, ReduceOp o) override {
    return skyfn::comm::allreduce(*this, d, n, t, o);
  }
  std::vector<PeerStats> stats() const override { return {}; }
  void close() override {}
  size_t bytes_sent = 0;

 private:
  Mailboxes& m_;
  int rank_, size_;
};

// Runs fn(comm) on n threads; rethrows the first failure.
void run_ranks(int n, const std::function<void(InProcessComm&)>& fn) {
  Mailboxes m;
  std::vector<std::unique_ptr<InProcessComm>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(std::make_unique<InProcessComm>(m, r, n));
  std::vector<std::exception_ptr> errs(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      try {
        fn(*comms[r]);
      } catch (...) {
        errs[r] = std::current_exception();
      }
    });
  }
  for (auto& t : ts) t.join();
  for (auto& e : errs) {
    if (e) std::rethrow_exception(e);
  }
  // Nothing may be left undelivered: every message of a collective is consumed by it.
  for (auto& [key, q] : m.boxes) {
    EXPECT_TRUE(q.empty()) << "undelivered message src=" << std::get<0>(key)
                           << " dst=" << std::get<1>(key) << " tag=" << std::get<2>(key);
  }
}

std::vector<uint8_t> pattern(int rank, size_t len, int salt = 0) {
  std::vector<uint8_t> v(len);
  for (size_t i = 0; i < len; ++i) v[i] = static_cast<uint8_t>(rank * 31 + i * 7 + salt);
  return v;
}

std::vector<uint8_t> bytes_of(const BufferPtr& b) { return b->data; }

size_t uneven(int rank) { return static_cast<size_t>(rank) * 1000 + (rank % 2 ? 0 : 17); }

const int kSizes[] = {1, 2, 3, 4, 5, 7, 8, 9};

}  // namespace

// ---- kernels ----

TEST(Combine, IntegerSumAndProdWrapLikeNumpy) {
  int32_t a[2] = {std::numeric_limits<int32_t>::max(), -7};
  int32_t b[2] = {1, 3};
  int32_t out[2];
  combine(out, a, b, 2, DType::Int32, ReduceOp::Sum);
  EXPECT_EQ(out[0], std::numeric_limits<int32_t>::min());
  EXPECT_EQ(out[1], -4);
  int64_t x[1] = {std::numeric_limits<int64_t>::max()}, y[1] = {2}, z[1];
  combine(z, x, y, 1, DType::Int64, ReduceOp::Prod);
  EXPECT_EQ(z[0], -2);
}

TEST(Combine, FloatMinMaxPropagateNan) {
  const double nan = std::nan("");
  double a[3] = {1.0, nan, 5.0}, b[3] = {nan, 2.0, -1.0}, out[3];
  combine(out, a, b, 3, DType::Float64, ReduceOp::Min);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_EQ(out[2], -1.0);
  combine(out, a, b, 3, DType::Float64, ReduceOp::Max);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[1]));
  EXPECT_EQ(out[2], 5.0);
}

TEST(Combine, InPlaceAliasing) {
  float a[4] = {1, 2, 3, 4}, b[4] = {10, 20, 30, 40};
  combine(a, a, b, 4, DType::Float32, ReduceOp::Sum);
  EXPECT_EQ(a[3], 44.0f);
  combine(b, a, b, 4, DType::Float32, ReduceOp::Prod);
  EXPECT_EQ(b[0], 110.0f);
}

TEST(Combine, DtypeSizes) {
  EXPECT_EQ(dtype_size(DType::Int32), 4u);
  EXPECT_EQ(dtype_size(DType::Int64), 8u);
  EXPECT_EQ(dtype_size(DType::Float32), 4u);
  EXPECT_EQ(dtype_size(DType::Float64), 8u);
  EXPECT_THROW(dtype_size(static_cast<DType>(9)), std::invalid_argument);
}

// ---- collectives ----

TEST(Collectives, Barrier) {
  for (int n : kSizes) {
    run_ranks(n, [](InProcessComm& c) {
      for (int i = 0; i < 3; ++i) c.barrier();
    });
  }
}

TEST(Collectives, BcastSmallEmptyAndMultiChunk) {
  const size_t lens[] = {0, 1, 1000, kBcastChunk, 2 * kBcastChunk + 3};
  for (int n : kSizes) {
    for (size_t len : lens) {
      int root = n / 2;
      run_ranks(n, [&](InProcessComm& c) {
        auto msg = pattern(root, len);
        auto got = c.rank() == root ? c.bcast(msg.data(), msg.size(), root) : c.bcast(nullptr, 0, root);
        EXPECT_EQ(bytes_of(got), msg) << "n=" << n << " len=" << len;
      });
    }
  }
}

TEST(Collectives, GathervUneven) {
  for (int n : kSizes) {
    run_ranks(n, [&](InProcessComm& c) {
      auto mine = pattern(c.rank(), uneven(c.rank()));
      auto got = c.gatherv(mine.data(), mine.size(), n - 1);
      if (c.rank() != n - 1) {
        EXPECT_TRUE(got.empty());
        return;
      }
      ASSERT_EQ(got.size(), static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) EXPECT_EQ(bytes_of(got[i]), pattern(i, uneven(i)));
    });
  }
}

TEST(Collectives, ScattervUneven) {
  for (int n : kSizes) {
    run_ranks(n, [&](InProcessComm& c) {
      std::vector<std::vector<uint8_t>> parts;
      std::vector<std::pair<const void*, size_t>> views;
      for (int i = 0; i < n; ++i) parts.push_back(pattern(i, uneven(i), 5));
      for (auto& p : parts) views.emplace_back(p.data(), p.size());
      auto got = c.scatterv(c.rank() == 0 ? views : std::vector<std::pair<const void*, size_t>>{}, 0);
      EXPECT_EQ(bytes_of(got), pattern(c.rank(), uneven(c.rank()), 5));
    });
  }
}

TEST(Collectives, ScattervRootNeedsOnePartPerRank) {
  run_ranks(1, [](InProcessComm& c) {
    EXPECT_THROW(c.scatterv({}, 0), std::invalid_argument);
    EXPECT_THROW(c.bcast(nullptr, 0, 1), std::invalid_argument);
  });
}

TEST(Collectives, AllgathervUneven) {
  for (int n : kSizes) {
    run_ranks(n, [&](InProcessComm& c) {
      auto mine = pattern(c.rank(), uneven(c.rank()));
      auto got = c.allgatherv(mine.data(), mine.size());
      ASSERT_EQ(got.size(), static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) EXPECT_EQ(bytes_of(got[i]), pattern(i, uneven(i)));
    });
  }
}

TEST(Collectives, AlltoallvUnevenAndEmpty) {
  for (int n : kSizes) {
    run_ranks(n, [&](InProcessComm& c) {
      // rank r sends (r + d) % 3 * 100 bytes to d: some parts are empty.
      std::vector<std::vector<uint8_t>> parts;
      std::vector<std::pair<const void*, size_t>> views;
      for (int d = 0; d < n; ++d) parts.push_back(pattern(c.rank() * 100 + d, (c.rank() + d) % 3 * 100));
      for (auto& p : parts) views.emplace_back(p.data(), p.size());
      auto got = c.alltoallv(views);
      ASSERT_EQ(got.size(), static_cast<size_t>(n));
      for (int s = 0; s < n; ++s) {
        EXPECT_EQ(bytes_of(got[s]), pattern(s * 100 + c.rank(), (s + c.rank()) % 3 * 100));
      }
    });
  }
}

namespace {

template <typename T>
std::vector<T> contribution(int rank, size_t count) {
  std::vector<T> v(count);
  // Values in {-2, -1, 1, 2}: sums and products of 8 ranks stay exact in every dtype,
  // so results can be compared bit for bit whatever order the algorithm combined them in.
  static const int kVals[4] = {-2, -1, 1, 2};
  for (size_t i = 0; i < count; ++i) v[i] = static_cast<T>(kVals[(rank * 3 + i) % 4]);
  return v;
}

template <typename T>
std::vector<T> expected(int n, size_t count, ReduceOp op) {
  std::vector<T> acc = contribution<T>(0, count);
  for (int r = 1; r < n; ++r) {
    auto v = contribution<T>(r, count);
    for (size_t i = 0; i < count; ++i) {
      switch (op) {
        case ReduceOp::Sum: acc[i] += v[i]; break;
        case ReduceOp::Prod: acc[i] *= v[i]; break;
        case ReduceOp::Min: acc[i] = std::min(acc[i], v[i]); break;
        case ReduceOp::Max: acc[i] = std::max(acc[i], v[i]); break;
      }
    }
  }
  return acc;
}

template <typename T>
void check_reductions(DType dt) {
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max, ReduceOp::Prod};
  // 0, below n, small (recursive doubling / tree) and above kRingThreshold (rings).
  const size_t counts[] = {0, 3, 1000, kRingThreshold / sizeof(T) * 2 + 5};
  for (int n : {1, 2, 3, 5, 8}) {
    for (size_t count : counts) {
      for (ReduceOp op : ops) {
        auto want = expected<T>(n, count, op);
        run_ranks(n, [&](InProcessComm& c) {
          auto mine = contribution<T>(c.rank(), count);
          auto all = c.allreduce(mine.data(), count, dt, op);
          ASSERT_EQ(all->size(), count * sizeof(T));
          EXPECT_EQ(0, std::memcmp(all->data.data(), want.data(), count * sizeof(T)))
              << "allreduce n=" << n << " count=" << count << " op=" << op_name(op);
          int root = n - 1;
          auto red = c.reduce(mine.data(), count, dt, op, root);
          if (c.rank() != root) {
            EXPECT_EQ(red, nullptr);
            return;
          }
          ASSERT_EQ(red->size(), count * sizeof(T));
          EXPECT_EQ(0, std::memcmp(red->data.data(), want.data(), count * sizeof(T)))
              << "reduce n=" << n << " count=" << count << " op=" << op_name(op);
        });
      }
    }
  }
}

}  // namespace

TEST(Collectives, ReduceAllreduceInt32) { check_reductions<int32_t>(DType::Int32); }
TEST(Collectives, ReduceAllreduceInt64) { check_reductions<int64_t>(DType::Int64); }
TEST(Collectives, ReduceAllreduceFloat32) { check_reductions<float>(DType::Float32); }
TEST(Collectives, ReduceAllreduceFloat64) { check_reductions<double>(DType::Float64); }

TEST(Collectives, AllreduceIsBitIdenticalOnEveryRank) {
  // Float sums depend on order; every rank must still end with the same bytes.
  for (int n : {3, 6, 7}) {
    for (size_t count : {size_t(100), kRingThreshold}) {
      std::vector<std::vector<uint8_t>> results(n);
      run_ranks(n, [&](InProcessComm& c) {
        std::vector<float> v(count);
        for (size_t i = 0; i < count; ++i) v[i] = 1.0f / static_cast<float>(c.rank() * 13 + i + 1) * 1e7f;
        results[c.rank()] = c.allreduce(v.data(), count, DType::Float32, ReduceOp::Sum)->data;
      });
      for (int r = 1; r < n; ++r) EXPECT_EQ(results[r], results[0]) << "n=" << n << " rank " << r;
    }
  }
}

TEST(Collectives, MismatchedCountIsAClearError) {
  try {
    run_ranks(2, [](InProcessComm& c) {
      std::vector<int32_t> v(c.rank() == 0 ? 4 : 8, 1);
      c.allreduce(v.data(), v.size(), DType::Int32, ReduceOp::Sum);
    });
    FAIL() << "mismatched counts were accepted";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("same element count"), std::string::npos) << e.what();
  }
}
