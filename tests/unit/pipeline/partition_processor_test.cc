// The per-partition record path without Kafka: decisions, routing of
// duplicates and records without identity, replay rules of a recovering
// partition, offsets registered before any output, on_invalid: fail.

#include "kdedup/pipeline/partition_processor.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fixed_now.h"

namespace kdedup::pipeline {
namespace {

/// Records what the processor hands over, and what the offset tracker held
/// at the time of the first output.
class FakeSinks final : public RecordSinks {
 public:
  explicit FakeSinks(const Slice& slice) : slice_(slice) {}
  void output(std::size_t i) override { note("out", i); }
  void duplicate(std::size_t i) override { note("dup", i); }
  void dead_letter(std::size_t i, const identity::ExtractError& e) override {
    note("dlq:" + std::string(identity::to_string(e.reason)), i);
  }
  std::vector<std::string> calls;
  std::uint64_t in_flight_at_first_call = 0;

 private:
  void note(const std::string& what, std::size_t i) {
    if (calls.empty()) in_flight_at_first_call = slice_.tracker()->in_flight();
    calls.push_back(what + "@" + std::to_string(i));
  }
  const Slice& slice_;
};

struct Batch {
  std::vector<std::string> keys;  // "" = no key (no identity)
  std::vector<RecordIn> records;
  Batch(std::int64_t first_offset, std::vector<std::string> k, std::int64_t ts = kWall - 1000)
      : keys(std::move(k)) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      RecordIn r;
      r.offset = first_offset + static_cast<std::int64_t>(i);
      r.timestamp_ms = ts;
      if (!keys[i].empty()) r.view.key = keys[i];
      r.view.value = "v";
      records.push_back(r);
    }
  }
};

std::unique_ptr<Slice> exact_slice() {
  SliceOptions o;
  o.window_ms = 60'000;
  o.filter.type = filter::FilterType::kExact;
  auto s = Slice::create({"in", 0}, o);
  EXPECT_TRUE(s) << s.error().message;
  return std::move(*s);
}

PartitionProcessor processor(ProcessorOptions o) {
  return PartitionProcessor(o, identity::IdentityExtractor::create("key").value(),
                            filter::Fingerprinter("salt"));
}

TEST(PartitionProcessor, RoutesDistinctDuplicatesAndDeadLettersAfterRegisteringOffsets) {
  ProcessorOptions o;
  o.route_duplicates = true;
  auto p = processor(o);
  auto slice = exact_slice();
  FakeSinks sinks(*slice);
  Batch b(10, {"a", "b", "a", "", "c", "b"});
  const BatchResult r = p.process(*slice, b.records, kWall, sinks);
  EXPECT_EQ(r.processed, 6u);
  EXPECT_FALSE(r.fail_message);
  EXPECT_EQ(sinks.calls, (std::vector<std::string>{"out@0", "out@1", "dup@2", "dlq:missing_key@3",
                                                   "out@4", "dup@5"}));
  EXPECT_EQ(sinks.in_flight_at_first_call, 6u) << "every output registered before the first";
  const auto& c = *slice->counters();
  EXPECT_EQ(c.records_in, 6u);
  EXPECT_EQ(c.distinct, 3u);
  EXPECT_EQ(c.duplicates, 2u);
  EXPECT_EQ(c.invalid, 1u);
  EXPECT_EQ(c.dead_lettered, 1u);
  EXPECT_EQ(slice->next_offset(), 16);

  // The next batch remembers the first one's identities.
  FakeSinks more(*slice);
  Batch b2(16, {"c", "d"});
  p.process(*slice, b2.records, kWall, more);
  EXPECT_EQ(more.calls, (std::vector<std::string>{"dup@0", "out@1"}));
}

TEST(PartitionProcessor, UnroutedDuplicatesAreDroppedAndOnInvalidPassOrDrop) {
  ProcessorOptions o;
  o.on_invalid = config::OnInvalid::kPass;
  auto p = processor(o);
  auto slice = exact_slice();
  FakeSinks sinks(*slice);
  Batch b(0, {"a", "a", ""});
  p.process(*slice, b.records, kWall, sinks);
  EXPECT_EQ(sinks.calls, (std::vector<std::string>{"out@0", "out@2"}));
  EXPECT_EQ(slice->counters()->invalid_passed, 1u);
  EXPECT_EQ(slice->tracker()->in_flight(), 2u) << "the dropped duplicate waits for nothing";

  o.on_invalid = config::OnInvalid::kDrop;
  auto q = processor(o);
  auto other = exact_slice();
  FakeSinks dropped(*other);
  q.process(*other, b.records, kWall, dropped);
  EXPECT_EQ(dropped.calls, (std::vector<std::string>{"out@0"}));
  EXPECT_EQ(other->counters()->invalid_dropped, 1u);
}

