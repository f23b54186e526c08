// Under load: (1) a second instance joins the group and later leaves with
// SIGTERM; the partitions move to it and back, each new owner restoring or
// rebuilding before it emits; (2) the broker goes down and comes back, and
// Produce, OffsetCommit and Fetch requests fail for a while. The service
// rides through or stops with exit 1 and a clear message (then it is
// restarted); either way the verifier finds the output exact. Each runs
// with a 1 h window (nothing expires) and with a 5 s one (the stream lasts
// many windows: a new owner without the snapshot rebuilds its filter from
// what the previous owner delivered and must decide as it would have).

#include <gtest/gtest.h>

#include <iostream>

#include "harness.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;

void scale_out_and_in(const std::string& window, const std::string& filter, bool confirm = false,
                      const std::string& assignment = "") {
  const auto t0 = std::chrono::steady_clock::now();
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:4", "out:4", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  RunSettings s;
  s.group = "scale";
  s.snapshot_interval = "500ms";
  s.window = window;
  s.filter = filter;
  if (!assignment.empty()) s.consumer_extra["partition.assignment.strategy"] = assignment;
  if (filter != "exact") s.fpp = confirm ? 0.05 : 0.001;
  if (confirm) {
    // A busy timer filter at fpp 0.05: many duplicates to confirm. The new
    // owner has no confirm store of a's partitions: it rebuilds them from
    // Kafka; a restores its own, bound to its snapshots.
    s.confirm = true;
    s.min_bytes = "1KiB";
  }
  RunSettings sa = s, sb = s;
  sa.state_dir = dir.file("a-state");
  sb.state_dir = dir.file("b-state");
  Instance a("a", dir, b.bootstrap(), sa);
  Instance bi("b", dir, b.bootstrap(), sb);
  ASSERT_TRUE(a.start());
  ASSERT_TRUE(a.wait_ready(60s)) << a.log_tail();
  Feeder feeder(b.bootstrap(),
                {.partitions = 4, .domain = 600, .per_second = 400, .seed = 31, .drift = 0.3});
  std::this_thread::sleep_for(4s);

  ASSERT_TRUE(bi.start());
  std::cout << "b joins at feeder " << feeder.produced() << std::endl;
  // b owns partitions once it has restored or rebuilt them (it has no
  // snapshots: rebuilds from Kafka).
  double b_recovered = 0;
  for (int i = 0; i < 300 && b_recovered == 0; ++i) {
    std::this_thread::sleep_for(100ms);
    b_recovered = bi.metric("kdedup_rebuilds_total").value_or(0) +
                  bi.metric("kdedup_restores_total").value_or(0);
  }
  EXPECT_GT(b_recovered, 0) << bi.log_tail();
  EXPECT_TRUE(bi.wait_ready(60s)) << bi.log_tail();
  std::this_thread::sleep_for(1500ms);  // metrics are published once a second
  const double b_replayed = bi.metric("kdedup_rebuild_replayed_records_total").value_or(0);
  std::cout << "b recovered " << b_recovered << " partition(s), replayed " << b_replayed
            << " records; a restores so far " << a.metric("kdedup_restores_total").value_or(0)
            << std::endl;
  std::cout << "b's log: " << recovery_lines(bi.run_log()).to_string() << std::endl;
  EXPECT_GT(b_replayed, 0) << "b has no snapshot: it must replay a's share of the window\n"
                           << bi.log_tail();
  std::this_thread::sleep_for(4s);
  const double a_restores_before = a.metric("kdedup_restores_total").value_or(0);
  EXPECT_EQ(bi.stop(), 0) << bi.log_tail();
  std::cout << "b left (SIGTERM) at feeder " << feeder.produced() << std::endl;
  // a takes b's partitions back and restores them from its own (older)
  // snapshots written when it handed them over.
  double a_restores = a_restores_before;
  for (int i = 0; i < 300 && a_restores == a_restores_before; ++i) {
    std::this_thread::sleep_for(100ms);
    a_restores = a.metric("kdedup_restores_total").value_or(0);
  }
  std::cout << "a restores " << a_restores_before << " -> " << a_restores
            << "; a's log: " << recovery_lines(a.run_log()).to_string() << std::endl;
  EXPECT_GT(a_restores, a_restores_before) << a.log_tail();
  std::this_thread::sleep_for(3s);
  ASSERT_TRUE(feeder.stop()) << feeder.error();
  EXPECT_TRUE(wait_committed_to_end(b, "scale", "in", 60s)) << a.log_tail();
  EXPECT_EQ(a.stop(), 0) << a.log_tail();
  auto report = verify_topics(b, s);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_TRUE(report->ok()) << report->to_string();
  EXPECT_EQ(report->input_records, feeder.produced());
  if (confirm) {
    EXPECT_EQ(report->false_positives, 0u);
  }
  std::cout << "ScaleOutAndInUnderLoad (window " << window << ", " << filter << " filter"
            << (confirm ? ", confirmed" : "")
            << (assignment.empty() ? "" : ", assignment " + assignment) << ") took "
            << seconds_since(t0) << " s" << std::endl;
}

