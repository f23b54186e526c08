// The repartition stage through the real binary: input of 8 partitions
// produced with random partitioning (copies of one identity spread over the
// partitions), exact filter, window 1 h. With `repartition:` the output must
// equal the exact oracle over the whole input (verify_by_identity through
// the kdedup-origin-* headers): every identity emitted once, nothing lost,
// nothing emitted twice, also across kill -9 of instances (a crash between
// the stages re-produces records to the internal topic; the dedup stage
// removes those copies). The same input deduplicated without the stage lets
// copies through: the misses the stage prevents.

#include <gtest/gtest.h>

#include <iostream>
#include <random>

#include <librdkafka/rdkafkacpp.h>

#include "harness.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;

constexpr const char* kInternal = "in-by-id";

// The test broker (librdkafka's mock cluster) has no admin API: the tests
// create the internal topic and kdedup only checks it.
std::string repartition_yaml(int partitions) {
  return "repartition:\n  topic: " + std::string(kInternal) +
         "\n  partitions: " + std::to_string(partitions) + "\n  create_topic: false\n";
}

RunSettings repartitioned(const std::string& group, const std::string& output) {
  RunSettings s;
  s.group = group;
  s.output = output;
  s.extra_yaml = repartition_yaml(8);
  return s;
}

/// Waits until both stages committed everything they read.
bool drained(TestBroker& b, const std::string& group, std::chrono::milliseconds timeout) {
  return wait_committed_to_end(b, group + "-repartition", "in", timeout) &&
         wait_committed_to_end(b, group, kInternal, timeout);
}

void expect_exact(const VerifyReport& r, std::uint64_t produced) {
  EXPECT_EQ(r.input_records, produced);
  EXPECT_EQ(r.lost, 0u) << "false negatives of the window: none may be lost";
  EXPECT_EQ(r.duplicated, 0u) << "an identity emitted twice within the window";
  EXPECT_EQ(r.unexpected, 0u);
  // Window 1 h: the exact oracle emits each identity exactly once.
  EXPECT_EQ(r.output_records, r.oracle_distinct);
  EXPECT_LT(r.oracle_distinct, r.input_records) << "the stream must hold duplicates";
}

