#include "kdedup/pipeline/reconcile.h"

#include <algorithm>
#include <charconv>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <librdkafka/rdkafkacpp.h>
#include <spdlog/spdlog.h>

#include "kafka_errors.h"

namespace kdedup::pipeline {

namespace {

/// Strict ASCII decimal, no sign, no spaces, fits int64.
std::optional<std::int64_t> parse_decimal(std::string_view text) {
  if (text.empty()) return std::nullopt;
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.front() == '-') return std::nullopt;
  return value;
}

constexpr std::size_t kMalformedExamples = 5;

}  // namespace

ProvenanceParse parse_provenance(const ProvenanceHeaders& h) {
  ProvenanceParse out;
  if (!h.topic && !h.partition && !h.offset) return out;
  auto missing = [&](std::string_view name) {
    out.malformed = fmt::format("provenance header '{}' is missing", name);
    return out;
  };
  if (!h.topic) return missing(kProvenanceTopicHeader);
  if (!h.partition) return missing(kProvenancePartitionHeader);
  if (!h.offset) return missing(kProvenanceOffsetHeader);
  if (h.topic->empty()) {
    out.malformed = fmt::format("provenance header '{}' is empty", kProvenanceTopicHeader);
    return out;
  }
  const auto partition = parse_decimal(*h.partition);
  if (!partition || *partition > INT32_MAX) {
    out.malformed = fmt::format("provenance header '{}' is not a partition number: '{}'",
                                kProvenancePartitionHeader, *h.partition);
    return out;
  }
  const auto offset = parse_decimal(*h.offset);
  if (!offset) {
    out.malformed = fmt::format("provenance header '{}' is not an offset: '{}'",
                                kProvenanceOffsetHeader, *h.offset);
    return out;
  }
  out.provenance = Provenance{
      PartitionId{std::string(*h.topic), static_cast<std::int32_t>(*partition)}, *offset};
  return out;
}

std::vector<std::int32_t> output_partitions_to_read(config::Partitioning partitioning,
                                                    std::int32_t input_partition,
                                                    std::int32_t output_partition_count) {
  if (partitioning == config::Partitioning::kInput) {
    if (input_partition < 0 || input_partition >= output_partition_count) return {};
    return {input_partition};
  }
  std::vector<std::int32_t> all;
  for (std::int32_t p = 0; p < output_partition_count; ++p) all.push_back(p);
  return all;
}

std::optional<std::int64_t> ReconcileReport::highest(const PartitionId& source) const {
  auto it = highest_by_source.find(source);
  if (it == highest_by_source.end()) return std::nullopt;
  return it->second;
}

namespace {

using Clock = std::chrono::steady_clock;

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<std::int64_t>(0, left.count()));
}

Result<std::unique_ptr<RdKafka::Consumer>> make_consumer(const ReconcileOptions& options) {
  std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  std::string err;
  auto props = options.properties;
  // A plain (non-group) consumer: it joins nothing and commits nothing, so
  // it cannot disturb the group's assignment or offsets.
  props.erase("group.id");
  props.erase("group.instance.id");
  props["enable.partition.eof"] = "true";
  props["enable.auto.commit"] = "false";
  props["enable.auto.offset.store"] = "false";
  for (const auto& [key, value] : props) {
    if (conf->set(key, value, err) != RdKafka::Conf::CONF_OK) {
      return fail(fmt::format("output reconciliation: consumer property '{}': {}", key, err));
    }
  }
  std::unique_ptr<RdKafka::Consumer> consumer(RdKafka::Consumer::create(conf.get(), err));
  if (!consumer) return fail("output reconciliation: cannot create the consumer: " + err);
  return consumer;
}

Result<std::int32_t> partition_count(RdKafka::Consumer& consumer, const std::string& topic,
                                     Clock::time_point deadline) {
  std::string err;
  std::unique_ptr<RdKafka::Topic> t(RdKafka::Topic::create(&consumer, topic, nullptr, err));
  if (!t) return fail(fmt::format("output reconciliation: topic '{}': {}", topic, err));
  RdKafka::ErrorCode code = RdKafka::ERR_NO_ERROR;
  for (;;) {
    RdKafka::Metadata* raw = nullptr;
    code = consumer.metadata(false, t.get(), &raw, std::max(1, remaining_ms(deadline)));
    std::unique_ptr<RdKafka::Metadata> md(raw);
    if (code == RdKafka::ERR_NO_ERROR && md && !md->topics()->empty()) {
      const RdKafka::TopicMetadata* tm = md->topics()->front();
      if (tm->err() == RdKafka::ERR_NO_ERROR) {
        return static_cast<std::int32_t>(tm->partitions()->size());
      }
      code = tm->err();
      // Leader elections answer transiently; a missing topic does not go away.
      if (code != RdKafka::ERR_LEADER_NOT_AVAILABLE) break;
    }
    if (remaining_ms(deadline) <= 0) break;
  }
  return fail(fmt::format("output reconciliation: metadata of output topic '{}': {}", topic,
                          describe_kafka_error(code)));
}

/// RAII for one started partition of the legacy consumer.
struct Started {
  RdKafka::Consumer* consumer;
  RdKafka::Topic* topic;
  std::int32_t partition;
  ~Started() { consumer->stop(topic, partition); }
};

}  // namespace

Result<std::int32_t> output_partition_count(const ReconcileOptions& options,
                                            const std::string& output_topic) {
  auto consumer = make_consumer(options);
  if (!consumer) return tl::unexpected(consumer.error());
  return partition_count(**consumer, output_topic, Clock::now() + options.timeout);
}

