// Recovery wired into `kdedup run` (DESIGN.md "Recovery protocol"), with the
// real binary against the test broker process:
// - a graceful restart with the same state dir restores every partition
//   from its snapshot (log, kdedup_restores_total, `kdedup snapshot
//   inspect` shows what the run wrote at the committed offsets), and a
//   restart after the state dir was deleted rebuilds by replaying the input
//   (kdedup_rebuilds_total, replayed records); across all runs the output is
//   exactly the oracle and nothing is emitted twice;
// - an instance killed with SIGKILL after producing but before committing is
//   restarted and emits nothing twice: output reconciliation finds what it
//   already emitted (output.partitioning: key, so the emitted-offset set and
//   not "everything up to the highest" decides);
// - a state dir that cannot be used stops the start with exit 2.

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "broker.h"
#include "http_get.h"
#include "kdedup/testbroker/child_process.h"
#include "metrics_doc.h"
#include "prometheus_query.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;
using testbroker::ChildOptions;
using testbroker::ChildProcess;
using Id = std::pair<std::int32_t, std::int64_t>;

std::string config_yaml(const std::string& bootstrap, const std::string& state_dir,
                        const std::string& extra = "", const std::string& partitioning = "input") {
  return "group_id: recovery\n"
         "input:\n  topics: [in]\n"
         "output:\n  topic: out\n  partitioning: " +
         partitioning +
         "\n"
         "identity:\n  extractor: key\n  salt: recovery-salt\n"
         "window: 10m\n"
         "filter:\n  type: timer\n  fpp: 0.0001\n  capacity: 20000\n"
         "threads: 2\n"
         "batch_size: 64\n"
         "on_invalid: dlq\n"
         "dlq_topic: dlq\n"
         "shutdown_timeout: 10s\n"
         "kafka:\n  bootstrap.servers: \"" +
         bootstrap +
         "\"\n"
         "consumer:\n  session.timeout.ms: \"6000\"\n  heartbeat.interval.ms: \"500\"\n"
         "state:\n  dir: \"" +
         state_dir + "\"\n  snapshot_interval: 1s\n" + extra;
}

/// One `kdedup run` child with its log in a file and metrics on a free port.
struct Instance {
  std::unique_ptr<ChildProcess> process;
  std::string log_path;
  int port = 0;
  std::string log() const { return read_file(log_path); }
  std::string metrics() const { return http_get(port, "/metrics").body; }
};

Instance start(const TempDir& dir, const std::string& name, const std::string& config,
               const std::vector<std::string>& sets = {}) {
  Instance i;
  i.log_path = dir.file(name + ".log");
  i.port = free_port();
  ChildOptions o;
  o.stderr_file = i.log_path;
  std::vector<std::string> argv{
      KDEDUP_BINARY, "run",   "--config",
      config,        "--set", "metrics.address=127.0.0.1:" + std::to_string(i.port)};
  for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
  auto p = ChildProcess::spawn(argv, o);
  EXPECT_TRUE(p) << p.error().message;
  if (p) i.process = std::move(*p);
  return i;
}

double sum_samples(const std::string& text, const std::string& name) {
  return exposition_sum(text, name).value_or(0.0);
}

/// Produces `n` records over `partitions` partitions, key = key_of(i).
void produce(TestBroker& b, int from, int n, int partitions,
             const std::function<std::string(int)>& key_of) {
  std::vector<TestRecord> recs;
  for (int i = from; i < from + n; ++i) {
    recs.push_back(
        {.key = key_of(i), .value = "v" + std::to_string(i), .partition = i % partitions});
  }
  ASSERT_TRUE(b.produce("in", recs));
}

