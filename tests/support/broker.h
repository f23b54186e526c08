#pragma once
// TestBroker: the fixture every integration and e2e test that needs Kafka
// uses. It runs `kdedup testbroker` as a child process on 127.0.0.1, reads the
// bootstrap line, sends control commands ("broker 1 down", "rtt 2 300",
// "errors Produce 3 NOT_LEADER_OR_FOLLOWER"), and offers clients: kcat (a
// real, independent client) and librdkafka for producing and reading topics.
// The destructor stops the broker (SIGTERM, then SIGKILL after a grace time).
//
//   auto broker = TestBroker::start({.topics = {"in:4", "out:4"}});
//   ASSERT_TRUE(broker) << broker.error().message;
//   (*broker)->kcat_produce("in", {"k1\tv1", "k2\tv2"});
//   auto records = (*broker)->read_topic("out");
//
// Owned by one test thread.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kdedup/common/result.h"
#include "kdedup/testbroker/broker_process.h"
#include "kdedup/testbroker/kafka_io.h"
#include "process.h"

namespace kdedup::testing {

using testbroker::Header;
using testbroker::KafkaRecord;
using testbroker::PartitionWatermarks;

/// A record to produce. partition -1 = chosen from the key by librdkafka's
/// default partitioner (the same one kcat uses); timestamp 0 = now.
struct TestRecord {
  std::optional<std::string> key;
  std::string value;
  std::int64_t timestamp_ms = 0;
  std::vector<Header> headers;
  std::int32_t partition = -1;
};

class TestBroker {
 public:
  struct Options {
    int brokers = 3;
    std::vector<std::string> topics;  ///< "NAME:PARTITIONS[:REPLICATION]"
  };

  /// Starts the broker; fails with the broker's reason (stderr is inherited,
  /// so its log appears in the test output).
  [[nodiscard]] static Result<std::unique_ptr<TestBroker>> start(Options options);

  const std::string& bootstrap() const { return broker_->bootstrap(); }

  /// Runs one control command; the reply text after "ok ", or the error.
  [[nodiscard]] Result<std::string> control(const std::string& command);

  [[nodiscard]] Status create_topic(const std::string& name, int partitions, int replication = 0);

  /// Produces with librdkafka (idempotent producer) and waits for every ack.
  [[nodiscard]] Status produce(const std::string& topic, const std::vector<TestRecord>& records,
                               const testbroker::KafkaProperties& extra = {});

  /// Produces `lines` with kcat: "KEY<delim>VALUE" when key_delimiter is set,
  /// else values only. Extra kcat arguments (e.g. {"-p", "0"}) are appended.
  ProcessResult kcat_produce(const std::string& topic, const std::vector<std::string>& lines,
                             std::optional<char> key_delimiter = '\t',
                             const std::vector<std::string>& extra_args = {});

  /// Reads every partition of `topic` to its end with kcat, one line per
  /// record formatted with kcat's -f `format` (default "%k\t%s\n").
  /// Extra kcat arguments are appended.
  ProcessResult kcat_consume(const std::string& topic, const std::string& format = "%k\t%s\n",
                             const std::vector<std::string>& extra_args = {});

  /// Reads every partition of `topic` to its current end with librdkafka.
  [[nodiscard]] Result<std::vector<KafkaRecord>> read_topic(
      const std::string& topic, std::chrono::milliseconds timeout = std::chrono::seconds(30));

  [[nodiscard]] Result<std::vector<PartitionWatermarks>> watermarks(const std::string& topic);

  /// Committed offsets of `group` on `topic` by partition (-1 = none).
  [[nodiscard]] Result<std::vector<std::int64_t>> committed(const std::string& group,
                                                            const std::string& topic);

  /// SIGTERM and wait; the exit status (0 = clean).
  int stop() { return broker_->stop(); }
  testbroker::ChildProcess& process() { return broker_->process(); }

 private:
  explicit TestBroker(std::unique_ptr<testbroker::BrokerProcess> b) : broker_(std::move(b)) {}
  std::unique_ptr<testbroker::BrokerProcess> broker_;
};

/// Path of kcat (looked up in PATH).
std::string kcat_path();

}  // namespace kdedup::testing