Result<ReconcileReport> read_output_tail(const ReconcileOptions& options,
                                         const std::string& output_topic,
                                         const std::vector<std::int32_t>& output_partitions) {
  if (options.tail_records <= 0) {
    return fail(fmt::format("output reconciliation: tail_records must be positive, got {}",
                            options.tail_records));
  }
  const auto deadline = Clock::now() + options.timeout;
  auto made = make_consumer(options);
  if (!made) return tl::unexpected(made.error());
  RdKafka::Consumer& consumer = **made;

  auto count = partition_count(consumer, output_topic, deadline);
  if (!count) return tl::unexpected(count.error());
  for (std::int32_t p : output_partitions) {
    if (p < 0 || p >= *count) {
      return fail(fmt::format(
          "output reconciliation: output topic '{}' has {} partitions, partition {} does not "
          "exist",
          output_topic, *count, p));
    }
  }

  std::string err;
  std::unique_ptr<RdKafka::Topic> topic(
      RdKafka::Topic::create(&consumer, output_topic, nullptr, err));
  if (!topic) return fail(fmt::format("output reconciliation: topic '{}': {}", output_topic, err));
  std::unique_ptr<RdKafka::Queue> queue(RdKafka::Queue::create(&consumer));

  // Per partition: the end captured now (records produced later are not
  // ours to account for: the partitions being reconciled are paused).
  std::map<std::int32_t, std::int64_t> end_of;
  std::map<std::int32_t, std::int64_t> position;
  std::vector<std::unique_ptr<Started>> started;
  ReconcileReport report;
  for (std::int32_t p :
       std::set<std::int32_t>(output_partitions.begin(), output_partitions.end())) {
    std::int64_t low = 0;
    std::int64_t high = 0;
    RdKafka::ErrorCode code = consumer.query_watermark_offsets(output_topic, p, &low, &high,
                                                               std::max(1, remaining_ms(deadline)));
    if (code != RdKafka::ERR_NO_ERROR) {
      return fail(fmt::format("output reconciliation: watermarks of '{}' partition {}: {}",
                              output_topic, p, describe_kafka_error(code)));
    }
    if (high <= low) continue;  // empty partition: nothing emitted (or all expired)
    const std::int64_t from = std::max(low, high - options.tail_records);
    code = consumer.start(topic.get(), p, from, queue.get());
    if (code != RdKafka::ERR_NO_ERROR) {
      return fail(fmt::format("output reconciliation: cannot read '{}' partition {} from {}: {}",
                              output_topic, p, from, describe_kafka_error(code)));
    }
    // Built in place: a temporary Started would stop the fetch at once.
    started.push_back(std::unique_ptr<Started>(new Started{&consumer, topic.get(), p}));
    end_of[p] = high;
    position[p] = from;
  }

  std::set<std::int32_t> pending;
  for (const auto& [p, high] : end_of) pending.insert(p);
  while (!pending.empty()) {
    const int wait = remaining_ms(deadline);
    if (wait <= 0) {
      std::string where;
      for (std::int32_t p : pending) {
        where += fmt::format("{}partition {} at offset {} of {}", where.empty() ? "" : ", ", p,
                             position[p], end_of[p]);
      }
      return fail(fmt::format(
          "output reconciliation: reading the tail of output topic '{}' timed out after {} ms "
          "({}); check the brokers, or raise the reconciliation timeout",
          output_topic, options.timeout.count(), where));
    }
    std::unique_ptr<RdKafka::Message> m(consumer.consume(queue.get(), std::min(wait, 100)));
    if (!m) continue;
    const std::int32_t p = m->partition();
    if (m->err() == RdKafka::ERR__TIMED_OUT) continue;
    if (m->err() == RdKafka::ERR__PARTITION_EOF) {
      pending.erase(p);
      continue;
    }
    if (m->err() != RdKafka::ERR_NO_ERROR) {
      return fail(fmt::format("output reconciliation: reading '{}' partition {}: {}", output_topic,
                              p, describe_kafka_error(m->err())));
    }
    position[p] = m->offset() + 1;
    if (m->offset() + 1 >= end_of[p]) pending.erase(p);
    ++report.records_read;

    ProvenanceHeaders found;
    std::vector<RdKafka::Headers::Header> all;
    if (const RdKafka::Headers* hs = m->headers(); hs != nullptr) all = hs->get_all();
    for (const auto& h : all) {
      const std::string name = h.key();  // returned by value
      const std::string_view value(static_cast<const char*>(h.value()),
                                   h.value() ? h.value_size() : 0);
      if (name == kProvenanceTopicHeader && !found.topic) found.topic = value;
      if (name == kProvenancePartitionHeader && !found.partition) found.partition = value;
      if (name == kProvenanceOffsetHeader && !found.offset) found.offset = value;
    }
    const ProvenanceParse parsed = parse_provenance(found);
    if (parsed.malformed) {
      ++report.malformed;
      std::string msg = fmt::format("output record '{}' partition {} offset {}: {}; skipped",
                                    output_topic, p, m->offset(), *parsed.malformed);
      spdlog::warn("{}", msg);
      if (report.malformed_examples.size() < kMalformedExamples) {
        report.malformed_examples.push_back(std::move(msg));
      }
      continue;
    }
    if (!parsed.provenance) {
      ++report.without_provenance;
      continue;
    }
    auto [it, inserted] =
        report.highest_by_source.try_emplace(parsed.provenance->source, parsed.provenance->offset);
    if (!inserted) it->second = std::max(it->second, parsed.provenance->offset);
  }
  return report;
}

}  // namespace kdedup::pipeline
