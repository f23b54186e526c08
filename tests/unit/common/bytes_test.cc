#include "kdedup/common/bytes.h"

#include <gtest/gtest.h>

namespace kdedup {
namespace {

TEST(Envelope, RoundTripsPayload) {
  const std::string blob = seal_envelope(7, 3, "hello");
  auto env = open_envelope(blob, "test blob");
  ASSERT_TRUE(env) << env.error().message;
  EXPECT_EQ(env->kind, 7);
  EXPECT_EQ(env->version, 3);
  EXPECT_EQ(env->payload, "hello");
}

TEST(Envelope, RejectsEveryTruncation) {
  const std::string blob = seal_envelope(1, 1, std::string(100, 'x'));
  for (std::size_t n = 0; n < blob.size(); ++n) {
    EXPECT_FALSE(open_envelope(std::string_view(blob).substr(0, n), "t")) << n;
  }
}

TEST(Envelope, RejectsEverySingleBitFlip) {
  const std::string blob = seal_envelope(1, 1, "some payload bytes");
  for (std::size_t i = 0; i < blob.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = blob;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      EXPECT_FALSE(open_envelope(bad, "t")) << i << ":" << bit;
    }
  }
}

TEST(ByteReader, ReportsWhichFieldRanShort) {
  std::string buf;
  ByteWriter w(buf);
  w.put<std::uint32_t>(5);
  ByteReader r(buf);
  EXPECT_TRUE(r.get<std::uint32_t>("first"));
  auto second = r.get<std::uint64_t>("second");
  ASSERT_FALSE(second);
  EXPECT_NE(second.error().message.find("second"), std::string::npos);
}

}  // namespace
}  // namespace kdedup
