// The demo's verifier and stream generator: the audit finds every kind of
// violation, honours the window and tick rules, and the click stream is
// reproducible and full of duplicates.

#include "kdedup/testbroker/dedup_audit.h"

#include <map>
#include <set>

#include <gtest/gtest.h>

#include "kdedup/testbroker/click_stream.h"

namespace kdedup::testbroker {
namespace {

// tick 1 s, window 10 ticks.
const AuditRules kRules{.scale = filter::TickScale(10'000, 10), .fpp = 0.0};

AuditInput in(std::int64_t offset, std::string id, std::int64_t ts, std::int32_t partition = 0) {
  return AuditInput{partition, offset, std::move(id), ts};
}
AuditOutput out(std::int64_t offset, std::string id, std::int32_t partition = 0) {
  return AuditOutput{partition, offset, std::move(id)};
}

TEST(DedupAudit, ExactOutputPasses) {
  std::vector<AuditInput> inputs{in(0, "a", 1000), in(1, "b", 2000), in(2, "a", 3000),
                                 in(3, "a", 20000), in(0, "a", 1000, 1)};
  auto r = audit_dedup(inputs, {out(0, "a"), out(1, "b"), out(3, "a"), out(0, "a", 1)}, kRules);
  EXPECT_TRUE(r.ok()) << (r.problems.empty() ? "" : r.problems[0]);
  EXPECT_EQ(r.exact_distinct, 4u);
  EXPECT_EQ(r.new_candidates, 4u);
  EXPECT_EQ(r.false_positives, 0u);
}

TEST(DedupAudit, WindowBoundaryIsOneTickPrecise) {
  // Delivered at tick 1; alive while now - 1 <= 10, i.e. through tick 11.
  std::vector<AuditInput> inputs{in(0, "a", 1500), in(1, "a", 11999), in(2, "a", 12000)};
  auto r = audit_dedup(inputs, {out(0, "a"), out(2, "a")}, kRules);
  EXPECT_TRUE(r.ok()) << (r.problems.empty() ? "" : r.problems[0]);
  EXPECT_EQ(r.exact_distinct, 2u);
}

TEST(DedupAudit, ClockIsMaxTimestampSeen) {
  // The late record (ts 1000) is judged at the clock (tick 15): "a" from
  // tick 1 has expired, so it is new.
  std::vector<AuditInput> inputs{in(0, "a", 1000), in(1, "b", 15000), in(2, "a", 1000)};
  auto r = audit_dedup(inputs, {out(0, "a"), out(1, "b"), out(2, "a")}, kRules);
  EXPECT_TRUE(r.ok()) << (r.problems.empty() ? "" : r.problems[0]);
}

TEST(DedupAudit, EmittedDuplicateIsAFalseNegative) {
  std::vector<AuditInput> inputs{in(0, "a", 1000), in(1, "a", 2000)};
  auto r = audit_dedup(inputs, {out(0, "a"), out(1, "a")}, kRules);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.false_negatives, 1u);
  ASSERT_FALSE(r.problems.empty());
  EXPECT_NE(r.problems[0].find("offset 1"), std::string::npos) << r.problems[0];
}

TEST(DedupAudit, DroppedNewRecordIsAFalsePositiveAndItsCopyIsNew) {
  // "a" dropped at offset 0 (false positive): offset 1 is then new, and
  // emitting it is correct, not a false negative.
  std::vector<AuditInput> inputs{in(0, "a", 1000), in(1, "a", 2000)};
  AuditRules rules = kRules;
  rules.fpp = 0.01;
  auto r = audit_dedup(inputs, {out(1, "a")}, rules);
  EXPECT_EQ(r.false_positives, 1u);
  EXPECT_EQ(r.false_negatives, 0u);
  EXPECT_EQ(r.new_candidates, 2u);
  EXPECT_TRUE(r.ok());  // 1 <= bound for tiny streams
  rules.fpp = 0.0;
  std::vector<AuditInput> many;
  std::vector<AuditOutput> none;
  for (int i = 0; i < 20; ++i) many.push_back(in(i, "k" + std::to_string(i), 1000));
  auto over = audit_dedup(many, none, rules);
  EXPECT_EQ(over.false_positives, 20u);
  EXPECT_FALSE(over.ok());
}

TEST(DedupAudit, EmittedTwiceAndUnknownOutputsFail) {
  std::vector<AuditInput> inputs{in(0, "a", 1000)};
  auto twice = audit_dedup(inputs, {out(0, "a"), out(0, "a")}, kRules);
  EXPECT_EQ(twice.emitted_twice, 1u);
  EXPECT_EQ(twice.distinct_outputs, 1u);
  EXPECT_EQ(twice.outputs, 2u);
  EXPECT_FALSE(twice.ok());
  auto unknown = audit_dedup(inputs, {out(0, "a"), out(7, "z")}, kRules);
  EXPECT_EQ(unknown.unknown_outputs, 1u);
  EXPECT_FALSE(unknown.ok());
  auto wrong_key = audit_dedup(inputs, {out(0, "b")}, kRules);
  EXPECT_EQ(wrong_key.unknown_outputs, 1u);
  auto no_provenance = audit_dedup(inputs, {AuditOutput{-1, -1, "a"}}, kRules);
  EXPECT_EQ(no_provenance.unknown_outputs, 1u);
}

TEST(ClickStream, ReproducibleWithDuplicatesOfEveryKind) {
  ClickStreamOptions o{.records = 20'000, .start_ms = 1'000'000, .span_ms = 200'000, .seed = 7};
  ClickStream a(o), b(o);
  Click ca, cb;
  std::map<Click::Kind, int> kinds;
  std::set<std::string> keys;
  std::int64_t min_ts = INT64_MAX, max_ts = 0;
  int n = 0;
  while (a.next(ca)) {
    ASSERT_TRUE(b.next(cb));
    ASSERT_EQ(ca.key, cb.key);
    ASSERT_EQ(ca.value, cb.value);
    ++kinds[ca.kind];
    keys.insert(ca.key);
    min_ts = std::min(min_ts, ca.timestamp_ms);
    max_ts = std::max(max_ts, ca.timestamp_ms);
    ++n;
  }
  EXPECT_FALSE(b.next(cb));
  EXPECT_EQ(n, 20'000);
  EXPECT_GT(kinds[Click::Kind::kRetry], 500);
  EXPECT_GT(kinds[Click::Kind::kRepost], 50);
  EXPECT_GT(kinds[Click::Kind::kFraud], 100);
  EXPECT_LT(keys.size(), 20'000u);  // Zipf collisions plus the duplicates
  EXPECT_GE(min_ts, 1'000'000);
  EXPECT_LE(max_ts, 1'000'000 + 200'000 + 180'000);
}

TEST(ZipfSampler, FavoursSmallRanks) {
  ZipfSampler z(1000, 1.1);
  std::mt19937_64 rng(3);
  int first = 0, last_half = 0;
  for (int i = 0; i < 10'000; ++i) {
    auto v = z(rng);
    ASSERT_LT(v, 1000u);
    first += v == 0;
    last_half += v >= 500;
  }
  EXPECT_GT(first, last_half);
}

}  // namespace
}  // namespace kdedup::testbroker
