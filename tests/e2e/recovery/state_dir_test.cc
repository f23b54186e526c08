// state.dir problems: at start-up a missing parent, a file instead of a
// directory, a directory the service user cannot write, and a directory
// locked by a running instance each stop `kdedup run` with exit 2 and a
// message naming state.dir; a full volume (state.min_free_bytes larger than
// the free space) refuses the first snapshot and stops cleanly with exit 1,
// committed offsets covering only what was emitted, and a restart with a
// sane reserve continues with nothing lost or duplicated.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <iostream>

#include "harness.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;

/// Runs `instance` until it exits by itself (or 40 s: then it is stopped
/// and -1 returned).
int exit_code_of(Instance& instance) {
  if (!instance.start()) return -2;
  if (auto code = instance.wait_exit(40s)) return *code;
  instance.stop();
  return -1;
}

void expect_names_state_dir(const Instance& i, const std::string& dir) {
  const std::string log = i.run_log();
  EXPECT_NE(log.find("state.dir"), std::string::npos) << log;
  EXPECT_NE(log.find(dir), std::string::npos) << log;
  std::cout << i.name() << ": " << first_line_with(log, "state.dir") << std::endl;
}

TEST(RecoveryE2E, StateDirProblemsAtStartupExitTwoNamingIt) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:2", "out:2", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  RunSettings s;
  s.group = "statedir";

  s.state_dir = dir.file("no-such-parent/state");
  Instance missing("missing-parent", dir, b.bootstrap(), s);
  EXPECT_EQ(exit_code_of(missing), 2) << missing.log_tail();
  expect_names_state_dir(missing, s.state_dir);
  std::cout << "missing parent: exit 2 naming state.dir" << std::endl;

  write_file(dir.file("a-file"), "not a directory\n");
  s.state_dir = dir.file("a-file");
  Instance file("not-a-dir", dir, b.bootstrap(), s);
  EXPECT_EQ(exit_code_of(file), 2) << file.log_tail();
  expect_names_state_dir(file, s.state_dir);
  std::cout << "a file instead of a directory: exit 2 naming state.dir" << std::endl;

  // Unwritable: root ignores permission bits, so the child runs as nobody
  // (setpriv from util-linux) against a root-owned 0755 directory. The
  // control run with a directory nobody may write proves the rest of the
  // setup (config, log, binary) works for that user.
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  const std::string ro = dir.file("root-owned");
  ASSERT_EQ(::mkdir(ro.c_str(), 0755), 0);
  const std::string rw = dir.file("nobody-writable");
  ASSERT_EQ(::mkdir(rw.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(rw.c_str(), 0777), 0);
  auto as_nobody = [&](const std::string& name, const std::string& state_dir) {
    write_file(dir.file(name + ".yaml"), run_config_yaml(b.bootstrap(), [&] {
                 RunSettings n = s;
                 n.state_dir = state_dir;
                 return n;
               }()));
    ::chmod(dir.file(name + ".yaml").c_str(), 0644);
    testbroker::ChildOptions o;
    o.stderr_file = dir.file(name + ".log");
    return testbroker::ChildProcess::spawn(
        {"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", KDEDUP_BINARY, "run",
         "--config", dir.file(name + ".yaml")},
        o);
  };
  {
    auto child = as_nobody("unwritable", ro);
    ASSERT_TRUE(child) << child.error().message;
    auto code = (*child)->wait(40s);
    const std::string log = read_file(dir.file("unwritable.log"));
    EXPECT_EQ(code, 2) << log;
    EXPECT_NE(log.find("state.dir"), std::string::npos) << log;
    EXPECT_NE(log.find(ro), std::string::npos) << log;
    std::cout << "unwritable: " << first_line_with(log, "state.dir") << std::endl;
  }
  {
    auto child = as_nobody("writable", rw + "/state");
    ASSERT_TRUE(child) << child.error().message;
    auto early = (*child)->wait(8s);
    const std::string log = read_file(dir.file("writable.log"));
    EXPECT_FALSE(early) << "nobody with a writable state dir must keep running:\n" << log;
    EXPECT_EQ((*child)->stop(30s), 0) << log;
  }
  std::cout << "unwritable (as uid 65534): exit 2 naming state.dir; writable control run ok"
            << std::endl;

  s.state_dir = dir.file("shared-state");
  Instance owner("owner", dir, b.bootstrap(), s);
  ASSERT_TRUE(owner.start());
  ASSERT_TRUE(owner.wait_ready(60s)) << owner.log_tail();
  Instance second("second", dir, b.bootstrap(), s);
  EXPECT_EQ(exit_code_of(second), 2) << second.log_tail();
  expect_names_state_dir(second, s.state_dir);
  EXPECT_NE(second.run_log().find("another kdedup instance"), std::string::npos)
      << second.log_tail();
  EXPECT_TRUE(owner.running()) << owner.log_tail();
  EXPECT_EQ(owner.stop(), 0) << owner.log_tail();
  std::cout << "locked by a running instance: the second exits 2, the owner runs on" << std::endl;
}

