// librdkafka's own log lines through `kdedup run`: with `kafka.debug` set,
// every client kdedup creates (the group consumer, the producer, and the
// short-lived consumers of output reconciliation and window-start lookups)
// logs through kdedup's logger. None may print librdkafka's raw
// "%7|1700000000.123|FAC|rdkafka#consumer-3| ..." lines to stderr, past the
// log format and level.

#include <gtest/gtest.h>

#include <regex>
#include <sstream>

#include "broker.h"
#include "process.h"
#include "run_until_output.h"

namespace kdedup::testing {
namespace {

std::string run_with_debug(TestBroker& b, const TempDir& dir, const std::string& name,
                           std::size_t expected_out) {
  write_file(dir.file(name + ".yaml"),
             "group_id: rdkafka-log\n"
             "input:\n  topics: [in]\n"
             "output:\n  topic: out\n"
             "identity:\n  salt: rdkafka-log-test-salt\n"
             "window: 1m\n"
             "filter:\n  type: exact\n"
             "dlq_topic: dlq\n"
             "commit_interval: 200ms\n"
             "kafka:\n  bootstrap.servers: \"" +
                 b.bootstrap() +
                 "\"\n  debug: \"generic,broker,metadata\"\n"
                 "consumer:\n  session.timeout.ms: \"6000\"\n  heartbeat.interval.ms: \"500\"\n"
                 "metrics:\n  address: \"\"\n"
                 "state:\n  dir: \"\"\n");
  return run_until_output(b, dir.file(name + ".yaml"), dir.file(name + ".log"), expected_out);
}

TEST(RunE2E, LibrdkafkaDebugLinesGoThroughTheLogger) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"in:2", "out:2", "dlq:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  TestBroker& b = **broker;
  ASSERT_TRUE(b.produce("in", {{"k1", "v1", 0, {}, 0}, {"k2", "v2", 0, {}, 1}}));
  TempDir dir;
  // The first run commits; the second has committed offsets, so it also
  // looks window starts up and reads the output tail.
  const std::string first = run_with_debug(b, dir, "first", 2);
  ASSERT_TRUE(b.produce("in", {{"k3", "v3", 0, {}, 0}, {"k4", "v4", 0, {}, 1}}));
  const std::string second = run_with_debug(b, dir, "second", 4);

  const std::regex raw(R"(^%[0-7]\|)");
  for (const std::string* log : {&first, &second}) {
    std::istringstream lines(*log);
    std::size_t raw_lines = 0, logged = 0;
    std::string example;
    for (std::string line; std::getline(lines, line);) {
      if (std::regex_search(line, raw)) {
        if (raw_lines++ == 0) example = line;
      }
      if (line.find(" librdkafka ") != std::string::npos) ++logged;
    }
    EXPECT_EQ(raw_lines, 0u) << "librdkafka wrote past the logger, e.g.\n" << example;
    EXPECT_GT(logged, 10u) << "the debug lines should be in kdedup's log\n" << *log;
  }
  // The recovery consumer's lines (output tail, window starts) are there too.
  EXPECT_NE(second.find("librdkafka recovery consumer"), std::string::npos) << second;
}

}  // namespace
}  // namespace kdedup::testing
