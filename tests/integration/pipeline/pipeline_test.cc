// The pipeline in-process against the test broker process: output equals the
// exact oracle's distinct set, provenance and preserved fields, dead letters,
// hostile records, on_invalid modes, fatal stops, committed offsets, a
// parked partition read back and one whose snapshot is gone (also in
// confirmed mode), and two members sharing the partitions of one group.
// Each test starts and stops its own broker.

#include "kdedup/pipeline/pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "broker.h"
#include "kdedup/state/snapshot_store.h"
#include "process.h"

namespace kdedup::pipeline {
namespace {

using namespace std::chrono_literals;
using testing::KafkaRecord;
using testing::TestBroker;
using testing::TestRecord;

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

config::Config base_config(const std::string& bootstrap) {
  config::Config c;
  c.group_id = "it-group";
  c.input.topics = {"in"};
  c.output.topic = "out";
  c.identity.extractor = "key";
  c.identity.salt = "integration";
  c.window = 60s;
  c.filter.type = filter::FilterType::kExact;
  c.filter = *filter::normalize(c.filter);
  c.threads = 2;
  c.batch_size = 64;
  c.on_invalid = config::OnInvalid::kDlq;
  c.dlq_topic = "dlq";
  c.commit_interval = 200ms;
  c.shutdown_timeout = 10s;
  c.kafka["bootstrap.servers"] = bootstrap;
  c.metrics.address = "";
  return c;
}

/// Runs a Pipeline on its own thread until stop() or a fatal error.
class RunningPipeline {
 public:
  explicit RunningPipeline(const config::Config& c, state::SnapshotStore* store = nullptr)
      : config_(c) {
    auto p = Pipeline::create(config_, {}, store);
    if (!p) {
      result_ = tl::unexpected(p.error());
      return;
    }
    pipeline_ = std::move(*p);
    if (auto s = pipeline_->check_topics(); !s) {
      result_ = s;
      return;
    }
    thread_ = std::thread([this] {
      result_ = pipeline_->run(stop_);
      finished_ = true;
    });
  }
  ~RunningPipeline() { stop(); }
  Status stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return result_;
  }
  bool finished() const { return finished_ || !thread_.joinable(); }
  Pipeline& pipeline() { return *pipeline_; }

 private:
  config::Config config_;
  std::unique_ptr<Pipeline> pipeline_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  Status result_;
  std::atomic<bool> finished_{false};
};

/// Reads `topic` until it holds at least `count` records (or the timeout).
std::vector<KafkaRecord> read_until(TestBroker& broker, const std::string& topic, std::size_t count,
                                    std::chrono::seconds timeout = 30s) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<KafkaRecord> got;
  for (;;) {
    auto r = broker.read_topic(topic, 10s);
    if (r) got = std::move(*r);
    if (got.size() >= count || std::chrono::steady_clock::now() > deadline) return got;
    std::this_thread::sleep_for(100ms);
  }
}

/// The exact oracle: per partition, in offset order, the first record of each
/// key within the window is distinct (all records here share one window).
std::set<std::pair<std::int32_t, std::int64_t>> oracle_distinct(
    const std::vector<KafkaRecord>& input) {
  std::set<std::pair<std::int32_t, std::int64_t>> out;
  std::set<std::pair<std::int32_t, std::string>> seen;
  for (const auto& r : input) {
    if (!r.key) continue;
    if (seen.insert({r.partition, *r.key}).second) out.insert({r.partition, r.offset});
  }
  return out;
}

std::int64_t source_offset(const KafkaRecord& r) {
  auto h = r.header("kdedup-source-offset");
  return h ? std::stoll(*h) : -1;
}