TEST(RecoveryE2E, DiskFullStopsCleanlyAndARestartContinues) {
  const auto t0 = std::chrono::steady_clock::now();
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:2", "out:2", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  TempDir dir;
  RunSettings s;
  s.group = "diskfull";
  s.state_dir = dir.file("state");
  s.snapshot_interval = "500ms";
  s.min_free_bytes = "1000TiB";
  Instance full("full", dir, b.bootstrap(), s);
  ASSERT_TRUE(full.start());
  ASSERT_TRUE(full.wait_ready(60s)) << full.log_tail();
  // Records arrive while it runs: the first due snapshot is refused.
  Feeder feeder(
      b.bootstrap(),
      {.partitions = 2, .domain = 500, .per_second = 500, .seed = 5, .limit = 2000, .drift = 0.2});
  auto code = full.wait_exit(30s);
  ASSERT_TRUE(code) << "a refused snapshot must stop the service\n" << full.log_tail();
  EXPECT_EQ(*code, 1) << full.log_tail();
  EXPECT_NE(full.log().find("disk full"), std::string::npos) << full.log_tail();
  EXPECT_NE(full.log().find(s.state_dir), std::string::npos) << full.log_tail();

  ASSERT_TRUE(feeder.wait_done(30s));
  ASSERT_TRUE(feeder.stop()) << feeder.error();
  std::cout << "disk full: exit 1 with: " << first_line_with(full.log(), "disk full") << std::endl;

  // What was committed was emitted: the oracle restricted to the committed
  // prefix of each partition is all in the output, nothing twice.
  auto committed = b.committed("diskfull", "in");
  ASSERT_TRUE(committed);
  auto in = b.read_topic("in");
  auto out = b.read_topic("out");
  ASSERT_TRUE(in && out);
  std::vector<testbroker::KafkaRecord> prefix;
  for (const auto& r : *in) {
    if (r.offset < (*committed)[static_cast<std::size_t>(r.partition)]) prefix.push_back(r);
  }
  std::vector<testbroker::KafkaRecord> out_prefix;
  for (const auto& r : *out) {
    auto off = r.header("kdedup-source-offset");
    auto part = r.header("kdedup-source-partition");
    if (off && part && std::stoll(*off) < (*committed)[std::stoul(*part)]) out_prefix.push_back(r);
  }
  auto prefix_in = to_input_records(prefix, "key");
  ASSERT_TRUE(prefix_in);
  auto partial =
      verify_output(*prefix_in, to_output_records(out_prefix), VerifySpec{.window_ms = 3'600'000});
  std::cout << "after the disk-full stop, committed " << (*committed)[0] << "/" << (*committed)[1]
            << ", output " << out->size() << " records; committed prefix: " << partial.to_string();
  EXPECT_TRUE(partial.ok()) << partial.to_string();

  s.min_free_bytes = "1MiB";
  Instance again("restart", dir, b.bootstrap(), s);
  ASSERT_TRUE(again.start());
  EXPECT_TRUE(wait_committed_to_end(b, "diskfull", "in", 60s)) << again.log_tail();
  std::this_thread::sleep_for(1500ms);  // at least one snapshot interval
  EXPECT_EQ(again.metric("kdedup_snapshot_failures_total").value_or(0), 0) << again.log_tail();
  EXPECT_EQ(again.stop(), 0) << again.log_tail();
  auto report = verify_topics(b, "in", "out", 3'600'000);
  ASSERT_TRUE(report) << report.error().message;
  EXPECT_TRUE(report->ok()) << report->to_string();
  EXPECT_EQ(report->input_records, 2000u);
  std::cout << "DiskFullStopsCleanlyAndARestartContinues took " << seconds_since(t0) << " s"
            << std::endl;
}

}  // namespace
}  // namespace kdedup::testing
