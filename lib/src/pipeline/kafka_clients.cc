// The librdkafka clients of `kdedup run` and the topic check (kafka_clients.h).

#include "kafka_clients.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <vector>

#include <librdkafka/rdkafka.h>

#include "fatal_error.h"
#include "kafka_errors.h"
#include "kdedup/common/kafka_log.h"

namespace kdedup::pipeline {

namespace {

// Statistics feed consumer lag and producer queue metrics; a user's
// statistics.interval.ms (kafka / consumer / producer) wins.
constexpr const char* kStatisticsEveryMs = "5000";

}  // namespace

Status apply_properties(RdKafka::Conf& conf, const config::KafkaProperties& props,
                        const char* section) {
  for (const auto& [key, value] : props) {
    std::string err;
    if (conf.set(key, value, err) != RdKafka::Conf::CONF_OK) {
      return fail(std::string(section) + " property '" + key +
                  "': " + config::kafka_property_error(key, value, err));
    }
  }
  return {};
}

config::KafkaProperties producer_properties_for(const config::Config& config, bool statistics) {
  config::KafkaProperties props{{"linger.ms", "5"}, {"message.max.bytes", "16777216"}};
  if (statistics) props["statistics.interval.ms"] = kStatisticsEveryMs;
  for (auto& [k, v] : config::producer_properties(config)) props[k] = v;
  props["enable.idempotence"] = "true";
  return props;
}

Result<std::unique_ptr<RdKafka::Producer>> build_producer(const config::KafkaProperties& properties,
                                                          RdKafka::DeliveryReportCb& reports,
                                                          RdKafka::EventCb& events) {
  std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  if (auto s = apply_properties(*conf, properties, "producer"); !s)
    return tl::unexpected(s.error());
  std::string err;
  if (conf->set("dr_cb", &reports, err) != RdKafka::Conf::CONF_OK ||
      conf->set("event_cb", &events, err) != RdKafka::Conf::CONF_OK) {
    return fail("producer: " + err);
  }
  std::unique_ptr<RdKafka::Producer> producer(RdKafka::Producer::create(conf.get(), err));
  if (!producer) return fail("cannot create the Kafka producer: " + err);
  return producer;
}

Result<BuiltConsumer> build_consumer(const config::Config& config, bool statistics,
                                     const config::KafkaProperties& extra,
                                     const ConsumerCallbacks& callbacks) {
  std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  // Without a committed offset, start from the beginning: a dedup service
  // should not skip records that were already waiting.
  config::KafkaProperties props{{"auto.offset.reset", "earliest"}};
  if (statistics) props["statistics.interval.ms"] = kStatisticsEveryMs;
  for (auto& [k, v] : config::consumer_properties(config)) props[k] = v;
  props["group.id"] = config.group_id;
  for (const auto& [k, v] : extra) props[k] = v;
  // The pipeline decides which positions may be committed (every output
  // delivered); automatic storing would commit undelivered records.
  props["enable.auto.offset.store"] = "false";
  if (auto s = apply_properties(*conf, props, "consumer"); !s) return tl::unexpected(s.error());
  BuiltConsumer built;
  if (std::string session; conf->get("session.timeout.ms", session) == RdKafka::Conf::CONF_OK) {
    built.first_join_wait = std::chrono::milliseconds(std::stoll(session) + 5'000);
  }
  std::string err;
  if (conf->set("rebalance_cb", callbacks.rebalance, err) != RdKafka::Conf::CONF_OK ||
      (callbacks.commits != nullptr &&
       conf->set("offset_commit_cb", callbacks.commits, err) != RdKafka::Conf::CONF_OK) ||
      conf->set("event_cb", callbacks.events, err) != RdKafka::Conf::CONF_OK) {
    return fail("consumer: " + err);
  }
  built.consumer.reset(RdKafka::KafkaConsumer::create(conf.get(), err));
  if (!built.consumer) return fail("cannot create the Kafka consumer: " + err);
  return built;
}

std::vector<RdKafka::ErrorCode> store_positions(RdKafka::KafkaConsumer& consumer,
                                                const std::vector<StorePosition>& positions) {
  std::vector<RdKafka::ErrorCode> errors(positions.size(), RdKafka::ERR_NO_ERROR);
  if (positions.empty()) return errors;
  const std::unique_ptr<rd_kafka_topic_partition_list_t,
                        decltype(&rd_kafka_topic_partition_list_destroy)>
      list(rd_kafka_topic_partition_list_new(static_cast<int>(positions.size())),
           &rd_kafka_topic_partition_list_destroy);
  for (const auto& p : positions) {
    rd_kafka_topic_partition_list_add(list.get(), p.topic->c_str(), p.partition)->offset = p.offset;
  }
  const rd_kafka_resp_err_t err = rd_kafka_offsets_store(consumer.c_ptr(), list.get());
  // The list keeps the order it was built in: element i is positions[i].
  for (std::size_t i = 0; i < positions.size(); ++i) {
    const rd_kafka_resp_err_t e =
        err != RD_KAFKA_RESP_ERR_NO_ERROR ? err : list->elems[static_cast<int>(i)].err;
    errors[i] = static_cast<RdKafka::ErrorCode>(e);
  }
  return errors;
}

void abandon_unsynced_consumer(std::unique_ptr<RdKafka::KafkaConsumer> consumer,
                               std::unique_ptr<RdKafka::EventCb> events) {
  if (!consumer) return;
  rd_kafka_set_log_level(consumer->c_ptr(), 0);
  spdlog::info(
      "{}: stopped before its first group join completed; its client is left to the process's "
      "exit (librdkafka 2.0.2 aborts destroying it)",
      consumer->name());
  static_cast<void>(consumer.release());
  static_cast<void>(events.release());
}

Consumed classify_consumed(RdKafka::ErrorCode err, std::string_view topic,
                           RdKafka::KafkaConsumer& consumer, FatalError& fatal,
                           std::string_view who) {
  switch (err) {
    case RdKafka::ERR_NO_ERROR:
      return Consumed::kRecord;
    case RdKafka::ERR__TIMED_OUT:
    case RdKafka::ERR__PARTITION_EOF:
      return Consumed::kIdle;
    case RdKafka::ERR__FATAL: {
      std::string reason;
      consumer.fatal_error(reason);
      fatal.set(std::string(who) + " fatal error: " + reason);
      return Consumed::kError;
    }
    default:
      if (topic.empty()) {
        spdlog::warn("{}: {}", who, describe_kafka_error(err));
      } else {
        spdlog::warn("{}: {} (topic {})", who, describe_kafka_error(err), topic);
      }
      return Consumed::kError;
  }
}

Status check_topics(RdKafka::KafkaConsumer& consumer, const config::Config& config,
                    std::int32_t& output_partitions) {
  // One metadata request for all topics: asking for a named topic would
  // auto-create it on clusters that allow that.
  RdKafka::Metadata* raw = nullptr;
  RdKafka::ErrorCode md_err = consumer.metadata(true, nullptr, &raw, 10'000);
  std::unique_ptr<RdKafka::Metadata> md(raw);
  if (md_err != RdKafka::ERR_NO_ERROR) {
    return fail("cannot read the cluster metadata: " + describe_kafka_error(md_err));
  }
  auto lookup = [&](const std::string& topic) -> Result<int> {
    for (const auto* t : *md->topics()) {
      if (t->topic() != topic) continue;
      if (t->err() != RdKafka::ERR_NO_ERROR) {
        return fail("topic '" + topic + "': " + describe_kafka_error(t->err()));
      }
      return static_cast<int>(t->partitions()->size());
    }
    return fail("topic '" + topic + "' does not exist; create it (or fix the name)");
  };
  std::vector<std::string> errors;
  int max_input = 0;
  std::string widest;
  for (const auto& topic : config.input.topics) {
    auto n = lookup(topic);
    if (!n) {
      errors.push_back("input.topics: " + n.error().message);
      continue;
    }
    if (*n > max_input) {
      max_input = *n;
      widest = topic;
    }
    spdlog::info("input topic '{}': {} partitions", topic, *n);
  }
  auto out = lookup(config.output.topic);
  if (out) output_partitions = *out;
  if (!out) {
    errors.push_back("output.topic: " + out.error().message);
  } else if (config.output.partitioning == config::Partitioning::kInput && *out < max_input) {
    errors.push_back("output.topic: '" + config.output.topic + "' has " + std::to_string(*out) +
                     " partitions but input topic '" + widest + "' has " +
                     std::to_string(max_input) +
                     "; with output.partitioning: input every input partition needs the output "
                     "partition of the same number. Add partitions to the output topic or set "
                     "output.partitioning: key");
  }
  if (config.on_invalid == config::OnInvalid::kDlq) {
    if (auto d = lookup(config.dlq_topic); !d) errors.push_back("dlq_topic: " + d.error().message);
  }
  if (!config.duplicates_topic.empty()) {
    if (auto d = lookup(config.duplicates_topic); !d) {
      errors.push_back("duplicates_topic: " + d.error().message);
    }
  }
  if (errors.empty()) return {};
  std::string joined;
  for (const auto& e : errors) joined += (joined.empty() ? "" : "\n") + e;
  return fail(joined);
}

void ClientEvents::event_cb(RdKafka::Event& event) {
  if (event.type() == RdKafka::Event::EVENT_LOG) {
    log_librdkafka(client_, event.severity(), event.fac(), event.str());
    return;
  }
  if (event.type() == RdKafka::Event::EVENT_STATS) {
    if (on_statistics_) on_statistics_(event.str());
    return;
  }
  if (event.type() != RdKafka::Event::EVENT_ERROR) return;
  if (event.fatal()) {
    on_fatal_(std::string(client_) + " fatal error: " + describe_kafka_error(event.err()) + " (" +
              event.str() + ")");
    return;
  }
  // Transient (broker down, transport): librdkafka retries on its own.
  auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(mu_);
    if (now - last_log_ < std::chrono::seconds(5) && event.err() == last_err_) return;
    last_log_ = now;
    last_err_ = event.err();
  }
  spdlog::warn("{}: {} ({})", client_, describe_kafka_error(event.err()), event.str());
}

}  // namespace kdedup::pipeline