/// Waits until the group committed the end of every input partition.
bool wait_committed_to_end(TestBroker& b, const Instance& i, std::chrono::seconds timeout = 40s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    auto marks = b.watermarks("in");
    auto c = b.committed("recovery", "in");
    bool done = marks && c;
    if (done) {
      for (const auto& m : *marks) done = done && (*c)[m.partition] == m.high;
    }
    if (done) return true;
    if (i.process->poll_exit()) return false;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

/// The exact oracle: per partition, the first record of each key (every
/// record here is inside one window).
std::set<Id> oracle(const std::vector<KafkaRecord>& input) {
  std::set<Id> out;
  std::set<std::pair<std::int32_t, std::string>> seen;
  for (const auto& r : input) {
    if (seen.insert({r.partition, *r.key}).second) out.insert({r.partition, r.offset});
  }
  return out;
}

/// Source (partition, offset) of every output record; fails on a record
/// emitted twice.
std::set<Id> emitted(TestBroker& b) {
  std::set<Id> ids;
  auto out = b.read_topic("out");
  EXPECT_TRUE(out) << out.error().message;
  if (!out) return ids;
  for (const auto& r : *out) {
    Id id{std::stoi(*r.header("kdedup-source-partition")),
          std::stoll(*r.header("kdedup-source-offset"))};
    EXPECT_TRUE(ids.insert(id).second) << id.first << "@" << id.second << " emitted twice";
  }
  return ids;
}

TEST(RecoveryRun, RestartRestoresFromSnapshotsAndWithoutThemRebuildsByReplay) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:2", "out:2", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  const std::string state = dir.file("state");
  write_file(dir.file("c.yaml"), config_yaml(b.bootstrap(), state));
  auto key = [](int i) { return "user-" + std::to_string(i % 300); };

  // Run 1: a fresh group; snapshots on the graceful stop.
  produce(b, 0, 1000, 2, key);
  {
    auto run = start(dir, "run1", dir.file("c.yaml"));
    ASSERT_TRUE(run.process);
    ASSERT_TRUE(wait_committed_to_end(b, run)) << run.log();
    run.process->signal(SIGTERM);
    ASSERT_EQ(run.process->wait(20s), 0) << run.log();
    EXPECT_NE(run.log().find("fresh_partition"), std::string::npos) << run.log();
  }
  auto committed = b.committed("recovery", "in");
  ASSERT_TRUE(committed);
  // What the run wrote, as an operator sees it: one snapshot per partition
  // at exactly the committed offset.
  auto inspect = run_kdedup({"snapshot", "inspect", "--state-dir", state, "--json"});
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  for (int p = 0; p < 2; ++p) {
    EXPECT_NE(inspect.out.find("\"next_offset\":" + std::to_string((*committed)[p])),
              std::string::npos)
        << inspect.out;
  }

  // Run 2: the same state dir restores both partitions; keys seen in run 1
  // are still duplicates.
  produce(b, 1000, 600, 2, [](int i) { return "user-" + std::to_string(i % 400); });
  {
    auto run = start(dir, "run2", dir.file("c.yaml"));
    ASSERT_TRUE(run.process);
    ASSERT_TRUE(wait_committed_to_end(b, run)) << run.log();
    std::string text;
    for (int i = 0; i < 50 && sum_samples(text, "kdedup_records_in_total") < 600; ++i) {
      std::this_thread::sleep_for(100ms);
      text = run.metrics();
    }
    EXPECT_EQ(sum_samples(text, "kdedup_restores_total"), 2) << text;
    EXPECT_EQ(sum_samples(text, "kdedup_rebuilds_total"), 0);
    EXPECT_EQ(sum_samples(text, "kdedup_records_in_total"), 600);
    EXPECT_GT(sum_samples(text, "kdedup_restore_read_bytes_total"), 0);
    EXPECT_EQ(http_get(run.port, "/readyz").status, 200);
    run.process->signal(SIGTERM);
    ASSERT_EQ(run.process->wait(20s), 0) << run.log();
    EXPECT_NE(
        run.log().find("in[0]: restored snapshot at offset " + std::to_string((*committed)[0])),
        std::string::npos)
        << run.log();
    EXPECT_EQ(run.log().find("rebuild_from_window"), std::string::npos) << run.log();
  }
  auto input = b.read_topic("in");
  ASSERT_TRUE(input);
  EXPECT_EQ(emitted(b), oracle(*input));

  // Run 3: the state dir is gone: every partition is rebuilt by replaying
  // the window before its committed offset (all 1600 records), nothing is
  // emitted for them, and new records are judged against all of them.
  std::filesystem::remove_all(state);
  produce(b, 1600, 400, 2, [](int i) { return "user-" + std::to_string(i % 500); });
  {
    auto run = start(dir, "run3", dir.file("c.yaml"));
    ASSERT_TRUE(run.process);
    ASSERT_TRUE(wait_committed_to_end(b, run)) << run.log();
    std::string text;
    for (int i = 0; i < 50 && sum_samples(text, "kdedup_records_in_total") < 400; ++i) {
      std::this_thread::sleep_for(100ms);
      text = run.metrics();
    }
    EXPECT_EQ(sum_samples(text, "kdedup_rebuilds_total"), 2) << text;
    EXPECT_EQ(sum_samples(text, "kdedup_restores_total"), 0);
    EXPECT_EQ(sum_samples(text, "kdedup_rebuild_replayed_records_total"), 1600);
    EXPECT_EQ(sum_samples(text, "kdedup_records_in_total"), 400);
    run.process->signal(SIGTERM);
    ASSERT_EQ(run.process->wait(20s), 0) << run.log();
    EXPECT_NE(run.log().find("no snapshot; rebuilding from offset 0"), std::string::npos)
        << run.log();
  }
  input = b.read_topic("in");
  ASSERT_TRUE(input);
  EXPECT_EQ(emitted(b), oracle(*input));
}