TEST(RecoveryE2E, ScaleOutAndInUnderLoad) { scale_out_and_in("1h", "exact"); }
TEST(RecoveryE2E, ScaleOutAndInUnderLoadShortWindow) { scale_out_and_in("5s", "exact"); }
TEST(RecoveryE2E, ScaleOutAndInUnderLoadShortWindowTimerFilter) { scale_out_and_in("5s", "timer"); }
TEST(RecoveryE2E, ScaleOutAndInUnderLoadShortWindowConfirmed) {
  scale_out_and_in("5s", "timer", true);
}
// The eager protocol (`partition.assignment.strategy: range`, set under
// `consumer`): every rebalance revokes every partition and assigns them
// again, so a keeps some of its partitions through b's arrival only by
// snapshotting them at the revocation and restoring them at once.
TEST(RecoveryE2E, ScaleOutAndInUnderLoadEagerRebalance) {
  scale_out_and_in("5s", "exact", false, "range");
}

void broker_faults(const std::string& window) {
  const auto t0 = std::chrono::steady_clock::now();
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:2", "out:2", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  RunSettings s;
  s.group = "faults";
  s.state_dir = dir.file("state");
  s.snapshot_interval = "500ms";
  s.window = window;
  Instance inst("inst", dir, b.bootstrap(), s);
  ASSERT_TRUE(inst.start());
  ASSERT_TRUE(inst.wait_ready(60s)) << inst.log_tail();
  Feeder feeder(b.bootstrap(),
                {.partitions = 2, .domain = 600, .per_second = 300, .seed = 41, .drift = 0.3});
  int restarts = 0;
  // After each fault: still running, or stopped with exit 1 and a message
  // saying why (then restarted).
  auto settle = [&](const std::string& fault) {
    std::this_thread::sleep_for(3s);
    if (inst.running()) {
      std::cout << fault << ": rode through" << std::endl;
      return;
    }
    auto code = inst.wait_exit(1s);
    EXPECT_EQ(code, 1) << fault << "\n" << inst.log_tail();
    std::cout << fault << ": stopped with exit " << code.value_or(-1) << "; last lines:\n"
              << inst.log_tail(3) << std::endl;
    EXPECT_TRUE(inst.start());
    ++restarts;
  };
  std::this_thread::sleep_for(2s);
  auto reply = b.control("broker 1 down");
  ASSERT_TRUE(reply) << reply.error().message;
  std::this_thread::sleep_for(4s);
  reply = b.control("broker 1 up");
  ASSERT_TRUE(reply) << reply.error().message;
  settle("broker 1 down for 4 s");
  reply = b.control("errors Produce 6 NOT_LEADER_OR_FOLLOWER REQUEST_TIMED_OUT");
  ASSERT_TRUE(reply) << reply.error().message;
  settle("6 Produce errors");
  reply = b.control("errors OffsetCommit 4 REQUEST_TIMED_OUT COORDINATOR_NOT_AVAILABLE");
  ASSERT_TRUE(reply) << reply.error().message;
  settle("4 OffsetCommit errors");
  reply = b.control("errors Fetch 4 NOT_LEADER_OR_FOLLOWER");
  ASSERT_TRUE(reply) << reply.error().message;
  settle("4 Fetch errors");
  reply = b.control("rtt 1 400");
  ASSERT_TRUE(reply) << reply.error().message;
  settle("400 ms round trips");
  reply = b.control("rtt 1 0");
  ASSERT_TRUE(reply) << reply.error().message;

  ASSERT_TRUE(feeder.stop()) << feeder.error();
  EXPECT_TRUE(wait_committed_to_end(b, "faults", "in", 90s)) << inst.log_tail();
  EXPECT_EQ(inst.stop(), 0) << inst.log_tail();
  auto report = verify_topics(b, s);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_TRUE(report->ok()) << report->to_string();
  EXPECT_EQ(report->input_records, feeder.produced());
  std::cout << "BrokerDownUpAndInjectedErrors (window " << window << "): " << restarts
            << " restart(s), took " << seconds_since(t0) << " s" << std::endl;
}

TEST(RecoveryE2E, BrokerDownUpAndInjectedErrors) { broker_faults("1h"); }
TEST(RecoveryE2E, BrokerDownUpAndInjectedErrorsShortWindow) { broker_faults("5s"); }

}  // namespace
}  // namespace kdedup::testing