TEST(PipelineIntegration, SingleInstanceEmitsExactlyTheOracleDistinctSet) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:3", "out:3", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;

  // Input through kcat (an independent client), 3 partitions, many duplicates.
  for (int p = 0; p < 3; ++p) {
    std::vector<std::string> lines;
    for (int i = 0; i < 400; ++i) {
      lines.push_back("user-" + std::to_string((i * 7 + p) % 90) + "\tclick " + std::to_string(i));
    }
    auto r = b.kcat_produce("in", lines, '\t', {"-p", std::to_string(p)});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  // A record with headers and an old explicit timestamp through librdkafka.
  const std::int64_t ts = now_ms() - 5000;
  ASSERT_TRUE(b.produce("in", {TestRecord{.key = "with-headers",
                                          .value = "v",
                                          .timestamp_ms = ts,
                                          .headers = {{"trace", "abc"}, {"trace", "def"}},
                                          .partition = 1}}));
  auto input = b.read_topic("in");
  ASSERT_TRUE(input) << input.error().message;
  ASSERT_EQ(input->size(), 1201u);
  auto expected = oracle_distinct(*input);

  RunningPipeline run(base_config(b.bootstrap()));
  auto output = read_until(b, "out", expected.size());
  std::this_thread::sleep_for(500ms);  // anything extra would show up now
  if (auto again = b.read_topic("out")) output = std::move(*again);
  auto stats = run.pipeline().stats();
  ASSERT_TRUE(run.stop()) << "pipeline failed";

  std::set<std::pair<std::int32_t, std::int64_t>> emitted;
  std::map<std::pair<std::int32_t, std::int64_t>, const KafkaRecord*> by_source;
  for (const auto& in : *input) by_source[{in.partition, in.offset}] = &in;
  for (const auto& out : output) {
    ASSERT_EQ(out.header("kdedup-source-topic"), "in");
    auto part = out.header("kdedup-source-partition");
    ASSERT_TRUE(part);
    const std::int32_t p = std::stoi(*part);
    EXPECT_EQ(out.partition, p) << "output partition = input partition by default";
    const std::int64_t off = source_offset(out);
    EXPECT_TRUE(emitted.insert({p, off}).second) << "emitted twice: " << p << "@" << off;
    const KafkaRecord* src = by_source[{p, off}];
    ASSERT_NE(src, nullptr);
    EXPECT_EQ(out.key, src->key);
    EXPECT_EQ(out.value, src->value);
    EXPECT_EQ(out.timestamp_ms, src->timestamp_ms);
    // original headers first, in order, then the three provenance headers
    ASSERT_EQ(out.headers.size(), src->headers.size() + 3);
    for (std::size_t h = 0; h < src->headers.size(); ++h)
      EXPECT_EQ(out.headers[h], src->headers[h]);
  }
  EXPECT_EQ(emitted, expected);

  std::uint64_t in = 0, distinct = 0, dups = 0;
  for (const auto& p : stats.partitions) {
    in += p.records_in;
    distinct += p.distinct;
    dups += p.duplicates;
  }
  EXPECT_EQ(in, 1201u);
  EXPECT_EQ(distinct, expected.size());
  EXPECT_EQ(dups, 1201u - expected.size());

  // Graceful stop committed everything: the group is at the end of the input.
  auto committed = b.committed("it-group", "in");
  ASSERT_TRUE(committed) << committed.error().message;
  auto marks = b.watermarks("in");
  ASSERT_TRUE(marks);
  for (const auto& m : *marks) EXPECT_EQ((*committed)[m.partition], m.high) << m.partition;

  // kcat reads the same output (independent client).
  auto kc = b.kcat_consume("out", "%k\n");
  ASSERT_EQ(kc.exit_code, 0) << kc.err;
  EXPECT_EQ(static_cast<std::size_t>(std::count(kc.out.begin(), kc.out.end(), '\n')),
            expected.size());
}