TEST(RecoveryRun, KilledBeforeCommittingRestartsWithoutDuplicates) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:2", "out:3", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  // Commits far apart: the kill lands after the outputs were produced and
  // before any offset was committed. Output partitioned by key, so a source
  // partition's records spread over all output partitions.
  write_file(dir.file("c.yaml"),
             config_yaml(b.bootstrap(), dir.file("state"), "commit_interval: 60s\n", "key"));
  produce(b, 0, 800, 2, [](int i) { return "user-" + std::to_string(i % 250); });
  auto input = b.read_topic("in");
  ASSERT_TRUE(input);
  const auto want = oracle(*input);

  auto first = start(dir, "first", dir.file("c.yaml"));
  ASSERT_TRUE(first.process);
  for (int i = 0; i < 300; ++i) {
    auto marks = b.watermarks("out");
    std::int64_t n = 0;
    if (marks) {
      for (const auto& m : *marks) n += m.high;
    }
    if (n >= static_cast<std::int64_t>(want.size())) break;
    std::this_thread::sleep_for(100ms);
  }
  first.process->signal(SIGKILL);
  first.process->wait(10s);
  auto committed = b.committed("recovery", "in");
  ASSERT_TRUE(committed);
  EXPECT_EQ((*committed)[0], -1) << "the kill should come before the first commit";
  EXPECT_EQ(emitted(b), want) << "everything was produced before the kill";

  // The restart finds every emitted source offset in the output tail and
  // replays them without producing.
  auto second = start(dir, "second", dir.file("c.yaml"), {"commit_interval=200ms"});
  ASSERT_TRUE(second.process);
  // Wait until every record went through (as input or replayed), then stop,
  // which commits.
  std::string text;
  for (int i = 0; i < 400; ++i) {
    text = second.metrics();
    if (sum_samples(text, "kdedup_records_in_total") +
            sum_samples(text, "kdedup_rebuild_replayed_records_total") >=
        800) {
      break;
    }
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(sum_samples(text, "kdedup_rebuild_replayed_records_total"), want.size())
      << "exactly the emitted records are replayed" << second.log();
  EXPECT_EQ(sum_samples(text, "kdedup_records_distinct_total"), 0) << text;
  second.process->signal(SIGTERM);
  ASSERT_EQ(second.process->wait(20s), 0) << second.log();
  committed = b.committed("recovery", "in");
  ASSERT_TRUE(committed);
  EXPECT_EQ((*committed)[0] + (*committed)[1], 800);
  EXPECT_NE(second.log().find("output already holds source offsets up to"), std::string::npos)
      << second.log();
  EXPECT_EQ(emitted(b), want);
}

TEST(RecoveryRun, UnusableStateDirStopsTheStart) {
  TempDir dir;
  write_file(dir.file("file"), "not a directory");
  write_file(dir.file("c.yaml"), config_yaml("127.0.0.1:1", dir.file("file")));
  auto r = run_kdedup({"run", "--config", dir.file("c.yaml")});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("state.dir"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(dir.file("file")), std::string::npos) << r.err;

  write_file(dir.file("c2.yaml"), config_yaml("127.0.0.1:1", dir.file("missing/parent/state")));
  r = run_kdedup({"run", "--config", dir.file("c2.yaml")});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("missing/parent"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kdedup::testing
