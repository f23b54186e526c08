#include "kdedup/pipeline/reconcile.h"

#include <algorithm>
#include <charconv>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <librdkafka/rdkafkacpp.h>
#include <spdlog/spdlog.h>

#include "kafka_errors.h"
#include "kdedup/pipeline/recovery.h"

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

std::vector<std::int64_t> ReconcileReport::emitted(const PartitionId& source) const {
  auto it = emitted_by_source.find(source);
  return it == emitted_by_source.end() ? std::vector<std::int64_t>{} : it->second;
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
  static ClientLog log("recovery consumer");  // its log lines into kdedup's log
  if (conf->set("event_cb", static_cast<RdKafka::EventCb*>(&log), err) != RdKafka::Conf::CONF_OK) {
    return fail("output reconciliation: " + err);
  }
  for (const auto& [key, value] : props) {
    if (conf->set(key, value, err) != RdKafka::Conf::CONF_OK) {
      return fail(fmt::format("output reconciliation: consumer property '{}': {}", key,
                              config::kafka_property_error(key, value, err)));
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
    if (from > low) report.truncated.push_back(p);
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
    report.emitted_by_source[parsed.provenance->source].push_back(parsed.provenance->offset);
  }
  for (auto& [source, offsets] : report.emitted_by_source) {
    std::sort(offsets.begin(), offsets.end());
    offsets.erase(std::unique(offsets.begin(), offsets.end()), offsets.end());
  }
  return report;
}

namespace {

/// The offset and timestamp (<= 0: none) of the first record at or after
/// `offset`; none at the end of the partition.
Result<std::optional<std::pair<std::int64_t, std::int64_t>>> read_at(RdKafka::Consumer& consumer,
                                                                     RdKafka::Topic& topic,
                                                                     std::int32_t partition,
                                                                     std::int64_t offset,
                                                                     Clock::time_point deadline) {
  std::unique_ptr<RdKafka::Queue> queue(RdKafka::Queue::create(&consumer));
  if (RdKafka::ErrorCode code = consumer.start(&topic, partition, offset, queue.get());
      code != RdKafka::ERR_NO_ERROR) {
    return fail(fmt::format("window start: cannot read {}[{}] at offset {}: {}", topic.name(),
                            partition, offset, describe_kafka_error(code)));
  }
  Started started{&consumer, &topic, partition};
  for (;;) {
    const int wait = remaining_ms(deadline);
    if (wait <= 0) {
      return fail(fmt::format("window start: reading {}[{}] at offset {} timed out", topic.name(),
                              partition, offset));
    }
    std::unique_ptr<RdKafka::Message> m(consumer.consume(queue.get(), std::min(wait, 100)));
    if (!m || m->err() == RdKafka::ERR__TIMED_OUT) continue;
    if (m->err() == RdKafka::ERR__PARTITION_EOF) return std::nullopt;
    if (m->err() != RdKafka::ERR_NO_ERROR) {
      return fail(fmt::format("window start: reading {}[{}] at offset {}: {}", topic.name(),
                              partition, offset, describe_kafka_error(m->err())));
    }
    const auto ts = m->timestamp();
    const std::int64_t t =
        ts.type == RdKafka::MessageTimestamp::MSG_TIMESTAMP_NOT_AVAILABLE ? 0 : ts.timestamp;
    return std::make_pair(m->offset(), t);
  }
}

/// The first offset in [low, last] whose record's timestamp is >= target,
/// by bisection (timestamps taken as non-decreasing; the record at `last`
/// qualifies). About log2(last - low) single-record reads.
Result<std::int64_t> search_offset_for_time(RdKafka::Consumer& consumer, RdKafka::Topic& topic,
                                            std::int32_t partition, std::int64_t low,
                                            std::int64_t last, std::int64_t target,
                                            Clock::time_point deadline) {
  std::int64_t lo = std::max<std::int64_t>(0, low);
  std::int64_t hi = std::max(lo, last);
  while (lo < hi) {
    const std::int64_t mid = lo + (hi - lo) / 2;
    auto r = read_at(consumer, topic, partition, mid, deadline);
    if (!r) return tl::unexpected(r.error());
    if (!*r || (*r)->first >= hi) {
      hi = mid;  // nothing stored in [mid, hi): the answer is at or before mid
    } else if ((*r)->second >= target) {
      hi = mid;  // the first record from mid on qualifies
    } else {
      lo = (*r)->first + 1;
    }
  }
  return lo;
}

}  // namespace

Result<std::map<PartitionId, std::int64_t>> find_window_starts(
    const ReconcileOptions& options, const std::map<PartitionId, std::int64_t>& committed,
    std::int64_t window_ms) {
  std::map<PartitionId, std::int64_t> starts;
  if (committed.empty()) return starts;
  const auto deadline = Clock::now() + options.timeout;
  auto made = make_consumer(options);
  if (!made) return tl::unexpected(made.error());
  RdKafka::Consumer& consumer = **made;
  std::unique_ptr<RdKafka::Queue> queue(RdKafka::Queue::create(&consumer));

  // 1. The timestamp of the record at C - 1 of every partition.
  std::string err;
  std::map<std::string, std::unique_ptr<RdKafka::Topic>> topics;
  std::vector<std::unique_ptr<Started>> started;
  std::set<PartitionId> pending;
  for (const auto& [id, c] : committed) {
    if (c <= 0) continue;
    auto& topic = topics[id.topic];
    if (!topic) {
      topic.reset(RdKafka::Topic::create(&consumer, id.topic, nullptr, err));
      if (!topic) return fail(fmt::format("window start: topic '{}': {}", id.topic, err));
    }
    if (RdKafka::ErrorCode code = consumer.start(topic.get(), id.partition, c - 1, queue.get());
        code != RdKafka::ERR_NO_ERROR) {
      return fail(fmt::format("window start: cannot read {} at offset {}: {}", id.str(), c - 1,
                              describe_kafka_error(code)));
    }
    started.push_back(std::unique_ptr<Started>(new Started{&consumer, topic.get(), id.partition}));
    pending.insert(id);
  }
  std::map<PartitionId, std::int64_t> timestamps;
  while (!pending.empty()) {
    const int wait = remaining_ms(deadline);
    if (wait <= 0) {
      std::string where;
      for (const auto& id : pending) where += (where.empty() ? "" : ", ") + id.str();
      return fail(fmt::format(
          "window start: reading the record before the committed offset of {} timed out after "
          "{} ms; check the brokers",
          where, options.timeout.count()));
    }
    std::unique_ptr<RdKafka::Message> m(consumer.consume(queue.get(), std::min(wait, 100)));
    if (!m || m->err() == RdKafka::ERR__TIMED_OUT) continue;
    PartitionId id{m->topic_name(), m->partition()};
    spdlog::debug("window start: {} offset {}: {}", id.str(), m->offset(),
                  describe_kafka_error(m->err()));
    if (!pending.count(id)) continue;
    if (m->err() == RdKafka::ERR__PARTITION_EOF) {
      pending.erase(id);  // nothing stored there any more
      continue;
    }
    if (m->err() != RdKafka::ERR_NO_ERROR) {
      return fail(
          fmt::format("window start: reading {}: {}", id.str(), describe_kafka_error(m->err())));
    }
    pending.erase(id);
    const auto ts = m->timestamp();
    if (ts.type != RdKafka::MessageTimestamp::MSG_TIMESTAMP_NOT_AVAILABLE && ts.timestamp > 0) {
      timestamps[id] = ts.timestamp;
    }
  }
  started.clear();
  if (timestamps.empty()) return starts;

  // 2. offsetsForTimes of (timestamp - window), all partitions in one call.
  std::vector<RdKafka::TopicPartition*> tps;
  for (const auto& [id, ts] : timestamps) {
    tps.push_back(
        RdKafka::TopicPartition::create(id.topic, id.partition, rewind_target_ms(ts, window_ms)));
  }
  struct Destroy {
    std::vector<RdKafka::TopicPartition*>& v;
    ~Destroy() { RdKafka::TopicPartition::destroy(v); }
  } destroy{tps};
  if (RdKafka::ErrorCode code = consumer.offsetsForTimes(tps, std::max(1, remaining_ms(deadline)));
      code != RdKafka::ERR_NO_ERROR) {
    return fail(fmt::format("window start: offsets for times: {}", describe_kafka_error(code)));
  }
  for (auto* tp : tps) {
    PartitionId id{tp->topic(), tp->partition()};
    if (tp->err() != RdKafka::ERR_NO_ERROR) {
      return fail(fmt::format("window start: offsets for times of {}: {}", id.str(),
                              describe_kafka_error(tp->err())));
    }
    if (tp->offset() >= 0) {
      starts[id] = tp->offset();
      continue;
    }
    // No answer although the record at C - 1 is at or after the target: the
    // broker does not look offsets up by time (librdkafka 2.0.2's mock
    // cluster answers -1 to every timestamp query). Search the offsets.
    std::int64_t low = 0, high = 0;
    if (RdKafka::ErrorCode code = consumer.query_watermark_offsets(
            id.topic, id.partition, &low, &high, std::max(1, remaining_ms(deadline)));
        code != RdKafka::ERR_NO_ERROR) {
      return fail(
          fmt::format("window start: offsets of {}: {}", id.str(), describe_kafka_error(code)));
    }
    auto found = search_offset_for_time(consumer, *topics.at(id.topic), id.partition, low,
                                        committed.at(id) - 1,
                                        rewind_target_ms(timestamps.at(id), window_ms), deadline);
    if (!found) return tl::unexpected(found.error());
    starts[id] = *found;
  }
  return starts;
}

}  // namespace kdedup::pipeline
