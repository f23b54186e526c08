// verify_by_identity on hand-made inputs: copies of an identity in several
// partitions are judged together; a second emission within the window is a
// duplicate (what deduplicating each partition on its own lets through), an
// identity never emitted is lost, and a clean output passes.

#include <gtest/gtest.h>

#include "verifier.h"

namespace kdedup::testing {
namespace {

constexpr std::int64_t kStart = 1'700'000'000'000;

InputRecord at(std::int32_t p, std::int64_t off, const std::string& id, std::int64_t ts) {
  return InputRecord{
      "in", p, off, id, kStart + ts, id, "v" + std::to_string(p) + std::to_string(off)};
}

OutputRecord emitted(std::int64_t off, const InputRecord& src) {
  OutputRecord o;
  o.offset = off;
  o.source_topic = src.topic;
  o.source_partition = src.partition;
  o.source_offset = src.offset;
  o.key = src.key;
  o.value = src.value;
  return o;
}

const VerifySpec kIdentitySpec{.window_ms = 60'000, .tick_ms = 1'000};

// "a" in partitions 0, 1 and 2 within the window; "b" twice in partition 1;
// "a" again 100 s later (past the window): two emissions of "a" expected.
std::vector<InputRecord> spread_input() {
  return {at(0, 0, "a", 0),     at(1, 0, "a", 1'000), at(2, 0, "a", 2'000),
          at(1, 1, "b", 3'000), at(1, 2, "b", 4'000), at(2, 1, "a", 100'000)};
}

TEST(IdentityVerifier, OneEmissionPerIdentityAndWindowPasses) {
  const auto i = spread_input();
  auto r =
      verify_by_identity(i, {emitted(0, i[1]), emitted(1, i[3]), emitted(2, i[5])}, kIdentitySpec);
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(r.oracle_distinct, 3u);
}

TEST(IdentityVerifier, CopiesFromOtherPartitionsAreDuplicates) {
  const auto i = spread_input();
  // Each partition deduplicated alone: "a" out of partitions 0, 1 and 2.
  auto r = verify_by_identity(
      i, {emitted(0, i[0]), emitted(1, i[1]), emitted(2, i[2]), emitted(3, i[3]), emitted(4, i[5])},
      kIdentitySpec);
  EXPECT_EQ(r.duplicated, 2u) << r.to_string();
  EXPECT_EQ(r.lost, 0u);
  EXPECT_FALSE(r.ok());
}

TEST(IdentityVerifier, AnIdentityNeverEmittedIsLostAndProvenanceIsChecked) {
  const auto i = spread_input();
  OutputRecord stranger = emitted(9, i[3]);
  stranger.source_offset = 77;
  OutputRecord altered = emitted(10, i[5]);
  altered.value = "changed";
  auto r = verify_by_identity(i, {emitted(0, i[0]), stranger, altered}, kIdentitySpec);
  EXPECT_EQ(r.lost, 3u) << "b twice, and the late a: " << r.to_string();
  EXPECT_EQ(r.unexpected, 2u);
  EXPECT_FALSE(r.ok());
}

}  // namespace
}  // namespace kdedup::testing
