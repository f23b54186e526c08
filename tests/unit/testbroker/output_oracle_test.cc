// The output oracle judging the window edge in the filters' ticks
// (VerifySpec::scale), as `kdedup demo` and the pipeline benchmark use it:
// one tick precise, at the partition clock, with false positives counted
// against what was emitted (seed 000 Definition 4), and every kind of
// violation found. The millisecond mode is tested in tests/unit/support.

#include "kdedup/testbroker/output_oracle.h"

#include <gtest/gtest.h>

namespace kdedup::testbroker {
namespace {

// tick 1 s, window 10 ticks.
VerifySpec ticks(double fpp = 0.0) {
  VerifySpec s;
  s.window_ms = 10'000;
  s.scale = filter::TickScale(10'000, 10);
  s.fpp = fpp;
  return s;
}

InputRecord in(std::int64_t offset, const std::string& id, std::int64_t ts,
               std::int32_t partition = 0) {
  return InputRecord{"clicks", partition, offset, id, ts, id, "v"};
}

OutputRecord out(std::int64_t offset, const std::string& id, std::int32_t partition = 0) {
  OutputRecord o;
  o.partition = partition;
  o.offset = offset;
  o.source_topic = "clicks";
  o.source_partition = partition;
  o.source_offset = offset;
  o.key = id;
  o.value = "v";
  return o;
}

TEST(OutputOracleTicks, ExactOutputPasses) {
  const std::vector<InputRecord> input{in(0, "a", 1000), in(1, "b", 2000), in(2, "a", 3000),
                                       in(3, "a", 20000), in(0, "a", 1000, 1)};
  auto r = verify_output(input, {out(0, "a"), out(1, "b"), out(3, "a"), out(0, "a", 1)}, ticks());
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(r.exact_distinct, 4u);
  EXPECT_EQ(r.oracle_distinct, 4u);
  EXPECT_EQ(r.emitted_sources, 4u);
  EXPECT_EQ(r.ambiguous, 0u);
}

TEST(OutputOracleTicks, WindowEdgeIsOneTickPrecise) {
  // Delivered at tick 1; alive while now - 1 <= 10, i.e. through tick 11.
  const std::vector<InputRecord> input{in(0, "a", 1500), in(1, "a", 11999), in(2, "a", 12000)};
  auto r = verify_output(input, {out(0, "a"), out(2, "a")}, ticks());
  EXPECT_TRUE(r.ok()) << r.to_string();
  EXPECT_EQ(r.exact_distinct, 2u);
  // Emitting the record at tick 11 is a duplicate that got through.
  auto early = verify_output(input, {out(0, "a"), out(1, "a"), out(2, "a")}, ticks());
  EXPECT_FALSE(early.ok());
  EXPECT_EQ(early.duplicated, 1u) << early.to_string();
}

TEST(OutputOracleTicks, ClockIsTheLargestTimestampSeen) {
  // The late record (ts 1000) is judged at the clock (tick 15): "a" from
  // tick 1 has expired, so it is new.
  const std::vector<InputRecord> input{in(0, "a", 1000), in(1, "b", 15000), in(2, "a", 1000)};
  auto r = verify_output(input, {out(0, "a"), out(1, "b"), out(2, "a")}, ticks());
  EXPECT_TRUE(r.ok()) << r.to_string();
}

TEST(OutputOracleTicks, DroppedNewRecordIsAFalsePositiveAndItsCopyIsNew) {
  // "a" dropped at offset 0 (a false positive): offset 1 is then new, and
  // emitting it is correct, not a duplicate.
  const std::vector<InputRecord> input{in(0, "a", 1000), in(1, "a", 2000)};
  auto r = verify_output(input, {out(1, "a")}, ticks(0.01));
  EXPECT_EQ(r.false_positives, 1u);
  EXPECT_EQ(r.duplicated, 0u);
  EXPECT_EQ(r.oracle_distinct, 2u);
  EXPECT_EQ(r.exact_distinct, 1u);
  EXPECT_TRUE(r.ok()) << r.to_string();  // 1 <= the bound for tiny streams
  std::vector<InputRecord> many;
  for (int i = 0; i < 40; ++i) many.push_back(in(i, "k" + std::to_string(i), 1000));
  auto over = verify_output(many, {}, ticks(0.01));
  EXPECT_EQ(over.false_positives, 40u);
  EXPECT_FALSE(over.ok());
}

TEST(OutputOracleTicks, CopiesUnknownSourcesAndWrongKeysFail) {
  const std::vector<InputRecord> input{in(0, "a", 1000)};
  auto twice = verify_output(input, {out(0, "a"), out(0, "a")}, ticks());
  EXPECT_EQ(twice.copies, 1u);
  EXPECT_EQ(twice.duplicated, 1u);
  EXPECT_EQ(twice.emitted_sources, 1u);
  EXPECT_FALSE(twice.ok());
  auto unknown = verify_output(input, {out(0, "a"), out(7, "z")}, ticks());
  EXPECT_EQ(unknown.unexpected, 1u);
  auto wrong_key = out(0, "b");
  wrong_key.key = "b";
  EXPECT_EQ(verify_output(input, {wrong_key}, ticks()).unexpected, 1u);
  OutputRecord no_provenance;
  no_provenance.key = "a";
  EXPECT_EQ(verify_output(input, {no_provenance}, ticks()).unexpected, 1u);
}

TEST(OutputOracleTicks, FalsePositiveBoundGrowsWithTheStream) {
  EXPECT_EQ(false_positive_bound(0.0, 1'000'000), 5u);
  EXPECT_GE(false_positive_bound(0.01, 100'000), 1'000u);
  EXPECT_LT(false_positive_bound(0.01, 100'000), 1'200u);
}

}  // namespace
}  // namespace kdedup::testbroker
