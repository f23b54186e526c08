#include "kdedup/pipeline/reconcile.h"

#include <algorithm>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <librdkafka/rdkafkacpp.h>
#include <spdlog/spdlog.h>

#include "kafka_errors.h"
#include "kdedup/pipeline/recovery.h"
#include "message_view.h"

namespace kdedup::pipeline {

namespace {

constexpr std::size_t kMalformedExamples = 5;

}  // namespace

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

/// fetch.wait.max.ms of the recovery reads (make_consumer()).
constexpr int kRecoveryFetchWaitMs = 10;

Result<std::unique_ptr<RdKafka::Consumer>> make_consumer(const ReconcileOptions& options) {
  std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  std::string err;
  auto props = options.properties;
  // A plain (non-group) consumer: it joins nothing and commits nothing, so
  // it cannot disturb the group's assignment or offsets.
  props.erase("group.id");
  props.erase("group.instance.id");
  props["enable.partition.eof"] = "true";
  // Its reads come in rounds (the record before each committed offset, a
  // search by time, the output's tails), each started where the last one
  // stopped. A fetch that reached the end of a partition waits there for new
  // records up to fetch.wait.max.ms (librdkafka's default: 500 ms), and a
  // broker connection carries one fetch at a time: the next round's fetch
  // waited behind it, half a second a round. Recovery reads what is stored
  // and waits for nothing new.
  props["fetch.wait.max.ms"] = std::to_string(kRecoveryFetchWaitMs);
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

/// Offset and timestamp (<= 0: none) of one record.
using Stamped = std::pair<std::int64_t, std::int64_t>;

/// Offset and timestamp of the first record at or after an offset; none at
/// the end of the partition.
using FirstRecord = std::optional<Stamped>;

/// Records of one partition a round of the search by time keeps at most
/// (read_runs()): a produce batch or a few (the consumer keeps fetching
/// while the queue is drained, and a large partition must not be read
/// whole into memory by a search).
constexpr std::size_t kMaxRunRecords = 4096;

/// The records at or after `at[p]` of every partition p that arrived with
/// its first one (a fetch brings a whole batch: one or more records, in
/// offset order, up to `most`; none at the end of the partition), read
/// together through one queue (one round trip for all, not one each). Fails
/// when nothing arrives for `step`.
Result<std::map<std::int32_t, std::vector<Stamped>>> read_runs(
    RdKafka::Consumer& consumer, RdKafka::Topic& topic,
    const std::map<std::int32_t, std::int64_t>& at, Clock::duration step, std::size_t most) {
  std::map<std::int32_t, std::vector<Stamped>> found;
  std::unique_ptr<RdKafka::Queue> queue(RdKafka::Queue::create(&consumer));
  std::vector<std::unique_ptr<Started>> started;
  for (const auto& [p, offset] : at) {
    if (RdKafka::ErrorCode code = consumer.start(&topic, p, offset, queue.get());
        code != RdKafka::ERR_NO_ERROR) {
      return fail(fmt::format("cannot read {}[{}] at offset {}: {}", topic.name(), p, offset,
                              describe_kafka_error(code)));
    }
    started.push_back(std::unique_ptr<Started>(new Started{&consumer, &topic, p}));
  }
  // Takes one message; false when it is an error to report.
  auto take = [&](RdKafka::Message& m) {
    const std::int32_t p = m.partition();
    if (!at.count(p)) return true;
    const bool first = !found.count(p);
    if (m.err() == RdKafka::ERR__PARTITION_EOF) {
      if (first) found[p];  // nothing stored from there on
      return true;
    }
    if (m.err() != RdKafka::ERR_NO_ERROR) return !first;  // after a record: the run ends there
    std::vector<Stamped>& run = found[p];
    if (!first && (run.empty() || run.size() >= most || m.offset() <= run.back().first)) {
      return true;
    }
    const auto ts = m.timestamp();
    run.emplace_back(m.offset(), ts.type == RdKafka::MessageTimestamp::MSG_TIMESTAMP_NOT_AVAILABLE
                                     ? 0
                                     : ts.timestamp);
    return true;
  };
  auto stalled_at = Clock::now() + step;
  while (found.size() < at.size()) {
    const int wait = remaining_ms(stalled_at);
    if (wait <= 0) {
      for (const auto& [p, offset] : at) {
        if (!found.count(p)) {
          return fail(
              fmt::format("reading {}[{}] at offset {} timed out", topic.name(), p, offset));
        }
      }
    }
    std::unique_ptr<RdKafka::Message> m(consumer.consume(queue.get(), std::min(wait, 100)));
    if (!m || m->err() == RdKafka::ERR__TIMED_OUT) continue;
    if (!take(*m)) {
      return fail(fmt::format("reading {}[{}] at offset {}: {}", topic.name(), m->partition(),
                              at.at(m->partition()), describe_kafka_error(m->err())));
    }
    stalled_at = Clock::now() + step;
  }
  // What else has already arrived: the rest of the fetched batches, up to
  // `most` records a partition in all (none when one is all a caller wants).
  for (std::size_t n = 0; n + at.size() < at.size() * most; ++n) {
    std::unique_ptr<RdKafka::Message> m(consumer.consume(queue.get(), 0));
    if (!m || m->err() == RdKafka::ERR__TIMED_OUT) break;
    (void)take(*m);
  }
  return found;
}

/// The first record at or after `at[p]` of every partition p (read_runs()).
Result<std::map<std::int32_t, FirstRecord>> read_first_records(
    RdKafka::Consumer& consumer, RdKafka::Topic& topic,
    const std::map<std::int32_t, std::int64_t>& at, Clock::duration step) {
  auto runs = read_runs(consumer, topic, at, step, 1);
  if (!runs) return tl::unexpected(runs.error());
  std::map<std::int32_t, FirstRecord> first;
  for (const auto& [p, run] : *runs) {
    first[p] = run.empty() ? FirstRecord() : FirstRecord(run.front());
  }
  return first;
}

/// One partition of offsets_at_or_after(): the record at `last` has a
/// timestamp at or after `target_ms` (the caller read it).
struct TimeQuery {
  std::int64_t target_ms = 0;
  std::int64_t low = 0;
  std::int64_t last = 0;
};

/// For each partition, the first offset in [low, last] whose record's
/// timestamp is >= its target, by bisection (timestamps taken as
/// non-decreasing; the record at `last` qualifies). Every round reads the
/// middle record of each unfinished partition together through one queue,
/// so hundreds of partitions take at most about log2(last - low) rounds,
/// not that many reads each one after the other; and it judges every
/// record the fetch brought with it (a batch), which ends the search when
/// the target time falls inside one. A round fails when nothing arrives
/// for `step`.
Result<std::map<std::int32_t, std::int64_t>> search_offsets_for_time(
    RdKafka::Consumer& consumer, RdKafka::Topic& topic,
    const std::map<std::int32_t, TimeQuery>& queries, Clock::duration step) {
  struct Range {
    std::int64_t lo = 0, hi = 0;
  };
  std::map<std::int32_t, Range> ranges;
  for (const auto& [p, q] : queries) {
    const std::int64_t lo = std::max<std::int64_t>(0, q.low);
    ranges[p] = {lo, std::max(lo, q.last)};
  }
  for (;;) {
    std::map<std::int32_t, std::int64_t> mids;
    for (const auto& [p, r] : ranges) {
      if (r.lo < r.hi) mids[p] = r.lo + (r.hi - r.lo) / 2;
    }
    if (mids.empty()) break;
    auto read = read_runs(consumer, topic, mids, step, kMaxRunRecords);
    if (!read) return tl::unexpected(read.error());
    for (const auto& [p, run] : *read) {
      Range& r = ranges[p];
      const std::int64_t target = queries.at(p).target_ms;
      // The first record of the run at or after hi, or at or after the
      // target time: the answer is at or before it.
      const auto stop = std::find_if(run.begin(), run.end(), [&](const Stamped& x) {
        return x.first >= r.hi || x.second >= target;
      });
      if (stop == run.begin()) {
        r.hi = mids.at(p);  // the answer is at or before mid
      } else if (stop != run.end()) {
        r.lo = r.hi = std::prev(stop)->first + 1;  // the record before it does not qualify
      } else {
        r.lo = run.back().first + 1;
      }
    }
  }
  std::map<std::int32_t, std::int64_t> found;
  for (const auto& [p, r] : ranges) found[p] = r.lo;
  return found;
}

/// For each partition of `topic`, the first offset whose record's timestamp
/// is >= its target: offsetsForTimes for all of them in one call, and a
/// bisection (search_offset_for_time) where the broker does not answer
/// (librdkafka 2.0.2's mock cluster answers -1 to every timestamp query).
Result<std::map<std::int32_t, std::int64_t>> offsets_at_or_after(
    RdKafka::Consumer& consumer, RdKafka::Topic& topic,
    const std::map<std::int32_t, TimeQuery>& queries, Clock::time_point deadline) {
  std::map<std::int32_t, std::int64_t> found;
  if (queries.empty()) return found;
  // A search round may take as long as the whole call was given.
  const auto span = deadline - Clock::now();
  std::vector<RdKafka::TopicPartition*> tps;
  for (const auto& [p, q] : queries) {
    tps.push_back(RdKafka::TopicPartition::create(topic.name(), p, q.target_ms));
  }
  struct Destroy {
    std::vector<RdKafka::TopicPartition*>& v;
    ~Destroy() { RdKafka::TopicPartition::destroy(v); }
  } destroy{tps};
  if (RdKafka::ErrorCode code = consumer.offsetsForTimes(tps, std::max(1, remaining_ms(deadline)));
      code != RdKafka::ERR_NO_ERROR) {
    return fail(
        fmt::format("offsets for times of '{}': {}", topic.name(), describe_kafka_error(code)));
  }
  std::map<std::int32_t, TimeQuery> unanswered;
  for (auto* tp : tps) {
    if (tp->err() != RdKafka::ERR_NO_ERROR) {
      return fail(fmt::format("offsets for times of {}[{}]: {}", topic.name(), tp->partition(),
                              describe_kafka_error(tp->err())));
    }
    if (tp->offset() >= 0) {
      found[tp->partition()] = tp->offset();
    } else {
      // No answer although the record at `last` qualifies: search the offsets.
      unanswered[tp->partition()] = queries.at(tp->partition());
    }
  }
  auto searched = search_offsets_for_time(consumer, topic, unanswered, span);
  if (!searched) return tl::unexpected(searched.error());
  found.merge(*searched);
  return found;
}

}  // namespace

Result<std::int32_t> output_partition_count(const ReconcileOptions& options,
                                            const std::string& output_topic) {
  auto consumer = make_consumer(options);
  if (!consumer) return tl::unexpected(consumer.error());
  return partition_count(**consumer, output_topic, Clock::now() + options.timeout);
}

namespace {

/// Reads the ranges [from, to) of partitions of the output topic into
/// `report`, keeping provenance of the sources in `cover` only (all when it
/// is empty); `lowest` gets, per output partition and source, the lowest
/// source offset read.
Status read_ranges(RdKafka::Consumer& consumer, RdKafka::Topic& topic,
                   const std::map<std::int32_t, std::pair<std::int64_t, std::int64_t>>& ranges,
                   const std::map<PartitionId, Coverage>& cover, const DeliveryVisitor& on_delivery,
                   const ReconcileOptions& options, Clock::time_point deadline,
                   ReconcileReport& report,
                   std::map<std::pair<std::int32_t, PartitionId>, std::int64_t>& lowest) {
  MessageView view;
  std::unique_ptr<RdKafka::Queue> queue(RdKafka::Queue::create(&consumer));
  std::map<std::int32_t, std::int64_t> position;
  std::vector<std::unique_ptr<Started>> started;
  std::set<std::int32_t> pending;
  for (const auto& [p, range] : ranges) {
    const auto [from, to] = range;
    if (from >= to) continue;
    RdKafka::ErrorCode code = consumer.start(&topic, p, from, queue.get());
    if (code != RdKafka::ERR_NO_ERROR) {
      return fail(fmt::format("output reconciliation: cannot read '{}' partition {} from {}: {}",
                              topic.name(), p, from, describe_kafka_error(code)));
    }
    // Built in place: a temporary Started would stop the fetch at once.
    started.push_back(std::unique_ptr<Started>(new Started{&consumer, &topic, p}));
    position[p] = from;
    pending.insert(p);
  }
  // The whole read may take longer than the timeout (a long window's
  // deliveries through a slow link): it fails only when no record has
  // arrived for the timeout, and never before `deadline`.
  auto stalled_at = std::max(deadline, Clock::now() + options.timeout);
  while (!pending.empty()) {
    const int wait = remaining_ms(stalled_at);
    if (wait <= 0) {
      std::string where;
      for (std::int32_t p : pending) {
        where += fmt::format("{}partition {} at offset {} of {}", where.empty() ? "" : ", ", p,
                             position[p], ranges.at(p).second);
      }
      return fail(fmt::format(
          "output reconciliation: reading output topic '{}' stalled: nothing arrived for {} ms "
          "({}); check the brokers",
          topic.name(), options.timeout.count(), where));
    }
    std::unique_ptr<RdKafka::Message> m(consumer.consume(queue.get(), std::min(wait, 100)));
    if (!m) continue;
    if (m->err() != RdKafka::ERR__TIMED_OUT) stalled_at = Clock::now() + options.timeout;
    const std::int32_t p = m->partition();
    if (m->err() == RdKafka::ERR__TIMED_OUT || !pending.count(p)) continue;
    if (m->err() == RdKafka::ERR__PARTITION_EOF) {
      pending.erase(p);
      continue;
    }
    if (m->err() != RdKafka::ERR_NO_ERROR) {
      return fail(fmt::format("output reconciliation: reading '{}' partition {}: {}", topic.name(),
                              p, describe_kafka_error(m->err())));
    }
    if (m->offset() >= ranges.at(p).second) {
      pending.erase(p);  // read past the range (a second pass ends where the first began)
      continue;
    }
    position[p] = m->offset() + 1;
    if (m->offset() + 1 >= ranges.at(p).second) pending.erase(p);
    ++report.records_read;

    ProvenanceHeaders found;
    std::vector<RdKafka::Headers::Header> all;
    if (const RdKafka::Headers* hs = m->headers(); hs != nullptr) all = hs->get_all();
    for (const auto& h : all) {
      const std::string name = h.key();  // returned by value
      found.offer(name, std::string_view(static_cast<const char*>(h.value()),
                                         h.value() ? h.value_size() : 0));
    }
    const ProvenanceParse parsed = parse_provenance(found);
    if (parsed.malformed) {
      ++report.malformed;
      std::string msg = fmt::format("output record '{}' partition {} offset {}: {}; skipped",
                                    topic.name(), p, m->offset(), *parsed.malformed);
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
    const Provenance& prov = *parsed.provenance;
    if (!cover.empty() && !cover.count(prov.source)) continue;
    auto [it, inserted] = report.highest_by_source.try_emplace(prov.source, prov.offset);
    if (!inserted) it->second = std::max(it->second, prov.offset);
    report.emitted_by_source[prov.source].push_back(prov.offset);
    auto [low, first] = lowest.try_emplace({p, prov.source}, prov.offset);
    if (!first) low->second = std::min(low->second, prov.offset);
    if (on_delivery) on_delivery(prov, view.of(*m), timestamp_ms(*m));
  }
  return {};
}

}  // namespace

namespace {

using Ranges = std::map<std::int32_t, std::pair<std::int64_t, std::int64_t>>;  // [from, to)

/// One read_output() call: the consumer and topic it reads with, and what
/// its two steps found. Calling thread only.
class OutputReader {
 public:
  OutputReader(const ReconcileOptions& options, const std::string& output_topic,
               const std::map<PartitionId, Coverage>& cover, const DeliveryVisitor& on_delivery)
      : options_(options), topic_name_(output_topic), cover_(cover), on_delivery_(on_delivery) {}

