// Byte layouts of docs/comm.md: the 16-byte channel HELLO and the 16-byte frame header
// (kind, tag, 64-bit length), all little-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace skyfn::comm::wire {

constexpr size_t kHelloSize = 16;
constexpr size_t kHeaderSize = 16;
constexpr uint32_t kVersion = 1;

enum class Kind : uint32_t {
  Data = 0,
  Ping = 1,
  Bye = 2,
  Select = 3,  // lower rank -> higher rank, once, during join: "this channel is the pair's"
};

struct Hello {
  uint32_t version = kVersion;
  uint32_t sender = 0;
  uint32_t receiver = 0;
};

void encode_hello(const Hello& h, uint8_t out[kHelloSize]);
// Empty string when the bytes are a valid HELLO from `expect_sender` (-1: any sender other
// than `me`, below `size`) to `me`; otherwise the reason the connection is refused.
std::string check_hello(const uint8_t in[kHelloSize], int me, int size, int expect_sender, Hello* out);

struct Header {
  Kind kind = Kind::Data;
  int32_t tag = 0;
  uint64_t length = 0;
};

void encode_header(const Header& h, uint8_t out[kHeaderSize]);
// Empty string when valid (known kind, zero length for non-data frames).
std::string decode_header(const uint8_t in[kHeaderSize], Header* out);

}  // namespace skyfn::comm::wire
