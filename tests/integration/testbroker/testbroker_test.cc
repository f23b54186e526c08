// `kdedup testbroker` as clients see it: kcat produces and consumes, consumer
// groups commit offsets, injected faults (broker down, RTT, request errors)
// take effect, and SIGTERM stops it cleanly.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <regex>
#include <set>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "broker.h"
#include "kdedup/testbroker/child_process.h"
#include "kdedup/testbroker/kafka_io.h"
#include "process.h"

namespace kdedup::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

std::vector<std::string> keyed_lines(int n, const std::string& prefix) {
  std::vector<std::string> lines;
  for (int i = 0; i < n; ++i)
    lines.push_back(prefix + "-k" + std::to_string(i % 17) + "\tvalue-" + std::to_string(i));
  return lines;
}

TEST(TestBroker, PrintsBootstrapFirstAndWritesBootstrapFile) {
  TempDir dir;
  auto child =
      testbroker::ChildProcess::spawn({KDEDUP_BINARY, "testbroker", "--brokers", "2", "--topic",
                                       "a:2", "--bootstrap-file", dir.file("bootstrap")},
                                      {.pipe_stdout = true});
  ASSERT_TRUE(child) << child.error().message;
  auto line = (*child)->read_line(std::chrono::seconds(20));
  ASSERT_TRUE(line) << line.error().message;
  EXPECT_TRUE(std::regex_match(*line, std::regex(R"(127\.0\.0\.1:\d+,127\.0\.0\.1:\d+)"))) << *line;
  EXPECT_EQ(read_file(dir.file("bootstrap")), *line + "\n");
  EXPECT_EQ((*child)->stop(), 0);
}

TEST(TestBroker, KcatProducesAndConsumesAcrossPartitions) {
  auto broker = TestBroker::start({.brokers = 3, .topics = {"events:3"}});
  ASSERT_TRUE(broker) << broker.error().message;
  auto& b = **broker;
  auto lines = keyed_lines(300, "p");
  auto produced = b.kcat_produce("events", lines);
  ASSERT_EQ(produced.exit_code, 0) << produced.err;

  auto consumed = b.kcat_consume("events");
  ASSERT_EQ(consumed.exit_code, 0) << consumed.err;
  auto got = split_lines(consumed.out);
  std::multiset<std::string> want_set(lines.begin(), lines.end());
  std::multiset<std::string> got_set(got.begin(), got.end());
  EXPECT_EQ(got_set, want_set);

  // The same records through librdkafka, with per-partition key affinity.
  auto records = b.read_topic("events");
  ASSERT_TRUE(records) << records.error().message;
  ASSERT_EQ(records->size(), 300u);
  std::map<std::string, std::set<std::int32_t>> partitions_of_key;
  std::set<std::int32_t> used;
  for (const auto& r : *records) {
    ASSERT_TRUE(r.key);
    partitions_of_key[*r.key].insert(r.partition);
    used.insert(r.partition);
  }
  for (const auto& [key, parts] : partitions_of_key) EXPECT_EQ(parts.size(), 1u) << key;
  EXPECT_EQ(used.size(), 3u);
  auto marks = b.watermarks("events");
  ASSERT_TRUE(marks) << marks.error().message;
  std::int64_t total = 0;
  for (const auto& m : *marks) {
    EXPECT_EQ(m.low, 0);
    total += m.high;
  }
  EXPECT_EQ(total, 300);
}

TEST(TestBroker, HeadersAndTimestampsRoundTrip) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"h:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  auto& b = **broker;
  ASSERT_TRUE(b.produce("h", {{.key = "k",
                               .value = "v",
                               .timestamp_ms = 1'700'000'000'123,
                               .headers = {{"source", "test"}}}}));
  auto consumed = b.kcat_consume("h", "%k|%s|%T|%h\n");
  ASSERT_EQ(consumed.exit_code, 0) << consumed.err;
  EXPECT_EQ(consumed.out, "k|v|1700000000123|source=test\n");
}