TEST(RepartitionE2E, UnkeyedInputEqualsTheOracleAndWithoutTheStageCopiesGetThrough) {
  auto broker = TestBroker::start(
      {.brokers = 1, .topics = {"in:8", "out:8", "out-plain:8", "dlq:1", "in-by-id:8"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  Instance with("with", dir, b.bootstrap(), repartitioned("unkeyed", "out"));
  RunSettings plain_settings;
  plain_settings.group = "plain";
  plain_settings.output = "out-plain";
  Instance plain("plain", dir, b.bootstrap(), plain_settings);
  ASSERT_TRUE(with.start());
  ASSERT_TRUE(plain.start());
  Feeder feeder(b.bootstrap(), {.partitions = 8,
                                .domain = 1'500,
                                .per_second = 1'500,
                                .seed = 42,
                                .limit = 9'000,
                                .random_partitioning = true});
  ASSERT_TRUE(feeder.wait_done(60s) && feeder.stop()) << feeder.error();
  ASSERT_TRUE(drained(b, "unkeyed", 90s)) << with.log_tail();
  ASSERT_TRUE(wait_committed_to_end(b, "plain", "in", 90s)) << plain.log_tail();
  // Metrics are published once a second, and one publish may catch the
  // last reads before their deliveries: wait for both counters.
  const double produced = static_cast<double>(feeder.produced());
  std::optional<double> read_in, repartitioned;
  for (int i = 0; i < 50 && (read_in != produced || repartitioned != produced); ++i) {
    std::this_thread::sleep_for(100ms);
    read_in = with.metric("kdedup_repartition_records_in_total");
    repartitioned = with.metric("kdedup_repartition_records_total");
  }
  EXPECT_EQ(read_in.value_or(-1), produced);
  EXPECT_EQ(repartitioned.value_or(-1), produced);
  EXPECT_EQ(with.stop(), 0) << with.log_tail();
  EXPECT_EQ(plain.stop(), 0) << plain.log_tail();

  auto marks = b.watermarks(kInternal);
  ASSERT_TRUE(marks) << marks.error().message;
  EXPECT_EQ(marks->size(), 8u);

  auto report = verify_topics_by_identity(b, "in", "out", 3'600'000, pipeline::kOriginProvenance);
  ASSERT_TRUE(report) << report.error().message;
  expect_exact(*report, feeder.produced());

  // Without the stage each partition is deduplicated on its own: copies of
  // one identity in different partitions are all emitted.
  auto without =
      verify_topics_by_identity(b, "in", "out-plain", 3'600'000, pipeline::kSourceProvenance);
  ASSERT_TRUE(without) << without.error().message;
  EXPECT_EQ(without->lost, 0u);
  EXPECT_GT(without->duplicated, without->oracle_distinct / 2)
      << "random partitioning over 8 partitions must let many copies through";
  std::cout << "without the stage: " << without->duplicated << " copies emitted that the stage "
            << "removes (" << without->output_records << " out vs " << report->output_records << ")"
            << std::endl;
}

TEST(RepartitionE2E, KillNineOfEitherInstanceLosesNothingAndEmitsNothingTwice) {
  const auto t0 = std::chrono::steady_clock::now();
  auto broker =
      TestBroker::start({.brokers = 1, .topics = {"in:8", "out:8", "dlq:1", "in-by-id:8"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  std::vector<std::unique_ptr<Instance>> instances;
  for (const char* name : {"a", "b"}) {
    RunSettings s = repartitioned("repart-kill", "out");
    s.state_dir = dir.file(std::string(name) + "-state");
    s.session_timeout_ms = 3000;
    instances.push_back(std::make_unique<Instance>(name, dir, b.bootstrap(), s));
    ASSERT_TRUE(instances.back()->start());
  }
  const std::uint64_t seed = std::random_device{}();
  std::cout << "seed " << seed << std::endl;
  std::mt19937_64 rng(seed);
  Feeder feeder(b.bootstrap(), {.partitions = 8,
                                .domain = 600,
                                .per_second = 400,
                                .seed = seed,
                                .drift = 0.3,
                                .random_partitioning = true});
  for (int cycle = 1; cycle <= 6; ++cycle) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500 + rng() % 3000));
    Instance& victim = *instances[rng() % 2];
    // A segmentation fault is a crash like the kill (crashed_by_itself);
    // any other end fails the test.
    const std::optional<int> exited = victim.wait_exit(0ms);
    if (!crashed_by_itself(victim.name(), exited, victim.run_log(),
                           "before the kill in cycle " + std::to_string(cycle))) {
      ASSERT_FALSE(exited) << victim.name() << " exited by itself, status " << *exited << "\n"
                           << victim.log_tail();
    }
    victim.kill9();
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 1000));
    ASSERT_TRUE(victim.start()) << victim.log_tail();
    std::cout << "cycle " << cycle << ": SIGKILL + restart " << victim.name() << ", feeder at "
              << feeder.produced() << std::endl;
  }
  ASSERT_TRUE(feeder.stop()) << feeder.error();
  EXPECT_TRUE(drained(b, "repart-kill", 120s))
      << instances[0]->log_tail() << instances[1]->log_tail();
  for (auto& i : instances) {
    // The output is judged as always after the assignor's fault; any other
    // end than a clean stop fails the test.
    if (const auto status = stop_after_kills(*i)) {
      EXPECT_EQ(*status, 0) << i->log_tail();
    }
  }
  auto report = verify_topics_by_identity(b, "in", "out", 3'600'000, pipeline::kOriginProvenance);
  ASSERT_TRUE(report) << report.error().message;
  expect_exact(*report, feeder.produced());
  std::cout << "done in " << seconds_since(t0) << " s" << std::endl;
}

/// Joins `group` (the test broker refuses commits from non-members), waits
/// for every partition of `topic` and commits `offsets` (one per partition):
/// what the group would hold had its member crashed before committing past
/// them.
Status rewind_group(const std::string& bootstrap, const std::string& group,
                    const std::string& topic, const std::vector<std::int64_t>& offsets) {
  std::string err;
  std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  if (conf->set("bootstrap.servers", bootstrap, err) != RdKafka::Conf::CONF_OK ||
      conf->set("group.id", group, err) != RdKafka::Conf::CONF_OK ||
      conf->set("enable.auto.commit", "false", err) != RdKafka::Conf::CONF_OK ||
      conf->set("session.timeout.ms", "4000", err) != RdKafka::Conf::CONF_OK ||
      // The group's members (kdedup) use cooperative-sticky: a member with
      // another protocol would be refused or leave the group inconsistent.
      conf->set("partition.assignment.strategy", "cooperative-sticky", err) !=
          RdKafka::Conf::CONF_OK) {
    return fail(err);
  }
  std::unique_ptr<RdKafka::KafkaConsumer> c(RdKafka::KafkaConsumer::create(conf.get(), err));
  if (!c) return fail(err);
  if (c->subscribe({topic}) != RdKafka::ERR_NO_ERROR) return fail("subscribe failed");
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  std::size_t assigned_count = 0;
  while (assigned_count != offsets.size() && std::chrono::steady_clock::now() < deadline) {
    std::unique_ptr<RdKafka::Message> m(c->consume(100));
    std::vector<RdKafka::TopicPartition*> assigned;
    c->assignment(assigned);
    assigned_count = assigned.size();
    RdKafka::TopicPartition::destroy(assigned);
  }
  if (assigned_count != offsets.size()) {
    c->close();
    return fail("the rewinding consumer was not assigned every partition of " + topic);
  }
  std::vector<RdKafka::TopicPartition*> tps;
  for (std::size_t p = 0; p < offsets.size(); ++p) {
    tps.push_back(RdKafka::TopicPartition::create(topic, static_cast<int>(p), offsets[p]));
  }
  const RdKafka::ErrorCode e = c->commitSync(tps);
  RdKafka::TopicPartition::destroy(tps);
  c->close();
  if (e != RdKafka::ERR_NO_ERROR) return fail("commit: " + RdKafka::err2str(e));
  return {};
}

// A crash of the repartition stage after the internal topic acknowledged
// records but before their input offsets were committed: the next run
// re-produces them. The copies have the same identity, land in the same
// partition of the internal topic, and the dedup stage removes them.
TEST(RepartitionE2E, CopiesACrashBetweenTheStagesMadeAreRemovedByTheDedupStage) {
  auto broker =
      TestBroker::start({.brokers = 1, .topics = {"in:8", "out:8", "dlq:1", "in-by-id:8"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  RunSettings s = repartitioned("crash-between", "out");
  s.state_dir = dir.file("state");
  Instance instance("i", dir, b.bootstrap(), s);
  ASSERT_TRUE(instance.start());
  Feeder feeder(b.bootstrap(), {.partitions = 8,
                                .domain = 800,
                                .per_second = 1'500,
                                .seed = 9,
                                .limit = 4'000,
                                .random_partitioning = true});
  ASSERT_TRUE(feeder.wait_done(60s) && feeder.stop()) << feeder.error();
  ASSERT_TRUE(drained(b, "crash-between", 90s)) << instance.log_tail();
  ASSERT_EQ(instance.stop(), 0) << instance.log_tail();

  // The stage "crashed" having committed only half of every input partition.
  auto marks = b.watermarks("in");
  ASSERT_TRUE(marks) << marks.error().message;
  std::vector<std::int64_t> half(8, 0);
  std::int64_t rewound = 0;
  for (const auto& m : *marks) {
    half[static_cast<std::size_t>(m.partition)] = m.high / 2;
    rewound += m.high - m.high / 2;
  }
  auto rewound_ok = rewind_group(b.bootstrap(), "crash-between-repartition", "in", half);
  ASSERT_TRUE(rewound_ok) << rewound_ok.error().message;
  ASSERT_TRUE(instance.start());
  ASSERT_TRUE(drained(b, "crash-between", 90s)) << instance.log_tail();
  ASSERT_EQ(instance.stop(), 0) << instance.log_tail();

  auto internal = b.watermarks(kInternal);
  ASSERT_TRUE(internal) << internal.error().message;
  std::int64_t internal_records = 0;
  for (const auto& m : *internal) internal_records += m.high;
  EXPECT_EQ(internal_records, static_cast<std::int64_t>(feeder.produced()) + rewound)
      << "the rewound records were re-produced to the internal topic";
  auto report = verify_topics_by_identity(b, "in", "out", 3'600'000, pipeline::kOriginProvenance);
  ASSERT_TRUE(report) << report.error().message;
  expect_exact(*report, feeder.produced());
}

TEST(RepartitionE2E, RefusesAnInternalTopicOfAnotherPartitionCountOrAMissingOne) {
  auto broker =
      TestBroker::start({.brokers = 1, .topics = {"in:4", "out:8", "dlq:1", "in-by-id:4"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  Instance wrong("wrong", dir, b.bootstrap(), repartitioned("g1", "out"));
  ASSERT_TRUE(wrong.start());
  EXPECT_EQ(wrong.wait_exit(30s), 2) << wrong.log_tail();
  EXPECT_TRUE(line_with_all(
      wrong.log(), {"repartition.partitions", "'in-by-id' has 4 partitions", "config says 8"}))
      << wrong.log_tail();

  RunSettings missing = repartitioned("g2", "out");
  missing.extra_yaml = "repartition:\n  topic: not-there\n  partitions: 8\n  create_topic: false\n";
  Instance absent("absent", dir, b.bootstrap(), missing);
  ASSERT_TRUE(absent.start());
  EXPECT_EQ(absent.wait_exit(30s), 2) << absent.log_tail();
  EXPECT_TRUE(line_with_all(
      absent.log(), {"repartition.topic", "'not-there' does not exist", "create_topic is false"}))
      << absent.log_tail();

  // create_topic: true asks the broker (CreateTopics); the test broker has
  // no admin API, so the start fails naming the key and what to do.
  RunSettings create = repartitioned("g3", "out");
  create.extra_yaml = "repartition:\n  topic: to-create\n  partitions: 8\n";
  Instance creating("creating", dir, b.bootstrap(), create);
  ASSERT_TRUE(creating.start());
  EXPECT_EQ(creating.wait_exit(60s), 2) << creating.log_tail();
  EXPECT_TRUE(line_with_all(
      creating.log(), {"repartition.topic", "creating topic 'to-create'", "create_topic: false"}))
      << creating.log_tail();
}

}  // namespace
}  // namespace kdedup::testing
