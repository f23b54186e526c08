// on_duplicate: refresh through the record path (PartitionProcessor + Slice)
// and its recovery: under refresh an occurrence is a duplicate iff its
// identity occurred (delivered or dropped) within the window before it, so a
// partition rebuilt without snapshot must learn EVERY replayed record in the
// window before the committed offset, not only the deliveries. The rebuilt
// partition must then decide the rest of the stream exactly as the original
// owner; the rule of keep_first (learn deliveries only) must not.

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "fixed_now.h"
#include "kdedup/pipeline/partition_processor.h"

namespace kdedup::pipeline {
namespace {

constexpr std::int64_t kWindowMs = 60'000;

class OffsetSinks final : public RecordSinks {
 public:
  explicit OffsetSinks(std::span<const RecordIn> records) : records_(records) {}
  void output(std::size_t i) override { out.insert(records_[i].offset); }
  void duplicate(std::size_t) override {}
  void dead_letter(std::size_t, const identity::ExtractError&) override {}
  std::set<std::int64_t> out;

 private:
  std::span<const RecordIn> records_;
};

/// One record a second; "r" repeats every 40 s for the whole stream (always
/// within the window), "s<i>" every 100 s (past the window), the rest new.
struct Stream {
  std::vector<std::string> keys;
  std::vector<RecordIn> records;
  explicit Stream(int n) {
    keys.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      keys.push_back(i % 40 == 0   ? std::string("r")
                     : i % 25 == 3 ? "s" + std::to_string(i % 100)
                                   : "n" + std::to_string(i));
    }
    for (int i = 0; i < n; ++i) {
      RecordIn r;
      r.offset = i;
      r.timestamp_ms = kWall - 1'000'000 + i * 1'000LL;
      r.view.key = keys[static_cast<std::size_t>(i)];
      r.view.value = "v";
      records.push_back(r);
    }
  }
};

std::unique_ptr<Slice> slice(bool refresh) {
  SliceOptions o;
  o.window_ms = kWindowMs;
  o.refresh = refresh;
  o.filter.type = filter::FilterType::kExact;
  o.filter.ticks_per_window = 60;
  auto s = Slice::create({"in", 0}, o);
  EXPECT_TRUE(s) << s.error().message;
  return std::move(*s);
}

PartitionProcessor processor(bool refresh) {
  ProcessorOptions o;
  o.refresh = refresh;
  return PartitionProcessor(o, identity::IdentityExtractor::create("key").value(),
                            filter::Fingerprinter("salt"));
}

std::set<std::int64_t> run(Slice& s, PartitionProcessor& p, std::span<const RecordIn> records) {
  OffsetSinks sinks(records);
  const BatchResult r = p.process(s, records, kWall, sinks);
  EXPECT_EQ(r.processed, records.size());
  return sinks.out;
}

std::set<std::int64_t> from(const std::set<std::int64_t>& s, std::int64_t first) {
  return {s.lower_bound(first), s.end()};
}

TEST(Refresh, ARepeatedIdentityIsEmittedOnceWhileKeepFirstEmitsItEveryWindow) {
  Stream stream(400);
  auto refresh = slice(true);
  auto keep = slice(false);
  auto pr = processor(true);
  auto pk = processor(false);
  const auto out_refresh = run(*refresh, pr, stream.records);
  const auto out_keep = run(*keep, pk, stream.records);
  auto emitted_r = [&](const std::set<std::int64_t>& out) {
    int n = 0;
    for (auto o : out) n += stream.keys[static_cast<std::size_t>(o)] == "r";
    return n;
  };
  EXPECT_EQ(emitted_r(out_refresh), 1) << "repeats every 40 s within a 60 s window";
  EXPECT_EQ(emitted_r(out_keep), 5) << "keep_first: once per 80 s (every second repeat)";
  EXPECT_EQ(refresh->counters()->distinct + refresh->counters()->duplicates, 400u);
}

// The partition's owner crashed after committing C; the next owner has no
// snapshot and replays [window start, C) from the input, knowing which of
// those records were delivered (the output's provenance).
TEST(Refresh, ARebuildWithoutSnapshotLearnsEveryReplayedRecordAndDecidesAsTheOriginal) {
  Stream stream(400);
  const std::int64_t committed = 250;
  auto original = slice(true);
  auto p = processor(true);
  const auto out = run(*original, p, stream.records);
  const std::vector<std::int64_t> delivered(out.begin(), out.lower_bound(committed));
  // One window (plus one tick) before the record at C - 1.
  const std::int64_t start = committed - 1 - (kWindowMs + 1'000) / 1'000;
  const auto replay = std::span<const RecordIn>(stream.records).subspan(start);

  auto rebuild = [&](bool rule_refresh) {
    auto s = slice(true);
    s->set_replay(ReplayRule(ReplayRule::Below::kDelivered, committed, committed, delivered,
                             /*ordered_output=*/true, rule_refresh));
    auto q = processor(true);
    return run(*s, q, replay);
  };
  EXPECT_EQ(rebuild(true), from(out, committed))
      << "refresh: the rebuilt filter holds every identity of the last window";
  // The keep_first rule learns only deliveries: "r" (delivered once, long
  // before the replay) is unknown and its next repeat would go out again.
  EXPECT_NE(rebuild(false), from(out, committed)) << "the control must differ";
}

TEST(Refresh, ReplayRuleLearnsEveryRecordBelowTheCommitOnlyUnderRefresh) {
  using A = ReplayRule::Action;
  ReplayRule keep(ReplayRule::Below::kDelivered, 100, 110, {95, 104}, true, false);
  ReplayRule refresh(ReplayRule::Below::kDelivered, 100, 110, {95, 104}, true, true);
  EXPECT_EQ(keep.action(94), A::kSkip);
  EXPECT_EQ(refresh.action(94), A::kLearn);
  EXPECT_EQ(refresh.action(95), A::kLearn);
  EXPECT_EQ(refresh.action(104), A::kLearn);
  EXPECT_EQ(refresh.action(105), A::kDropped) << "routed as a duplicate, learned by the processor";
  EXPECT_EQ(refresh.action(110), A::kProcess);
}

// A record the previous owner dropped after C (kDropped) renewed its
// identity under refresh: the rebuilt slice must know it from there.
TEST(Refresh, ADroppedReplayedRecordRenewsItsIdentity) {
  auto s = slice(true);
  auto p = processor(true);
  Stream stream(200);
  // Offsets 0..119 replayed with the rule: 0 and 40 and 80 are "r"; only 0
  // was delivered; C = 50, H = 119 (everything up to 119 reached the output
  // or was dropped).
  s->set_replay(ReplayRule(ReplayRule::Below::kDelivered, 50, 120, {0}, true, true));
  const auto out = run(*s, p, stream.records);
  EXPECT_FALSE(out.count(160)) << "'r' at 160 is 80 s after 80, 40 s after 120 (both renewals)";
  EXPECT_FALSE(out.count(120));
}

}  // namespace
}  // namespace kdedup::pipeline
