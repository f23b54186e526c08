#include "repartition_topic.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <librdkafka/rdkafka.h>

#include "kafka_errors.h"

namespace kdedup::pipeline {
namespace {

constexpr int kTimeoutMs = 10'000;

/// Partition count per existing topic, from one metadata request for all
/// topics (asking for a named topic could auto-create it).
Result<std::map<std::string, int>> topic_partitions(RdKafka::Producer& producer) {
  RdKafka::Metadata* raw = nullptr;
  const RdKafka::ErrorCode err = producer.metadata(true, nullptr, &raw, kTimeoutMs);
  std::unique_ptr<RdKafka::Metadata> md(raw);
  if (err != RdKafka::ERR_NO_ERROR) {
    return fail("cannot read the cluster metadata: " + describe_kafka_error(err));
  }
  std::map<std::string, int> out;
  for (const auto* t : *md->topics()) {
    if (t->err() == RdKafka::ERR_NO_ERROR) {
      out[t->topic()] = static_cast<int>(t->partitions()->size());
    }
  }
  return out;
}

/// CreateTopics for the internal topic; success when created or when it
/// already exists (created meanwhile by another instance).
Status create_topic(RdKafka::Producer& producer, const config::RepartitionConfig& r) {
  rd_kafka_t* rk = producer.c_ptr();
  char errstr[512] = {0};
  rd_kafka_NewTopic_t* topic = rd_kafka_NewTopic_new(r.topic.c_str(), r.partitions,
                                                     r.replication_factor, errstr, sizeof errstr);
  if (topic == nullptr) return fail(fmt::format("repartition.topic '{}': {}", r.topic, errstr));
  std::unique_ptr<rd_kafka_NewTopic_t, decltype(&rd_kafka_NewTopic_destroy)> owned_topic(
      topic, rd_kafka_NewTopic_destroy);
  std::unique_ptr<rd_kafka_queue_t, decltype(&rd_kafka_queue_destroy)> queue(
      rd_kafka_queue_new(rk), rd_kafka_queue_destroy);
  std::unique_ptr<rd_kafka_AdminOptions_t, decltype(&rd_kafka_AdminOptions_destroy)> options(
      rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATETOPICS), rd_kafka_AdminOptions_destroy);
  rd_kafka_AdminOptions_set_request_timeout(options.get(), kTimeoutMs, errstr, sizeof errstr);
  rd_kafka_AdminOptions_set_operation_timeout(options.get(), kTimeoutMs, errstr, sizeof errstr);
  rd_kafka_CreateTopics(rk, &topic, 1, options.get(), queue.get());
  std::unique_ptr<rd_kafka_event_t, decltype(&rd_kafka_event_destroy)> event(
      rd_kafka_queue_poll(queue.get(), kTimeoutMs + 5'000), rd_kafka_event_destroy);
  if (!event) return fail(fmt::format("creating topic '{}' timed out", r.topic));
  if (rd_kafka_event_error(event.get()) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return fail(fmt::format("creating topic '{}' failed: {}", r.topic,
                            rd_kafka_event_error_string(event.get())));
  }
  const rd_kafka_CreateTopics_result_t* result = rd_kafka_event_CreateTopics_result(event.get());
  std::size_t n = 0;
  const rd_kafka_topic_result_t** results =
      result != nullptr ? rd_kafka_CreateTopics_result_topics(result, &n) : nullptr;
  if (n != 1) return fail(fmt::format("creating topic '{}': the broker did not answer", r.topic));
  const rd_kafka_resp_err_t err = rd_kafka_topic_result_error(results[0]);
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR && err != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) {
    const char* why = rd_kafka_topic_result_error_string(results[0]);
    return fail(fmt::format("creating topic '{}' with {} partitions failed: {}{}", r.topic,
                            r.partitions,
                            describe_kafka_error(static_cast<RdKafka::ErrorCode>(err)),
                            why != nullptr && *why != '\0' ? std::string(" (") + why + ")" : ""));
  }
  return {};
}

/// Waits until the metadata shows `topic` (a new topic takes a moment).
Result<int> wait_for_topic(RdKafka::Producer& producer, const std::string& topic) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
  for (;;) {
    auto topics = topic_partitions(producer);
    if (!topics) return fail(topics.error().message);
    if (auto it = topics->find(topic); it != topics->end() && it->second > 0) return it->second;
    if (std::chrono::steady_clock::now() >= deadline) {
      return fail(fmt::format("topic '{}' was created but does not appear in the metadata", topic));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

Status prepare_repartition_topics(RdKafka::Producer& producer, const config::Config& config) {
  const config::RepartitionConfig& r = config.repartition;
  auto topics = topic_partitions(producer);
  if (!topics) return fail(topics.error().message);
  std::vector<std::string> errors;
  for (const auto& t : config.input.topics) {
    if (!topics->count(t)) {
      errors.push_back("input.topics: topic '" + t +
                       "' does not exist; create it (or fix the name)");
    }
  }
  if (config.on_invalid == config::OnInvalid::kDlq && !topics->count(config.dlq_topic)) {
    errors.push_back("dlq_topic: topic '" + config.dlq_topic +
                     "' does not exist; create it (or fix the name)");
  }
  std::optional<int> count;
  if (auto it = topics->find(r.topic); it != topics->end()) {
    count = it->second;
  } else if (!r.create_topic) {
    errors.push_back(fmt::format(
        "repartition.topic: the internal topic '{}' does not exist and repartition.create_topic "
        "is false; create it with {} partitions (repartition.partitions), or allow kdedup to",
        r.topic, r.partitions));
  } else if (auto created = create_topic(producer, r); !created) {
    errors.push_back("repartition.topic: " + created.error().message +
                     "; create it yourself with " + std::to_string(r.partitions) +
                     " partitions and set repartition.create_topic: false");
  } else if (auto shown = wait_for_topic(producer, r.topic); !shown) {
    errors.push_back("repartition.topic: " + shown.error().message);
  } else {
    count = *shown;
    spdlog::info("repartition: created the internal topic '{}' with {} partitions", r.topic,
                 *shown);
  }
  if (count && *count != r.partitions) {
    errors.push_back(fmt::format(
        "repartition.partitions: the internal topic '{}' has {} partitions but the config says "
        "{}; records of one identity would land in a different slice than before (and the dedup "
        "stage's state would not match). Set repartition.partitions: {}, or use a new topic name",
        r.topic, *count, r.partitions, *count));
  } else if (count) {
    spdlog::info("repartition: internal topic '{}': {} partitions", r.topic, *count);
  }
  if (errors.empty()) return {};
  std::string joined;
  for (const auto& e : errors) joined += (joined.empty() ? "" : "\n") + e;
  return fail(joined);
}

}  // namespace kdedup::pipeline