TEST(PartitionProcessor, OnInvalidFailStopsBeforeTheRecordAndDoesNotRegisterIt) {
  ProcessorOptions o;
  o.on_invalid = config::OnInvalid::kFail;
  auto p = processor(o);
  auto slice = exact_slice();
  FakeSinks sinks(*slice);
  Batch b(100, {"a", "b", "", "c"});
  const BatchResult r = p.process(*slice, b.records, kWall, sinks);
  EXPECT_EQ(r.processed, 2u);
  ASSERT_TRUE(r.fail_message);
  EXPECT_NE(r.fail_message->find("in[0]@102"), std::string::npos) << *r.fail_message;
  EXPECT_EQ(sinks.calls, (std::vector<std::string>{"out@0", "out@1"}));
  EXPECT_EQ(slice->next_offset(), 102) << "the failed record is not processed";
  // "c" was never decided: a later batch still finds it new.
  FakeSinks later(*slice);
  Batch b2(103, {"c"});
  auto q = processor(ProcessorOptions{});
  q.process(*slice, b2.records, kWall, later);
  EXPECT_EQ(later.calls, (std::vector<std::string>{"out@0"}));
}

TEST(PartitionProcessor, ARebuiltPartitionLearnsWhatWasDeliveredAndEmitsNothingReplayed) {
  ProcessorOptions o;
  o.route_duplicates = true;
  auto p = processor(o);
  auto slice = exact_slice();
  // Offsets 0..5 below C = 6; delivered: 0 ("x") and 4 ("y"). 6 was already
  // emitted (in the output), 7 was not: with ordered output it stays dropped.
  slice->set_replay(ReplayRule(ReplayRule::Below::kDelivered, 6, 8, {0, 4, 6}, true));
  FakeSinks sinks(*slice);
  Batch b(0, {"x", "x", "y", "", "y", "z", "w", "v", "y", "x", "z"});
  const BatchResult r = p.process(*slice, b.records, kWall, sinks);
  EXPECT_EQ(r.processed, 11u);
  // 6 (learned) and 0..5 produce nothing; 7 is a duplicate by the previous
  // owner's decision; from 8 on: "y" and "x" were learned, "z" was never
  // delivered (offset 5 was skipped), so it is new.
  EXPECT_EQ(sinks.calls, (std::vector<std::string>{"dup@7", "dup@8", "dup@9", "out@10"}));
  const auto& c = *slice->counters();
  EXPECT_EQ(c.replayed, 7u);
  EXPECT_EQ(c.records_in, 4u);
  EXPECT_EQ(c.invalid, 0u) << "a replayed record without identity is not routed again";
}

TEST(PartitionProcessor, ARestoredPartitionDecidesAgainBelowTheCommit) {
  auto p = processor(ProcessorOptions{});
  auto slice = exact_slice();
  slice->set_replay(ReplayRule(ReplayRule::Below::kSnapshot, 3, 3, {}));
  FakeSinks sinks(*slice);
  Batch b(0, {"a", "a", "b", "a", "b", "c"});
  p.process(*slice, b.records, kWall, sinks);
  EXPECT_EQ(sinks.calls, (std::vector<std::string>{"out@5"}));
  EXPECT_EQ(slice->counters()->duplicates, 2u);
}

TEST(PartitionProcessor, WithTheFilterOffEveryIdentifiedRecordIsDistinct) {
  ProcessorOptions o;
  o.filter_enabled = false;
  auto p = processor(o);
  SliceOptions so;
  so.window_ms = 60'000;
  so.filter_enabled = false;
  auto slice = Slice::create({"in", 0}, so);
  ASSERT_TRUE(slice);
  FakeSinks sinks(**slice);
  Batch b(0, {"a", "a", ""});
  p.process(**slice, b.records, kWall, sinks);
  EXPECT_EQ(sinks.calls, (std::vector<std::string>{"out@0", "out@1", "dlq:missing_key@2"}));
}

TEST(PartitionProcessor, TimeFromTheExtractorDrivesTheClock) {
  ProcessorOptions o;
  o.time_from_extractor = true;
  o.route_duplicates = true;
  PartitionProcessor p(o, identity::IdentityExtractor::create("json:/id", "json:/ts").value(),
                       filter::Fingerprinter("salt"));
  auto slice = exact_slice();
  // Window 60 s, 192 ticks: one tick is 312.5 ms.
  std::vector<std::string> values = {R"({"id":1,"ts":1000})", R"({"id":1,"ts":61000})",
                                     R"({"id":1,"ts":61313})", R"({"id":2})"};
  std::vector<RecordIn> records;
  for (std::size_t i = 0; i < values.size(); ++i) {
    RecordIn r;
    r.offset = static_cast<std::int64_t>(i);
    r.timestamp_ms = kWall;  // ignored: the value's time counts
    r.view.value = values[i];
    records.push_back(r);
  }
  FakeSinks sinks(*slice);
  p.process(*slice, records, kWall, sinks);
  // Age 60 000 ms == the window: a duplicate; 60 313 ms, past the window
  // and the tick after it: forgotten.
  EXPECT_EQ(sinks.calls,
            (std::vector<std::string>{"out@0", "dup@1", "out@2", "dlq:missing_field@3"}))
      << "a record without its time has no identity";
  EXPECT_EQ(slice->clock().now_ms(), 61313);
}

}  // namespace
}  // namespace kdedup::pipeline
