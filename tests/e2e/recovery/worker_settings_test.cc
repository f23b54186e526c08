// The smallest and largest worker settings through the binary: `threads`
// 1 and 1,024 (the schema's bounds) crossed with `batch_size` 1 and
// 1,000,000. Each runs a keyed stream with duplicates over 8 partitions,
// stops with SIGTERM, and starts again on a second stream that repeats
// identities of the first: the first records after the restart meet the
// restored filters. The verifier judges the whole output against the exact
// oracle of the whole input (nothing lost, nothing emitted twice, nothing
// out of order), and the instance reports the workers it was given.

#include <gtest/gtest.h>

#include <iostream>

#include "harness.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;

struct WorkerCase {
  int threads;
  std::uint32_t batch_size;
};

void PrintTo(const WorkerCase& c, std::ostream* os) {
  *os << "threads " << c.threads << ", batch_size " << c.batch_size;
}

std::string case_name(const ::testing::TestParamInfo<WorkerCase>& info) {
  return "threads_" + std::to_string(info.param.threads) + "_batch_" +
         std::to_string(info.param.batch_size);
}

class WorkerSettings : public ::testing::TestWithParam<WorkerCase> {};

TEST_P(WorkerSettings, AStreamAndARestartComeOutExact) {
  const WorkerCase& c = GetParam();
  const auto t0 = std::chrono::steady_clock::now();
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:8", "out:8", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  RunSettings s;
  s.group = "workers";
  s.threads = c.threads;
  s.batch_size = c.batch_size;
  s.state_dir = dir.file("state");
  Instance k("k", dir, b.bootstrap(), s);

  // The first stream draws identities 0..1,999; the second drifts upward
  // (record i: i / 4 plus a draw over 2,000), so it repeats identities of
  // the first across the restart and brings new ones.
  Feeder::Options first{.partitions = 8, .domain = 2'000, .per_second = 2'000, .seed = 1};
  first.limit = 4'000;
  ASSERT_TRUE(run_batch(b, k, first));
  Feeder::Options second = first;
  second.seed = 2;
  second.drift = 0.25;
  ASSERT_TRUE(k.start());
  ASSERT_TRUE(k.wait_ready(60s)) << k.log_tail();
  std::this_thread::sleep_for(1500ms);  // metrics are published once a second
  EXPECT_EQ(k.metric("kdedup_workers"), c.threads) << k.log_tail();
  EXPECT_EQ(k.stop(), 0) << k.log_tail();
  ASSERT_TRUE(run_batch(b, k, second));

  auto report = verify_topics(b, s);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_TRUE(report->ok()) << report->to_string();
  EXPECT_EQ(report->input_records, 8'000u);
  EXPECT_LT(report->oracle_distinct, report->input_records) << "the stream must hold duplicates";
  const RecoveryLines recovered = recovery_lines(k.log());
  std::cout << "threads " << c.threads << ", batch_size " << c.batch_size << ": "
            << recovered.to_string() << "; " << seconds_since(t0) << " s" << std::endl;
  EXPECT_GT(recovered.by_reason.count("restored"), 0u) << k.log_tail();
}

INSTANTIATE_TEST_SUITE_P(RecoveryE2E, WorkerSettings,
                         ::testing::Values(WorkerCase{1, 1}, WorkerCase{1, 1'000'000},
                                           WorkerCase{1024, 1}, WorkerCase{1024, 1'000'000}),
                         case_name);

}  // namespace
}  // namespace kdedup::testing
