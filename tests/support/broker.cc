#include "broker.h"

#include <chrono>
#include <sstream>

namespace kdedup::testing {

std::string kcat_path() {
  auto p = testbroker::find_program("kcat");
  return p ? *p : std::string("kcat");
}

Result<std::unique_ptr<TestBroker>> TestBroker::start(Options options) {
  testbroker::BrokerOptions bo;
  bo.kdedup_binary = KDEDUP_BINARY;
  bo.brokers = options.brokers;
  bo.topics = std::move(options.topics);
  auto b = testbroker::BrokerProcess::start(bo);
  if (!b) return tl::unexpected(b.error());
  return std::unique_ptr<TestBroker>(new TestBroker(std::move(*b)));
}

Result<std::string> TestBroker::control(const std::string& command) {
  return broker_->control(command);
}

Status TestBroker::create_topic(const std::string& name, int partitions, int replication) {
  std::string cmd = "topic create " + name + " " + std::to_string(partitions);
  if (replication > 0) cmd += " " + std::to_string(replication);
  auto r = control(cmd);
  if (!r) return tl::unexpected(r.error());
  return {};
}

Status TestBroker::produce(const std::string& topic, const std::vector<TestRecord>& records,
                           const testbroker::KafkaProperties& extra) {
  auto producer = testbroker::RecordProducer::create(bootstrap(), extra);
  if (!producer) return tl::unexpected(producer.error());
  for (const auto& r : records) {
    std::optional<std::string_view> key;
    if (r.key) key = *r.key;
    auto ok = (*producer)->produce(topic, r.partition, key, r.value, r.timestamp_ms, r.headers);
    if (!ok) return ok;
  }
  return (*producer)->flush(std::chrono::seconds(30));
}

ProcessResult TestBroker::kcat_produce(const std::string& topic,
                                       const std::vector<std::string>& lines,
                                       std::optional<char> key_delimiter,
                                       const std::vector<std::string>& extra_args) {
  std::vector<std::string> argv{kcat_path(), "-P", "-b", bootstrap(), "-t", topic};
  if (key_delimiter) argv.insert(argv.end(), {"-K", std::string(1, *key_delimiter)});
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  std::ostringstream input;
  for (const auto& l : lines) input << l << "\n";
  return run_process(argv, input.str());
}

ProcessResult TestBroker::kcat_consume(const std::string& topic, const std::string& format,
                                       const std::vector<std::string>& extra_args) {
  std::vector<std::string> argv{kcat_path(), "-C",        "-b", bootstrap(), "-t", topic,
                                "-o",        "beginning", "-e", "-q",        "-f", format};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  return run_process(argv);
}

Result<std::vector<KafkaRecord>> TestBroker::read_topic(const std::string& topic,
                                                        std::chrono::milliseconds timeout) {
  return testbroker::read_topic(bootstrap(), topic, timeout);
}

Result<std::vector<PartitionWatermarks>> TestBroker::watermarks(const std::string& topic) {
  return testbroker::query_watermarks(bootstrap(), topic);
}

Result<std::vector<std::int64_t>> TestBroker::committed(const std::string& group,
                                                        const std::string& topic) {
  return testbroker::committed_offsets(bootstrap(), group, topic);
}

}  // namespace kdedup::testing
