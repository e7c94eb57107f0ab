// Memory behind message Buffers (BufferAllocator in communicator.hpp): small blocks come
// from malloc; blocks of 1 MiB and more are rounded up to a 1 MiB multiple and, when freed,
// kept in a small LRU cache (at most kMaxBlocks blocks and 512 MiB in total; the
// environment variable SKYFN_COMM_BUFFER_CACHE_MB changes the total, 0 disables it) so the
// next large message reuses memory that is already mapped instead of page-faulting fresh
// pages (which costs about as much as the transfer itself on loopback).
#include <cstdlib>
#include <iterator>
#include <string>
#include <list>
#include <mutex>
#include <new>
#include <unordered_map>

#include "skyfn_comm/communicator.hpp"

namespace skyfn::comm::detail {

namespace {

constexpr size_t kLarge = size_t(1) << 20;
constexpr size_t kMaxBlocks = 8;

size_t max_cached_bytes() {
  static const size_t v = [] {
    const char* env = std::getenv("SKYFN_COMM_BUFFER_CACHE_MB");
    if (env && *env) {
      try {
        return static_cast<size_t>(std::stoull(env)) << 20;
      } catch (...) {
      }
    }
    return size_t(512) << 20;
  }();
  return v;
}

struct Pool {
  std::mutex mu;
  std::list<std::pair<void*, size_t>> cached;  // most recently freed first
  size_t cached_bytes = 0;
  std::unordered_map<void*, size_t> live;      // large blocks handed out -> real size
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: buffers may outlive static destructors
  return *p;
}

}  // namespace

void* buffer_alloc(size_t bytes) {
  if (bytes < kLarge) {
    void* p = std::malloc(bytes ? bytes : 1);
    if (!p) throw std::bad_alloc();
    return p;
  }
  size_t want = (bytes + kLarge - 1) / kLarge * kLarge;
  Pool& pl = pool();
  {
    std::lock_guard<std::mutex> lk(pl.mu);
    // Reuse a cached block if it is big enough without wasting more than half of it.
    for (auto it = pl.cached.begin(); it != pl.cached.end(); ++it) {
      if (it->second >= want && it->second / 2 <= want) {
        void* p = it->first;
        size_t real = it->second;
        pl.cached_bytes -= real;
        pl.cached.erase(it);
        pl.live[p] = real;
        return p;
      }
    }
  }
  void* p = std::malloc(want);
  if (!p) throw std::bad_alloc();
  std::lock_guard<std::mutex> lk(pl.mu);
  pl.live[p] = want;
  return p;
}

void buffer_free(void* p, size_t bytes) noexcept {
  if (!p) return;
  if (bytes < kLarge) {
    std::free(p);
    return;
  }
  Pool& pl = pool();
  std::list<std::pair<void*, size_t>> evicted;
  {
    std::lock_guard<std::mutex> lk(pl.mu);
    auto it = pl.live.find(p);
    size_t real = it == pl.live.end() ? bytes : it->second;
    if (it != pl.live.end()) pl.live.erase(it);
    if (real > max_cached_bytes()) {
      std::free(p);
      return;
    }
    pl.cached.emplace_front(p, real);
    pl.cached_bytes += real;
    while (pl.cached.size() > kMaxBlocks || pl.cached_bytes > max_cached_bytes()) {
      pl.cached_bytes -= pl.cached.back().second;
      evicted.splice(evicted.end(), pl.cached, std::prev(pl.cached.end()));
    }
  }
  for (auto& b : evicted) std::free(b.first);
}

}  // namespace skyfn::comm::detail