  /// The consumer, and a check that every partition to read exists.
  Status open(const std::vector<std::int32_t>& partitions);
  /// Step 1: the tail of each partition, and back to since_ms where given.
  Status read_tails(const std::vector<std::int32_t>& partitions,
                    const std::map<std::int32_t, std::int64_t>& since_ms);
  /// Step 2: further back where a covered source's records in a partition
  /// all lie at or past its committed offset.
  Status read_uncommitted_past_tails();
  /// The report, its offsets sorted and unique.
  ReconcileReport finish();

 private:
  /// Every step has the timeout to itself (a step: the metadata, one
  /// partition's watermarks or time search, a read that keeps receiving):
  /// hundreds of partitions take longer than one timeout in all.
  [[nodiscard]] Clock::time_point step() const { return Clock::now() + options_.timeout; }
  Result<std::map<std::int32_t, std::int64_t>> starts_at_time(
      const std::map<std::int32_t, TimeQuery>& wanted);
  Status read(const Ranges& ranges) {
    return read_ranges(*consumer_, *topic_, ranges, cover_, on_delivery_, options_, step(), report_,
                       lowest_);
  }

  const ReconcileOptions& options_;
  const std::string& topic_name_;
  const std::map<PartitionId, Coverage>& cover_;
  const DeliveryVisitor& on_delivery_;
  std::unique_ptr<RdKafka::Consumer> consumer_;
  std::unique_ptr<RdKafka::Topic> topic_;
  std::map<std::int32_t, std::pair<std::int64_t, std::int64_t>> marks_;  // low, high
  Ranges ranges_;  // what was read, per partition
  ReconcileReport report_;
  // Per output partition and source, the lowest source offset read.
  std::map<std::pair<std::int32_t, PartitionId>, std::int64_t> lowest_;
};

Status OutputReader::open(const std::vector<std::int32_t>& partitions) {
  auto made = make_consumer(options_);
  if (!made) return tl::unexpected(made.error());
  consumer_ = std::move(*made);
  auto count = partition_count(*consumer_, topic_name_, step());
  if (!count) return tl::unexpected(count.error());
  for (std::int32_t p : partitions) {
    if (p < 0 || p >= *count) {
      return fail(fmt::format(
          "output reconciliation: output topic '{}' has {} partitions, partition {} does not "
          "exist",
          topic_name_, *count, p));
    }
  }
  std::string err;
  topic_.reset(RdKafka::Topic::create(consumer_.get(), topic_name_, nullptr, err));
  if (!topic_) return fail(fmt::format("output reconciliation: topic '{}': {}", topic_name_, err));
  return {};
}

/// Where reads start: per partition, the first record at or after the
/// query's time, searched in [low, last] (`last` = the newest stored); all
/// partitions together.
Result<std::map<std::int32_t, std::int64_t>> OutputReader::starts_at_time(
    const std::map<std::int32_t, TimeQuery>& wanted) {
  std::map<std::int32_t, std::int64_t> starts;
  if (wanted.empty()) return starts;
  std::map<std::int32_t, std::int64_t> newest_at;
  for (const auto& [p, q] : wanted) newest_at[p] = q.last;
  auto newest = read_first_records(*consumer_, *topic_, newest_at, options_.timeout);
  if (!newest) return fail("output reconciliation: " + newest.error().message);
  std::map<std::int32_t, TimeQuery> search;
  for (const auto& [p, q] : wanted) {
    // Deliveries at or after the time exist (before `last`) only if the
    // record at `last` is one.
    const FirstRecord& n = newest->at(p);
    if (!n || n->second < q.target_ms) {
      starts[p] = q.last + 1;
    } else {
      search[p] = TimeQuery{q.target_ms, q.low, n->first};
    }
  }
  auto at = offsets_at_or_after(*consumer_, *topic_, search, step());
  if (!at) return fail("output reconciliation: " + at.error().message);
  starts.merge(*at);
  return starts;
}

// The end is captured now: records produced later are not ours to account
// for (the partitions being recovered are paused).
Status OutputReader::read_tails(const std::vector<std::int32_t>& partitions,
                                const std::map<std::int32_t, std::int64_t>& since_ms) {
  std::map<std::int32_t, TimeQuery> back_to;
  for (std::int32_t p : std::set<std::int32_t>(partitions.begin(), partitions.end())) {
    std::int64_t low = 0;
    std::int64_t high = 0;
    RdKafka::ErrorCode code = consumer_->query_watermark_offsets(
        topic_name_, p, &low, &high, static_cast<int>(options_.timeout.count()));
    if (code != RdKafka::ERR_NO_ERROR) {
      return fail(fmt::format("output reconciliation: watermarks of '{}' partition {}: {}",
                              topic_name_, p, describe_kafka_error(code)));
    }
    if (high <= low) continue;  // empty partition: nothing emitted (or all expired)
    marks_[p] = {low, high};
    ranges_[p] = {std::max(low, high - options_.tail_records), high};
    if (auto since = since_ms.find(p); since != since_ms.end()) {
      back_to[p] = TimeQuery{since->second, low, high - 1};
    }
  }
  auto starts = starts_at_time(back_to);
  if (!starts) return tl::unexpected(starts.error());
  for (const auto& [p, at] : *starts) ranges_[p].first = std::min(ranges_[p].first, at);
  return read(ranges_);
}

// The read may have started inside a source's uncommitted output (per
// output partition and source, source offsets grow with output offsets, so
// a record below C proves the rest lies after it).
Status OutputReader::read_uncommitted_past_tails() {
  Ranges back;
  std::map<std::int32_t, TimeQuery> further;
  for (const auto& [p, range] : ranges_) {
    const std::int64_t low = marks_.at(p).first;
    const std::int64_t from = range.first;
    if (from <= low) continue;
    bool needed = false;
    std::optional<std::int64_t> since;  // none: from the partition's start
    bool to_start = false;
    for (const auto& [source, c] : cover_) {
      auto it = lowest_.find({p, source});
      if (it == lowest_.end() || it->second < c.from_offset) continue;
      needed = true;
      if (!c.since_ms) to_start = true;
      if (c.since_ms) since = since ? std::min(*since, *c.since_ms) : *c.since_ms;
    }
    if (!needed) continue;
    if (to_start) {
      back[p] = {low, from};
    } else {
      further[p] = TimeQuery{*since, low, from - 1};
    }
  }
  auto further_starts = starts_at_time(further);
  if (!further_starts) return tl::unexpected(further_starts.error());
  for (const auto& [p, to] : *further_starts) {
    if (const std::int64_t from = ranges_.at(p).first; to < from) back[p] = {to, from};
  }
  if (back.empty()) return {};
  if (auto s = read(back); !s) return s;
  for (const auto& [p, range] : back) ranges_[p].first = range.first;
  report_.extended = back.size();
  return {};
}

ReconcileReport OutputReader::finish() {
  for (const auto& [p, range] : ranges_) {
    if (range.first > marks_.at(p).first) report_.truncated.push_back(p);
  }
  for (auto& [source, offsets] : report_.emitted_by_source) {
    std::sort(offsets.begin(), offsets.end());
    offsets.erase(std::unique(offsets.begin(), offsets.end()), offsets.end());
  }
  return std::move(report_);
}

}  // namespace

Result<ReconcileReport> read_output(const ReconcileOptions& options,
                                    const std::string& output_topic,
                                    const std::vector<std::int32_t>& output_partitions,
                                    const std::map<std::int32_t, std::int64_t>& since_ms,
                                    const std::map<PartitionId, Coverage>& cover,
                                    const DeliveryVisitor& on_delivery) {
  if (options.tail_records <= 0) {
    return fail(fmt::format("output reconciliation: tail_records must be positive, got {}",
                            options.tail_records));
  }
  OutputReader reader(options, output_topic, cover, on_delivery);
  if (auto s = reader.open(output_partitions); !s) return tl::unexpected(s.error());
  if (auto s = reader.read_tails(output_partitions, since_ms); !s) return tl::unexpected(s.error());
  if (auto s = reader.read_uncommitted_past_tails(); !s) return tl::unexpected(s.error());
  return reader.finish();
}

Result<std::map<PartitionId, CommitPoint>> find_commit_points(
    const ReconcileOptions& options, const std::map<PartitionId, std::int64_t>& committed,
    const std::set<PartitionId>& rebuild, std::int64_t rewind_ms) {
  std::map<PartitionId, CommitPoint> points;
  if (committed.empty()) return points;
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
      if (!topic) return fail(fmt::format("recovery: topic '{}': {}", id.topic, err));
    }
    if (RdKafka::ErrorCode code = consumer.start(topic.get(), id.partition, c - 1, queue.get());
        code != RdKafka::ERR_NO_ERROR) {
      return fail(fmt::format("recovery: cannot read {} at offset {}: {}", id.str(), c - 1,
                              describe_kafka_error(code)));
    }
    started.push_back(std::unique_ptr<Started>(new Started{&consumer, topic.get(), id.partition}));
    pending.insert(id);
  }
  std::map<PartitionId, std::int64_t> timestamps;
  // Many partitions through a slow link may take longer than the timeout
  // as a whole: the read fails only when nothing has arrived for it.
  auto stalled_at = std::max(deadline, Clock::now() + options.timeout);
  while (!pending.empty()) {
    const int wait = remaining_ms(stalled_at);
    if (wait <= 0) {
      std::string where;
      for (const auto& id : pending) where += (where.empty() ? "" : ", ") + id.str();
      return fail(fmt::format(
          "recovery: reading the record before the committed offset of {} stalled: nothing "
          "arrived for {} ms; check the brokers",
          where, options.timeout.count()));
    }
    std::unique_ptr<RdKafka::Message> m(consumer.consume(queue.get(), std::min(wait, 100)));
    if (!m || m->err() == RdKafka::ERR__TIMED_OUT) continue;
    stalled_at = Clock::now() + options.timeout;
    PartitionId id{m->topic_name(), m->partition()};
    spdlog::debug("recovery: {} offset {}: {}", id.str(), m->offset(),
                  describe_kafka_error(m->err()));
    if (!pending.count(id)) continue;
    if (m->err() == RdKafka::ERR__PARTITION_EOF) {
      pending.erase(id);  // nothing stored there any more
      continue;
    }
    if (m->err() != RdKafka::ERR_NO_ERROR) {
      return fail(
          fmt::format("recovery: reading {}: {}", id.str(), describe_kafka_error(m->err())));
    }
    pending.erase(id);
    const auto ts = m->timestamp();
    if (ts.type != RdKafka::MessageTimestamp::MSG_TIMESTAMP_NOT_AVAILABLE && ts.timestamp > 0) {
      timestamps[id] = ts.timestamp;
    }
  }
  started.clear();
  for (const auto& [id, ts] : timestamps) points[id].timestamp_ms = ts;

