// Unit tests of the byte layouts (wire.cpp): HELLO validation and frame headers.
#include <gtest/gtest.h>

#include <cstring>

#include "wire.hpp"

using namespace skyfn::comm::wire;

namespace {
std::string check(const uint8_t* b, int me, int size, int expect) { return check_hello(b, me, size, expect, nullptr); }
}  // namespace

TEST(Hello, RoundTripsAndNamesThePair) {
  uint8_t b[kHelloSize];
  Hello h;
  h.sender = 3;
  h.receiver = 1;
  encode_hello(h, b);
  EXPECT_EQ(std::memcmp(b, "SKYC", 4), 0);
  EXPECT_EQ(b[4], 1);  // version, little-endian
  EXPECT_EQ(b[8], 3);
  EXPECT_EQ(b[12], 1);
  Hello out;
  EXPECT_EQ(check_hello(b, 1, 4, 3, &out), "");
  EXPECT_EQ(out.sender, 3u);
  EXPECT_EQ(check(b, 1, 4, -1), "");  // accepted connection: any valid sender
}

TEST(Hello, RejectsWrongMagicVersionAndPair) {
  uint8_t b[kHelloSize];
  Hello h;
  h.sender = 3;
  h.receiver = 1;
  encode_hello(h, b);
  uint8_t bad[kHelloSize];
  std::memcpy(bad, b, sizeof b);
  bad[0] = 'X';
  EXPECT_NE(check(bad, 1, 4, 3).find("bad magic"), std::string::npos);
  std::memcpy(bad, b, sizeof b);
  bad[4] = 2;
  EXPECT_NE(check(bad, 1, 4, 3).find("unsupported channel version 2"), std::string::npos);
  EXPECT_NE(check(b, 2, 4, 3).find("addressed to rank 1"), std::string::npos);
  EXPECT_NE(check(b, 1, 4, 2).find("expected rank 2"), std::string::npos);
  EXPECT_NE(check(b, 1, 3, -1).find("invalid rank 3"), std::string::npos);  // sender >= size
  h.sender = 1;
  encode_hello(h, b);
  EXPECT_NE(check(b, 1, 4, -1).find("invalid rank 1"), std::string::npos);  // from itself
}

TEST(Frame, HeaderCarries64BitLengthsAndNegativeTags) {
  uint8_t b[kHeaderSize];
  Header h;
  h.kind = Kind::Data;
  h.tag = -5;
  h.length = (uint64_t(5) << 32) + 7;  // > 4 GiB
  encode_header(h, b);
  EXPECT_EQ(b[0], 0);
  EXPECT_EQ(b[4], 0xFB);  // -5 as little-endian i32
  EXPECT_EQ(b[8], 7);
  EXPECT_EQ(b[12], 5);
  Header out;
  EXPECT_EQ(decode_header(b, &out), "");
  EXPECT_EQ(out.kind, Kind::Data);
  EXPECT_EQ(out.tag, -5);
  EXPECT_EQ(out.length, h.length);
}

TEST(Frame, ControlFramesHaveNoPayloadAndUnknownKindsAreRejected) {
  uint8_t b[kHeaderSize];
  for (Kind k : {Kind::Ping, Kind::Bye, Kind::Select}) {
    Header h;
    h.kind = k;
    encode_header(h, b);
    Header out;
    EXPECT_EQ(decode_header(b, &out), "");
    EXPECT_EQ(out.kind, k);
    EXPECT_EQ(out.length, 0u);
    b[8] = 1;  // a ping with a payload is a protocol error
    EXPECT_NE(decode_header(b, &out).find("with length 1"), std::string::npos);
  }
  std::memset(b, 0, sizeof b);
  b[0] = 9;
  Header out;
  EXPECT_NE(decode_header(b, &out).find("unknown frame kind 9"), std::string::npos);
}