// Hostile records with a JSON identity: each has a defined outcome.
TEST(PipelineIntegration, HostileRecordsAreRoutedWithReasons) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1", "dlq:1", "dups:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  const std::int64_t now = now_ms();
  const std::string big = R"({"id":"big","pad":")" + std::string(1'200'000, 'x') + "\"}";
  std::vector<TestRecord> records{
      {.key = "k", .value = R"({"id":"a"})", .timestamp_ms = now},           // 0 distinct
      {.key = std::nullopt, .value = R"({"id":"a"})", .timestamp_ms = now},  // 1 duplicate
      {.key = "k", .value = "", .timestamp_ms = now},                        // 2 not_json
      {.key = "k", .value = "\xff\xfe{\"id\":1}", .timestamp_ms = now},      // 3 not_json
      {.key = "k", .value = "[1,2,3]", .timestamp_ms = now},                 // 4 not_object
      {.key = "k", .value = R"({"other":1})", .timestamp_ms = now},          // 5 missing_field
      {.key = "k", .value = R"({"id":null})", .timestamp_ms = now},          // 6 null_field
      {.key = "k", .value = big, .timestamp_ms = now},                       // 7 distinct, 1.2 MB
      {.key = "k", .value = R"({"id":"\u00e9t\u00e9"})", .timestamp_ms = now},        // 8 distinct
      {.key = "k", .value = R"({"id":"future"})", .timestamp_ms = now + 86'400'000},  // 9 capped
      {.key = "k", .value = R"({"id":"a"})", .timestamp_ms = now + 86'400'000},  // 10 duplicate
  };
  ASSERT_TRUE(b.produce("in", records, {{"message.max.bytes", "4000000"}}));

  auto c = base_config(b.bootstrap());
  c.identity.extractor = "json:/id";
  c.duplicates_topic = "dups";
  c.threads = 1;
  // Small skew: the capped clock stays inside the window of record 0, so
  // record 10 is still a duplicate of it.
  c.max_future_skew = 1s;
  c.consumer["fetch.max.bytes"] = "4000000";
  RunningPipeline run(c);
  auto out = read_until(b, "out", 4);
  auto dlq = read_until(b, "dlq", 5);
  auto dups = read_until(b, "dups", 2);
  auto stats = run.pipeline().stats();
  ASSERT_TRUE(run.stop());

  std::vector<std::int64_t> out_offsets, dup_offsets;
  for (const auto& r : out) out_offsets.push_back(source_offset(r));
  for (const auto& r : dups) dup_offsets.push_back(source_offset(r));
  EXPECT_EQ(out_offsets, (std::vector<std::int64_t>{0, 7, 8, 9}));
  EXPECT_EQ(dup_offsets, (std::vector<std::int64_t>{1, 10}));
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[1].value.size(), big.size());        // 1 MiB+ record passes intact
  EXPECT_EQ(out[3].timestamp_ms, now + 86'400'000);  // timestamp preserved, clock capped
  EXPECT_EQ(dups[0].key, std::nullopt);              // null key preserved
  EXPECT_EQ(dups[0].header("kdedup-source-partition"), "0");

  std::map<std::int64_t, std::string> reasons;
  for (const auto& r : dlq) {
    ASSERT_TRUE(r.header("kdedup-error"));
    ASSERT_TRUE(r.header("kdedup-error-message"));
    EXPECT_EQ(r.header("kdedup-source-topic"), "in");
    reasons[source_offset(r)] = *r.header("kdedup-error");
  }
  EXPECT_EQ(reasons, (std::map<std::int64_t, std::string>{{2, "not_json"},
                                                          {3, "not_json"},
                                                          {4, "not_object"},
                                                          {5, "missing_field"},
                                                          {6, "null_field"}}));
  // The DLQ record keeps its original bytes.
  for (const auto& r : dlq) {
    if (source_offset(r) == 3) {
      EXPECT_EQ(r.value, records[3].value);
    }
  }
  ASSERT_EQ(stats.partitions.size(), 1u);
  const auto& p = stats.partitions[0];
  EXPECT_EQ(p.records_in, 11u);
  EXPECT_EQ(p.invalid, 5u);
  EXPECT_EQ(p.dead_lettered, 5u);
  EXPECT_EQ(p.clock_capped, 2u);
  EXPECT_EQ(p.duplicates, 2u);
  EXPECT_EQ(p.invalid_reasons.at("not_json"), 2u);
}

