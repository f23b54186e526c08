#include "kdedup/common/duration.h"

#include <gtest/gtest.h>

namespace kdedup {
namespace {

TEST(Duration, ParsesEveryUnit) {
  EXPECT_EQ(*parse_duration_ms("500ms"), 500);
  EXPECT_EQ(*parse_duration_ms("30s"), 30'000);
  EXPECT_EQ(*parse_duration_ms("10m"), 600'000);
  EXPECT_EQ(*parse_duration_ms("24h"), 86'400'000);
  EXPECT_EQ(*parse_duration_ms("7d"), 604'800'000);
}

TEST(Duration, RejectsMalformedTextWithAMessageNamingIt) {
  for (const char* bad :
       {"", "10", "ms", "10x", "-5s", "0s", "1.5s", "10 s", "99999999999999999999s"}) {
    auto r = parse_duration_ms(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_NE(r.error().message.find(std::string("'") + bad + "'"), std::string::npos)
        << r.error().message;
  }
}

TEST(Duration, FormatsWithLargestExactUnit) {
  EXPECT_EQ(format_duration_ms(3'600'000), "1h");
  EXPECT_EQ(format_duration_ms(90'000), "90s");
  EXPECT_EQ(format_duration_ms(1500), "1500ms");
}

}  // namespace
}  // namespace kdedup
