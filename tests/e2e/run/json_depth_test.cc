// The JSON nesting limit (identity::kMaxJsonDepth, README "Hostile records")
// through `kdedup run`: a value nested 1,024 levels deep (the outer object
// is level 1) is an identity like any other, one level more goes to the DLQ
// as not_json with a message naming the limit.

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <thread>

#include "broker.h"
#include "kdedup/testbroker/child_process.h"
#include "process.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;
using testbroker::ChildProcess;

std::string nested_json(const std::string& id, std::size_t levels) {
  return R"({"id":")" + id + R"(","deep":)" + std::string(levels - 1, '[') +
         std::string(levels - 1, ']') + "}";
}

TEST(RunE2E, JsonNestedDeeperThanTheLimitGoesToTheDlqAsNotJson) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:1", "out:1", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  const std::string at_limit = nested_json("at-limit", 1024);
  const std::string over = nested_json("over-limit", 1025);
  ASSERT_TRUE(b.produce("in", {{"k1", at_limit, 0, {}, 0}, {"k2", over, 0, {}, 0}}));

  TempDir dir;
  write_file(dir.file("c.yaml"),
             "group_id: json-depth\n"
             "input:\n  topics: [in]\n"
             "output:\n  topic: out\n"
             "identity:\n  extractor: json:/id\n  salt: json-depth-test-salt\n"
             "window: 1m\n"
             "filter:\n  type: exact\n"
             "dlq_topic: dlq\n"
             "commit_interval: 200ms\n"
             "kafka:\n  bootstrap.servers: \"" +
                 b.bootstrap() +
                 "\"\n"
                 "consumer:\n  session.timeout.ms: \"6000\"\n  heartbeat.interval.ms: \"500\"\n"
                 "metrics:\n  address: \"\"\n"
                 "state:\n  dir: \"\"\n");
  testbroker::ChildOptions o;
  o.stderr_file = dir.file("run.log");
  auto p = ChildProcess::spawn({KDEDUP_BINARY, "run", "--config", dir.file("c.yaml")}, o);
  ASSERT_TRUE(p) << p.error().message;
  std::vector<KafkaRecord> out, dlq;
  const auto deadline = std::chrono::steady_clock::now() + 40s;
  while (std::chrono::steady_clock::now() < deadline && (out.empty() || dlq.empty())) {
    if (auto r = b.read_topic("out", 5s)) out = std::move(*r);
    if (auto r = b.read_topic("dlq", 5s)) dlq = std::move(*r);
    std::this_thread::sleep_for(200ms);
  }
  (*p)->signal(SIGTERM);
  EXPECT_EQ((*p)->wait(30s), 0) << read_file(o.stderr_file);

  ASSERT_EQ(out.size(), 1u) << read_file(o.stderr_file);
  EXPECT_EQ(out[0].value, at_limit);
  ASSERT_EQ(dlq.size(), 1u) << read_file(o.stderr_file);
  EXPECT_EQ(dlq[0].value, over);
  EXPECT_EQ(dlq[0].header("kdedup-error").value_or(""), "not_json");
  EXPECT_NE(dlq[0].header("kdedup-error-message").value_or("").find("limit of 1024 levels"),
            std::string::npos)
      << dlq[0].header("kdedup-error-message").value_or("(none)");
}

}  // namespace
}  // namespace kdedup::testing