// An identity read from a header: the headers are parsed for the filter
// (records whose keys differ but whose header repeats are duplicates), a
// record without the header is a dead letter, and every copy keeps the
// input's headers ahead of the provenance.
TEST(PipelineIntegration, HeaderIdentityDecidesAndHeadersTravel) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1", "dlq:1", "dups:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  const std::int64_t now = now_ms();
  std::vector<TestRecord> records{
      {.key = "k1", .value = "a", .timestamp_ms = now, .headers = {{"id", "x"}}},  // 0 distinct
      {.key = "k2", .value = "b", .timestamp_ms = now, .headers = {{"id", "x"}, {"t", "1"}}},
      {.key = "k1", .value = "c", .timestamp_ms = now, .headers = {{"id", "y"}}},  // 2 distinct
      {.key = "k3", .value = "d", .timestamp_ms = now},                            // 3 no header
      {.key = "k4", .value = "e", .timestamp_ms = now, .headers = {{"id", "z"}}},  // 4 distinct
  };
  ASSERT_TRUE(b.produce("in", records));

  auto c = base_config(b.bootstrap());
  c.identity.extractor = "header:id";
  c.duplicates_topic = "dups";
  c.threads = 1;
  RunningPipeline run(c);
  auto out = read_until(b, "out", 3);
  auto dups = read_until(b, "dups", 1);
  auto dlq = read_until(b, "dlq", 1);
  ASSERT_TRUE(run.stop());

  ASSERT_EQ(out.size(), 3u);
  std::vector<std::int64_t> out_offsets;
  for (const auto& r : out) out_offsets.push_back(source_offset(r));
  EXPECT_EQ(out_offsets, (std::vector<std::int64_t>{0, 2, 4}));
  EXPECT_EQ(out[1].header("id"), "y");
  ASSERT_EQ(out[0].headers.size(), 4u);  // id, then the three provenance headers
  EXPECT_EQ(out[0].headers[0].name, "id");
  ASSERT_EQ(dups.size(), 1u);
  EXPECT_EQ(source_offset(dups[0]), 1);
  ASSERT_EQ(dups[0].headers.size(), 5u);
  EXPECT_EQ(dups[0].header("t"), "1");
  ASSERT_EQ(dlq.size(), 1u);
  EXPECT_EQ(source_offset(dlq[0]), 3);
  EXPECT_EQ(dlq[0].header("kdedup-error"), "missing_header");
}

TEST(PipelineIntegration, OnInvalidPassAndDrop) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1", "out2:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  // key extractor: a null key is missing_key
  ASSERT_TRUE(b.produce("in", {{.key = "a", .value = "1"},
                               {.key = std::nullopt, .value = "2"},
                               {.key = std::nullopt, .value = "3"},
                               {.key = "a", .value = "4"},
                               {.key = "", .value = "5"}}));
  {
    auto c = base_config(b.bootstrap());
    c.on_invalid = config::OnInvalid::kPass;
    RunningPipeline run(c);
    auto out = read_until(b, "out", 4);
    ASSERT_TRUE(run.stop());
    std::vector<std::int64_t> offs;
    for (const auto& r : out) offs.push_back(source_offset(r));
    // invalid records pass as distinct and are not remembered; "" is a valid key
    EXPECT_EQ(offs, (std::vector<std::int64_t>{0, 1, 2, 4}));
  }
  {
    auto c = base_config(b.bootstrap());
    c.group_id = "drop-group";
    c.output.topic = "out2";
    c.on_invalid = config::OnInvalid::kDrop;
    RunningPipeline run(c);
    auto out = read_until(b, "out2", 2);
    std::this_thread::sleep_for(300ms);
    auto stats = run.pipeline().stats();
    ASSERT_TRUE(run.stop());
    auto all = b.read_topic("out2");
    ASSERT_TRUE(all);
    std::vector<std::int64_t> offs;
    for (const auto& r : *all) offs.push_back(source_offset(r));
    EXPECT_EQ(offs, (std::vector<std::int64_t>{0, 4}));
    ASSERT_EQ(stats.partitions.size(), 1u);
    EXPECT_EQ(stats.partitions[0].invalid_dropped, 2u);
    EXPECT_EQ(stats.partitions[0].invalid_reasons.at("missing_key"), 2u);
    auto committed = b.committed("drop-group", "in");
    ASSERT_TRUE(committed);
    EXPECT_EQ((*committed)[0], 5);  // dropped records are committed: counted, not lost
  }
}