  // 2. The first offset at or after (timestamp - rewind), per topic in one
  //    call (or by bisection: the record at C - 1 qualifies).
  std::map<std::string, std::map<std::int32_t, TimeQuery>> queries;
  for (const auto& [id, ts] : timestamps) {
    if (!rebuild.count(id)) continue;
    std::int64_t low = 0, high = 0;
    if (RdKafka::ErrorCode code = consumer.query_watermark_offsets(
            id.topic, id.partition, &low, &high, static_cast<int>(options.timeout.count()));
        code != RdKafka::ERR_NO_ERROR) {
      return fail(
          fmt::format("window start: offsets of {}: {}", id.str(), describe_kafka_error(code)));
    }
    queries[id.topic][id.partition] =
        TimeQuery{rewind_target_ms(ts, rewind_ms), low, committed.at(id) - 1};
  }
  for (const auto& [name, by_partition] : queries) {
    auto found = offsets_at_or_after(consumer, *topics.at(name), by_partition,
                                     Clock::now() + options.timeout);
    if (!found) return fail("window start: " + found.error().message);
    for (const auto& [p, offset] : *found) {
      CommitPoint& point = points[PartitionId{name, p}];
      point.window_offset = offset;
      point.since_ms = by_partition.at(p).target_ms;
    }
  }
  return points;
}

}  // namespace kdedup::pipeline