TEST(TestBroker, ConsumerGroupCommitsOffsets) {
  auto broker = TestBroker::start({.brokers = 3, .topics = {"g:4"}});
  ASSERT_TRUE(broker) << broker.error().message;
  auto& b = **broker;
  ASSERT_EQ(b.kcat_produce("g", keyed_lines(200, "g")).exit_code, 0);

  // kcat's balanced consumer joins the group, reads to the end of every
  // partition (-e) and commits on close.
  auto r = run_process({kcat_path(), "-b", b.bootstrap(), "-G", "kcat-group", "-o", "beginning",
                        "-e", "-q", "-f", "%s\n", "-X", "enable.auto.commit=true", "-X",
                        "auto.commit.interval.ms=100", "g"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(split_lines(r.out).size(), 200u);

  auto marks = b.watermarks("g");
  ASSERT_TRUE(marks) << marks.error().message;
  auto committed = b.committed("kcat-group", "g");
  ASSERT_TRUE(committed) << committed.error().message;
  ASSERT_EQ(committed->size(), 4u);
  for (const auto& m : *marks)
    EXPECT_EQ((*committed)[m.partition], m.high) << "partition " << m.partition;
}

TEST(TestBroker, BrokerDownFailsProduceUntilBackUp) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"d:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  auto& b = **broker;
  ASSERT_TRUE(b.produce("d", {{.key = "before", .value = "1"}}));

  auto down = b.control("broker 1 down");
  ASSERT_TRUE(down) << down.error().message;
  EXPECT_EQ(*down, "broker 1 down");
  auto failed = b.produce("d", {{.key = "during", .value = "2"}}, {{"message.timeout.ms", "1500"}});
  ASSERT_FALSE(failed) << "produce succeeded while the only broker was down";

  ASSERT_TRUE(b.control("broker 1 up"));
  auto after = b.produce("d", {{.key = "after", .value = "3"}}, {{"message.timeout.ms", "15000"}});
  ASSERT_TRUE(after) << after.error().message;
  auto consumed = b.kcat_consume("d", "%k\n");
  EXPECT_EQ(consumed.out, "before\nafter\n");
}

TEST(TestBroker, RttDelaysResponses) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"r:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  auto& b = **broker;
  auto timed_produce = [&] {
    auto start = Clock::now();
    EXPECT_TRUE(b.produce("r", {{.key = "k", .value = "v"}}));
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  };
  ASSERT_TRUE(b.control("rtt 1 800"));
  // A fresh producer needs several round trips (ApiVersions, Metadata,
  // InitProducerId, Produce): at least one full RTT is certain.
  auto slow = timed_produce();
  EXPECT_GE(slow.count(), 800) << "rtt 800 ms had no visible effect";
  ASSERT_TRUE(b.control("rtt 1 0"));
  auto rtt_error = b.control("rtt 7 10");
  ASSERT_FALSE(rtt_error);
  EXPECT_THAT(rtt_error.error().message, HasSubstr("no broker 7"));
}

TEST(TestBroker, PushedRequestErrorsReachTheClient) {
  auto broker = TestBroker::start({.brokers = 1, .topics = {"e:1"}});
  ASSERT_TRUE(broker) << broker.error().message;
  auto& b = **broker;
  auto pushed = b.control("errors Produce 1 MSG_SIZE_TOO_LARGE");
  ASSERT_TRUE(pushed) << pushed.error().message;
  // Not retriable: the producer reports the broker's error for the record.
  auto first = b.produce("e", {{.key = "k", .value = "v"}}, {{"enable.idempotence", "false"}});
  ASSERT_FALSE(first);
  EXPECT_THAT(first.error().message, HasSubstr("too large"));
  // The error stack is used up: the next request succeeds.
  auto second = b.produce("e", {{.key = "k", .value = "v"}}, {{"enable.idempotence", "false"}});
  EXPECT_TRUE(second) << second.error().message;

  // Retriable errors are retried by the client and the record lands once.
  ASSERT_TRUE(b.control("errors Produce 2 NOT_LEADER_OR_FOLLOWER REQUEST_TIMED_OUT"));
  auto retried = b.produce("e", {{.key = "k", .value = "retried"}});
  EXPECT_TRUE(retried) << retried.error().message;
  auto consumed = b.kcat_consume("e", "%s\n");
  EXPECT_EQ(consumed.out, "v\nretried\n");
}