TEST(PipelineIntegration, OnInvalidFailStopsWithoutCommittingTheRecord) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  ASSERT_TRUE(b.produce("in", {{.key = "a", .value = "1"},
                               {.key = "b", .value = "2"},
                               {.key = std::nullopt, .value = "bad"},
                               {.key = "c", .value = "4"}}));
  auto c = base_config(b.bootstrap());
  c.on_invalid = config::OnInvalid::kFail;
  RunningPipeline run(c);
  Status result;
  for (int i = 0; i < 300 && !run.finished(); ++i) std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(run.finished()) << "on_invalid: fail must stop the pipeline by itself";
  result = run.stop();
  ASSERT_FALSE(result);
  EXPECT_NE(result.error().message.find("in[0]@2"), std::string::npos) << result.error().message;
  EXPECT_NE(result.error().message.find("missing_key"), std::string::npos);
  auto out = b.read_topic("out");
  ASSERT_TRUE(out);
  ASSERT_EQ(out->size(), 2u);  // the records before it were delivered...
  auto committed = b.committed(c.group_id, "in");
  ASSERT_TRUE(committed);
  EXPECT_EQ((*committed)[0], 2);  // ...and committed; the bad one was not
}

/// The parked partitions of `run` (its stats), or -1 when none is assigned.
int parked_partitions(RunningPipeline& run) {
  const auto stats = run.pipeline().stats();
  if (stats.partitions.empty()) return -1;
  return static_cast<int>(std::count_if(stats.partitions.begin(), stats.partitions.end(),
                                        [](const PartitionStats& p) { return p.parked; }));
}

