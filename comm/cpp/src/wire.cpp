// Encoding and validation of HELLO and frame headers (see wire.hpp, docs/comm.md).
#include "wire.hpp"

#include <cstring>

namespace skyfn::comm::wire {

namespace {
const uint8_t kMagic[4] = {'S', 'K', 'Y', 'C'};

void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
}  // namespace

void encode_hello(const Hello& h, uint8_t out[kHelloSize]) {
  std::memcpy(out, kMagic, 4);
  put32(out + 4, h.version);
  put32(out + 8, h.sender);
  put32(out + 12, h.receiver);
}

std::string check_hello(const uint8_t in[kHelloSize], int me, int size, int expect_sender, Hello* out) {
  if (std::memcmp(in, kMagic, 4) != 0) return "bad magic (not a skyfn channel)";
  Hello h;
  h.version = get32(in + 4);
  h.sender = get32(in + 8);
  h.receiver = get32(in + 12);
  if (h.version != kVersion)
    return "unsupported channel version " + std::to_string(h.version) + " (this peer speaks " +
           std::to_string(kVersion) + ")";
  if (h.receiver != static_cast<uint32_t>(me))
    return "HELLO addressed to rank " + std::to_string(h.receiver) + ", this is rank " + std::to_string(me);
  if (h.sender >= static_cast<uint32_t>(size) || h.sender == static_cast<uint32_t>(me))
    return "HELLO from invalid rank " + std::to_string(h.sender);
  if (expect_sender >= 0 && h.sender != static_cast<uint32_t>(expect_sender))
    return "HELLO from rank " + std::to_string(h.sender) + ", expected rank " + std::to_string(expect_sender);
  if (out) *out = h;
  return "";
}

void encode_header(const Header& h, uint8_t out[kHeaderSize]) {
  put32(out, static_cast<uint32_t>(h.kind));
  put32(out + 4, static_cast<uint32_t>(h.tag));
  put64(out + 8, h.length);
}

std::string decode_header(const uint8_t in[kHeaderSize], Header* out) {
  uint32_t kind = get32(in);
  if (kind > static_cast<uint32_t>(Kind::Select)) return "unknown frame kind " + std::to_string(kind);
  out->kind = static_cast<Kind>(kind);
  out->tag = static_cast<int32_t>(get32(in + 4));
  out->length = get64(in + 8);
  if (out->kind != Kind::Data && out->length != 0)
    return "non-data frame (kind " + std::to_string(kind) + ") with length " + std::to_string(out->length);
  return "";
}

}  // namespace skyfn::comm::wire