TEST(TestBroker, ControlErrorsAndTopicCreation) {
  auto broker = TestBroker::start({.brokers = 2});
  ASSERT_TRUE(broker) << broker.error().message;
  auto& b = **broker;
  auto unknown = b.control("launch rockets");
  ASSERT_FALSE(unknown);
  EXPECT_THAT(unknown.error().message, HasSubstr("unknown command 'launch'"));
  ASSERT_TRUE(b.create_topic("made", 5));
  auto again = b.create_topic("made", 5);
  EXPECT_FALSE(again);
  auto too_many = b.create_topic("wide", 1, 3);
  ASSERT_FALSE(too_many);
  EXPECT_THAT(too_many.error().message, HasSubstr("replication 3"));
  auto marks = b.watermarks("made");
  ASSERT_TRUE(marks) << marks.error().message;
  EXPECT_EQ(marks->size(), 5u);
  auto help = b.control("help");
  ASSERT_TRUE(help);
  EXPECT_THAT(*help, HasSubstr("errors <Api>"));
}

TEST(TestBroker, ControlPortServesTheSameCommands) {
  auto child = testbroker::ChildProcess::spawn(
      {KDEDUP_BINARY, "testbroker", "--brokers", "1", "--control-port", "0"},
      {.pipe_stdout = true});
  ASSERT_TRUE(child) << child.error().message;
  ASSERT_TRUE((*child)->read_line(std::chrono::seconds(20)));
  auto control = (*child)->read_line(std::chrono::seconds(5));
  ASSERT_TRUE(control) << control.error().message;
  std::smatch m;
  ASSERT_TRUE(std::regex_match(*control, m, std::regex(R"(control 127\.0\.0\.1:(\d+))")))
      << *control;

  int s = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(s, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(std::stoi(m[1])));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  std::string req = "topic create viaport 2\nbogus\nbroker 1 down\n";
  ASSERT_EQ(write(s, req.data(), req.size()), static_cast<ssize_t>(req.size()));
  std::string got;
  char buf[1024];
  while (std::count(got.begin(), got.end(), '\n') < 3) {
    ssize_t n = read(s, buf, sizeof buf);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<std::size_t>(n));
  }
  close(s);
  auto lines = split_lines(got);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_THAT(lines[0], StartsWith("ok topic viaport"));
  EXPECT_THAT(lines[1], StartsWith("error unknown command 'bogus'"));
  EXPECT_EQ(lines[2], "ok broker 1 down");
  EXPECT_EQ((*child)->stop(), 0);
}

TEST(TestBroker, SigtermAndSigintStopCleanly) {
  for (int sig : {SIGTERM, SIGINT}) {
    auto broker = TestBroker::start({.brokers = 3, .topics = {"s:2"}});
    ASSERT_TRUE(broker) << broker.error().message;
    ASSERT_EQ((*broker)->kcat_produce("s", keyed_lines(10, "s")).exit_code, 0);
    (*broker)->process().signal(sig);
    auto status = (*broker)->process().wait(std::chrono::seconds(10));
    ASSERT_TRUE(status) << "broker did not exit on signal " << sig;
    EXPECT_EQ(*status, 0) << "signal " << sig;
  }
}

TEST(TestBroker, QuitCommandStops) {
  auto broker = TestBroker::start({.brokers = 1});
  ASSERT_TRUE(broker) << broker.error().message;
  auto r = (*broker)->control("quit");
  ASSERT_TRUE(r) << r.error().message;
  auto status = (*broker)->process().wait(std::chrono::seconds(10));
  ASSERT_TRUE(status);
  EXPECT_EQ(*status, 0);
}

TEST(TestBroker, BadTopicSpecIsAUsageError) {
  auto r = run_kdedup({"testbroker", "--topic", "nopartitions"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--topic 'nopartitions'"));
  auto r2 = run_kdedup({"testbroker", "--brokers", "1", "--topic", "x:2:3"});
  EXPECT_EQ(r2.exit_code, 2);
  EXPECT_THAT(r2.err, HasSubstr("replication 3"));
}

}  // namespace
}  // namespace kdedup::testing