/// Waits until the pipeline's one partition is parked (false: it did not
/// within 15 s, or the pipeline stopped).
bool wait_parked(RunningPipeline& run) {
  for (int i = 0; i < 300 && !run.finished(); ++i) {
    if (parked_partitions(run) == 1) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

/// A snapshot store in `dir` and a config that snapshots every 200 ms and
/// parks after 500 ms. `confirmed`: a timer filter in confirmed mode (the
/// store opened with a confirm store, as `kdedup run` opens it); else the
/// exact filter.
std::pair<config::Config, std::unique_ptr<state::SnapshotStore>> parking(
    const std::string& bootstrap, const testing::TempDir& dir, bool confirmed) {
  state::StoreOptions options;
  if (confirmed) options.confirm = state::ConfirmOptions{};
  auto store = state::SnapshotStore::open(dir.file("state"), options);
  EXPECT_TRUE(store) << store.error().message;
  auto c = base_config(bootstrap);
  c.on_invalid = config::OnInvalid::kDrop;
  if (confirmed) {
    c.filter.type = filter::FilterType::kTimer;
    c.filter = *filter::normalize(c.filter);
    c.confirm_store = true;
  }
  c.state.dir = dir.file("state");
  c.state.snapshot_interval = 200ms;
  c.state.park_after = 500ms;
  return {std::move(c), store ? std::move(*store) : nullptr};
}

void park_read_back_then_lose_the_snapshot(bool confirmed) {
  // A partition parks once its snapshot holds its filter; its next records
  // read it back (and it parks again). A snapshot no longer there (erased
  // here, as a damaged state dir would lose it) stops the pipeline, naming
  // the partition, without emitting or committing the record: the next
  // start recovers.
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  testing::TempDir dir;
  auto [c, store] = parking(b.bootstrap(), dir, confirmed);
  ASSERT_TRUE(store);
  RunningPipeline run(c, store.get());
  ASSERT_TRUE(b.produce(
      "in", {{.key = "a", .value = "1"}, {.key = "b", .value = "2"}, {.key = "a", .value = "3"}}));
  ASSERT_EQ(read_until(b, "out", 2).size(), 2u);
  ASSERT_TRUE(wait_parked(run)) << "the quiet partition never parked";
  // Read back for its next records: "a" is still known, "c" is new.
  ASSERT_TRUE(b.produce("in", {{.key = "a", .value = "4"}, {.key = "c", .value = "5"}}));
  const auto out = read_until(b, "out", 3);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out.back().key, "c");
  ASSERT_TRUE(wait_parked(run)) << "it did not park again";

  ASSERT_TRUE(store->erase(state::PartitionKey{"in", 0}));
  ASSERT_TRUE(b.produce("in", {{.key = "b", .value = "6"}}));
  for (int i = 0; i < 300 && !run.finished(); ++i) std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(run.finished()) << "an unreadable parked filter must stop the pipeline";
  const Status result = run.stop();
  ASSERT_FALSE(result);
  EXPECT_NE(result.error().message.find("in[0]"), std::string::npos) << result.error().message;
  EXPECT_NE(result.error().message.find("parked filter"), std::string::npos)
      << result.error().message;
  auto after = b.read_topic("out");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->size(), 3u);
  auto committed = b.committed(c.group_id, "in");
  ASSERT_TRUE(committed);
  EXPECT_EQ((*committed)[0], 5);  // up to the parked position, not the new record
}

TEST(PipelineIntegration, AParkedFilterIsReadBackAndOneWhoseSnapshotIsGoneStopsWithoutCommitting) {
  park_read_back_then_lose_the_snapshot(false);
}

TEST(PipelineIntegration, AParkedFilterInConfirmedModeIsReadBackAndItsLostSnapshotStops) {
  park_read_back_then_lose_the_snapshot(true);
}

TEST(PipelineIntegration, APartitionThatHasHadNoRecordParksWithoutASnapshotInConfirmedMode) {
  // Assigned, no record: it parks with nothing in the store, and its first
  // records find a filter made anew (the confirm store still bound to the
  // partition's empty start). Then it parks from its snapshot and reads
  // that back as any partition does.
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  testing::TempDir dir;
  auto [c, store] = parking(b.bootstrap(), dir, true);
  ASSERT_TRUE(store);
  RunningPipeline run(c, store.get());
  ASSERT_TRUE(wait_parked(run)) << "the partition without records never parked";
  auto listed = store->list();
  ASSERT_TRUE(listed) << listed.error().message;
  EXPECT_TRUE(listed->empty()) << "no snapshot was needed";
  ASSERT_TRUE(b.produce(
      "in", {{.key = "a", .value = "1"}, {.key = "b", .value = "2"}, {.key = "a", .value = "3"}}));
  ASSERT_EQ(read_until(b, "out", 2).size(), 2u);
  ASSERT_TRUE(wait_parked(run)) << "it did not park again";
  ASSERT_TRUE(b.produce("in", {{.key = "a", .value = "4"}, {.key = "c", .value = "5"}}));
  const auto out = read_until(b, "out", 3);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].key, "a");
  EXPECT_EQ(out[1].key, "b");
  EXPECT_EQ(out[2].key, "c");
  const auto stats = run.pipeline().stats();
  ASSERT_EQ(stats.partitions.size(), 1u);
  EXPECT_EQ(stats.partitions[0].unparks, 2u);
  ASSERT_TRUE(run.stop());
}

TEST(PipelineIntegration, OutputWithTooFewPartitionsIsRejectedAtStartup) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:4", "out:2", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  auto p = Pipeline::create(base_config((*broker)->bootstrap()));
  ASSERT_TRUE(p) << p.error().message;
  auto s = (*p)->check_topics();
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("'out' has 2 partitions but input topic 'in' has 4"),
            std::string::npos)
      << s.error().message;
  auto c = base_config((*broker)->bootstrap());
  c.output.partitioning = config::Partitioning::kKey;
  auto q = Pipeline::create(c);
  ASSERT_TRUE(q);
  EXPECT_TRUE((*q)->check_topics());
  c.input.topics = {"in", "nope"};
  auto r = Pipeline::create(c);
  ASSERT_TRUE(r);
  auto s2 = (*r)->check_topics();
  ASSERT_FALSE(s2);
  EXPECT_NE(s2.error().message.find("'nope'"), std::string::npos) << s2.error().message;
}

TEST(PipelineIntegration, PassthroughEmitsEveryRecord) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:2", "out:2", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  std::vector<TestRecord> recs;
  for (int i = 0; i < 200; ++i) recs.push_back({.key = "same", .value = std::to_string(i)});
  ASSERT_TRUE(b.produce("in", recs));
  auto c = base_config(b.bootstrap());
  c.filter_enabled = false;
  RunningPipeline run(c);
  auto out = read_until(b, "out", 200);
  ASSERT_TRUE(run.stop());
  EXPECT_EQ(out.size(), 200u);
}

// Two members in one group from the start share the four partitions (one
// join round, one owner per partition): the union of their outputs is exactly
// the oracle, nothing is emitted twice, and everything is committed.
TEST(PipelineIntegration, TwoMembersFromTheStartShareThePartitions) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:4", "out:4", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  std::vector<TestRecord> recs;
  for (int i = 0; i < 1200; ++i) {
    recs.push_back(
        {.key = "k" + std::to_string(i % 300), .value = std::to_string(i), .partition = i % 4});
  }
  ASSERT_TRUE(b.produce("in", recs));
  auto input = b.read_topic("in");
  ASSERT_TRUE(input);
  auto expected = oracle_distinct(*input);

  auto c = base_config(b.bootstrap());
  // The test broker's coordinator holds a join phase open for
  // session.timeout.ms - 1000 ms when members come and go; 6 s keeps the
  // test quick (the default 45 s would hold it for 44 s).
  c.consumer["session.timeout.ms"] = "6000";
  c.consumer["heartbeat.interval.ms"] = "500";
  RunningPipeline one(c);
  RunningPipeline two(c);
  auto output = read_until(b, "out", expected.size());
  for (int i = 0; i < 100; ++i) {
    auto committed = b.committed(c.group_id, "in");
    if (committed && std::all_of(committed->begin(), committed->end(),
                                 [](std::int64_t o) { return o == 300; })) {
      break;
    }
    std::this_thread::sleep_for(100ms);
  }
  auto s1 = one.pipeline().stats();
  auto s2 = two.pipeline().stats();
  ASSERT_TRUE(one.stop());
  ASSERT_TRUE(two.stop());
  EXPECT_EQ(s1.assigned_partitions + s2.assigned_partitions, 4u);
  EXPECT_GE(s1.assigned_partitions, 1u);
  EXPECT_GE(s2.assigned_partitions, 1u);

  if (auto again = b.read_topic("out")) output = std::move(*again);
  std::set<std::pair<std::int32_t, std::int64_t>> emitted;
  for (const auto& out : output) {
    std::pair<std::int32_t, std::int64_t> id{std::stoi(*out.header("kdedup-source-partition")),
                                             source_offset(out)};
    EXPECT_TRUE(emitted.insert(id).second) << "emitted twice: " << id.first << "@" << id.second;
  }
  EXPECT_EQ(emitted, expected);
  auto committed = b.committed(c.group_id, "in");
  ASSERT_TRUE(committed);
  for (int p = 0; p < 4; ++p) EXPECT_EQ((*committed)[p], 300) << p;
}

}  // namespace
}  // namespace kdedup::pipeline
