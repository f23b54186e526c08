// The repartition stage (repartition.h): one consumer thread that reads the
// input topics, extracts each record's identity and re-produces the record
// to the internal topic's partition H_S(identity) (seed 000 §3), and one
// delivery thread. Invariants kept here:
// - an input offset is registered with its partition's OffsetTracker before
//   its record is produced, so no delivery report overtakes it;
// - a position is stored for librdkafka's committer only when every record
//   up to it was acknowledged (OffsetTracker::committable), and a revoked
//   partition's final position is stored before it is handed back;
// - nothing without identity is lost: dead-lettered, forwarded (pass),
//   dropped and counted, or the stage stops before committing it (fail).

#include "kdedup/pipeline/repartition.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <charconv>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafkacpp.h>

#include "fatal_error.h"
#include "kafka_clients.h"
#include "kafka_errors.h"
#include "kdedup/common/kafka_log.h"
#include "kdedup/common/partitions.h"
#include "kdedup/identity/extractor.h"
#include "kdedup/pipeline/offset_tracker.h"
#include "kdedup/pipeline/provenance.h"
#include "kdedup/pipeline/slice.h"
#include "message_view.h"
#include "repartition_topic.h"

namespace kdedup::pipeline {

std::int32_t slice_of(const filter::Fingerprint& fp, std::int32_t partitions) noexcept {
  // A fresh mix of both halves (the splitmix64 finalizer), then the
  // multiply-shift range reduction: uniform over [0, partitions) for any
  // count, not only powers of two.
  std::uint64_t x = fp.lo ^ (fp.hi * 0x9E3779B97F4A7C15ULL);
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 31;
  const auto n = static_cast<std::uint64_t>(partitions < 1 ? 1 : partitions);
  __extension__ using Wide = unsigned __int128;
  return static_cast<std::int32_t>((static_cast<Wide>(x) * n) >> 64);
}

namespace {

using Clock = std::chrono::steady_clock;
using OwnedMessage = std::unique_ptr<RdKafka::Message>;

constexpr const char* kErrorHeader = "kdedup-error";
constexpr const char* kErrorMessageHeader = "kdedup-error-message";

/// The first fatal problem; later ones are only logged. Thread-safe.
/// What the stage counts; relaxed atomics, read by stats().
struct Counters {
  std::atomic<std::uint64_t> in{0}, repartitioned{0}, dead_lettered{0}, dropped{0}, passed{0},
      delivery_errors{0};
  std::atomic<std::int64_t> lag{0}, assigned{0}, rebalances{0};
};

/// Where a produced record came from; the producer's msg_opaque.
struct Tag {
  enum class Kind : std::uint8_t { kRepartitioned, kDeadLetter, kPassed };
  std::shared_ptr<OffsetTracker> tracker;
  std::int32_t partition;
  std::int64_t offset;
  Kind kind;
};

class Reports final : public RdKafka::DeliveryReportCb {
 public:
  Reports(FatalError& fatal, Counters& counters) : fatal_(fatal), counters_(counters) {}
  void dr_cb(RdKafka::Message& message) override {
    std::unique_ptr<Tag> tag(static_cast<Tag*>(message.msg_opaque()));
    if (!tag) return;
    if (message.err() == RdKafka::ERR_NO_ERROR) {
      switch (tag->kind) {
        case Tag::Kind::kRepartitioned:
          counters_.repartitioned.fetch_add(1, std::memory_order_relaxed);
          break;
        case Tag::Kind::kDeadLetter:
          counters_.dead_lettered.fetch_add(1, std::memory_order_relaxed);
          break;
        case Tag::Kind::kPassed:
          counters_.passed.fetch_add(1, std::memory_order_relaxed);
          break;
      }
      tag->tracker->delivered(tag->offset);
      return;
    }
    // The idempotent producer already retried what was retriable.
    counters_.delivery_errors.fetch_add(1, std::memory_order_relaxed);
    std::string reason = fmt::format(
        "could not deliver the record of input partition {} offset {} to topic '{}': {}",
        tag->partition, tag->offset, message.topic_name(), describe_kafka_error(message.err()));
    tag->tracker->failed(tag->offset, reason);
    fatal_.set(std::move(reason));
  }

 private:
  FatalError& fatal_;
  Counters& counters_;
};

/// Log lines and fatal client errors of one client.
class Events final : public RdKafka::EventCb {
 public:
  Events(FatalError& fatal, const char* client) : fatal_(fatal), client_(client) {}
  void event_cb(RdKafka::Event& event) override {
    if (event.type() == RdKafka::Event::EVENT_LOG) {
      log_librdkafka(client_, event.severity(), event.fac(), event.str());
    } else if (event.type() == RdKafka::Event::EVENT_ERROR) {
      if (event.fatal()) {
        fatal_.set(fmt::format("{} fatal error: {} ({})", client_,
                               describe_kafka_error(event.err()), event.str()));
      } else {
        spdlog::warn("{}: {} ({})", client_, describe_kafka_error(event.err()), event.str());
      }
    }
  }

 private:
  FatalError& fatal_;
  const char* client_;
};

Status apply(RdKafka::Conf& conf, const config::KafkaProperties& props, const char* section) {
  for (const auto& [key, value] : props) {
    std::string err;
    if (conf.set(key, value, err) != RdKafka::Conf::CONF_OK) {
      return fail(fmt::format("{} property '{}': {}", section, key,
                              config::kafka_property_error(key, value, err)));
    }
  }
  return {};
}

std::string join_ids(const std::vector<PartitionId>& ids) {
  std::vector<std::pair<std::string, std::int32_t>> parts;
  for (const auto& id : ids) parts.emplace_back(id.topic, id.partition);
  std::string out = summarize_partitions(std::move(parts));
  return out.empty() ? "(none)" : out;
}

}  // namespace

struct Repartitioner::Impl final : public RdKafka::RebalanceCb, public RdKafka::OffsetCommitCb {
  struct Part {
    std::shared_ptr<OffsetTracker> tracker = std::make_shared<OffsetTracker>();
    std::int64_t stored = -1;
  };

  Impl(const config::Config& c, identity::IdentityExtractor x)
      : config(c),
        group(config::repartition_group(c)),
        partitions(c.repartition.partitions),
        extractor(std::move(x)),
        fingerprinter(c.identity.salt) {}
  ~Impl() override {
    if (subscribed && !joined_once) {
      abandon_unsynced_consumer(std::move(consumer), std::move(consumer_events));
    }
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  Status build_clients();
  Status run(const std::atomic<bool>& stop);
  Status open_topics();
  void process(RdKafka::Message& m);
  Part* part_of(const rd_kafka_message_t& m);
  bool produce(RdKafka::Message& m, rd_kafka_topic_t* topic, std::int32_t partition, Tag::Kind kind,
               const identity::ExtractError* error, Part& part);
  void rebalance_cb(RdKafka::KafkaConsumer* c, RdKafka::ErrorCode err,
                    std::vector<RdKafka::TopicPartition*>& tps) override;
  void offset_commit_cb(RdKafka::ErrorCode err,
                        std::vector<RdKafka::TopicPartition*>& offsets) override;
  void revoke(std::vector<RdKafka::TopicPartition*>& tps);
  void wait_delivered(const std::vector<PartitionId>& ids, Clock::time_point deadline);
  void store_offsets(const std::vector<PartitionId>& ids);
  [[nodiscard]] bool all_stored_confirmed() const;
  void drain_until(Clock::time_point deadline, const std::function<bool()>& done);
  void update_lag();
  std::vector<PartitionId> ids() const {
    std::vector<PartitionId> out;
    for (const auto& [id, p] : parts) out.push_back(id);
    return out;
  }

  config::Config config;
  std::string group;
  std::int32_t partitions;
  identity::IdentityExtractor extractor;
  filter::Fingerprinter fingerprinter;
  MessageView view;
  FatalError fatal{"repartition: "};
  Counters counters;
  Reports reports{fatal, counters};
  // On the heap: a consumer stopped before its first group join keeps it
  // (abandon_unsynced_consumer).
  std::unique_ptr<Events> consumer_events = std::make_unique<Events>(fatal, "repartition consumer");
  Events producer_events{fatal, "repartition producer"};
  std::unique_ptr<RdKafka::Producer> producer;
  std::unique_ptr<RdKafka::KafkaConsumer> consumer;
  // Topic handles of the producer (destroyed before it): no name lookup per
  // record.
  using TopicHandle = std::unique_ptr<rd_kafka_topic_t, decltype(&rd_kafka_topic_destroy)>;
  TopicHandle internal_topic{nullptr, rd_kafka_topic_destroy};
  TopicHandle dlq_topic{nullptr, rd_kafka_topic_destroy};
  // Consumer thread only (rebalance callbacks run inside consume()).
  std::map<PartitionId, Part> parts;
  std::map<PartitionId, std::int64_t> confirmed;
  // The partition of the last record (part_of); reset by every rebalance.
  const rd_kafka_topic_t* last_rkt = nullptr;
  std::int32_t last_partition = -1;
  Part* last_part = nullptr;
  bool subscribed = false;
  bool joined_once = false;
  bool ran = false;
  std::chrono::milliseconds first_join_wait{15'000};
};

Status Repartitioner::Impl::build_clients() {
  std::string err;
  std::unique_ptr<RdKafka::Conf> pconf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  config::KafkaProperties pprops{{"linger.ms", "5"}, {"message.max.bytes", "16777216"}};
  for (auto& [k, v] : config::producer_properties(config)) pprops[k] = v;
  pprops["enable.idempotence"] = "true";
  pprops.erase("transactional.id");
  if (auto s = apply(*pconf, pprops, "producer"); !s) return s;
  if (pconf->set("dr_cb", &reports, err) != RdKafka::Conf::CONF_OK ||
      pconf->set("event_cb", &producer_events, err) != RdKafka::Conf::CONF_OK) {
    return fail("repartition producer: " + err);
  }
  producer.reset(RdKafka::Producer::create(pconf.get(), err));
  if (!producer) return fail("cannot create the repartition stage's Kafka producer: " + err);

  std::unique_ptr<RdKafka::Conf> cconf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  config::KafkaProperties cprops{{"auto.offset.reset", "earliest"}};
  for (auto& [k, v] : config::consumer_properties(config)) cprops[k] = v;
  cprops["group.id"] = group;
  // A static member id is per group: the stage's member gets its own.
  if (auto it = cprops.find("group.instance.id"); it != cprops.end()) it->second += "-repartition";
  // As in the dedup stage (pipeline.cc, store_offsets()): positions are
  // stored once delivered, librdkafka's committer decides when to commit.
  cprops["enable.auto.commit"] = "true";
  cprops["auto.commit.interval.ms"] =
      std::to_string(std::max<std::int64_t>(1, config.commit_interval.count()));
  cprops["enable.auto.offset.store"] = "false";
  if (auto s = apply(*cconf, cprops, "consumer"); !s) return s;
  if (std::string session; cconf->get("session.timeout.ms", session) == RdKafka::Conf::CONF_OK) {
    first_join_wait = std::chrono::milliseconds(std::stoll(session) + 5'000);
  }
  if (cconf->set("rebalance_cb", static_cast<RdKafka::RebalanceCb*>(this), err) !=
          RdKafka::Conf::CONF_OK ||
      cconf->set("offset_commit_cb", static_cast<RdKafka::OffsetCommitCb*>(this), err) !=
          RdKafka::Conf::CONF_OK ||
      cconf->set("event_cb", consumer_events.get(), err) != RdKafka::Conf::CONF_OK) {
    return fail("repartition consumer: " + err);
  }
  consumer.reset(RdKafka::KafkaConsumer::create(cconf.get(), err));
  if (!consumer) return fail("cannot create the repartition stage's Kafka consumer: " + err);
  return {};
}

Repartitioner::Impl::Part* Repartitioner::Impl::part_of(const rd_kafka_message_t& m) {
  // Records come in runs of one partition: one map lookup per run.
  if (m.rkt != last_rkt || m.partition != last_partition || last_part == nullptr) {
    auto it = parts.find(PartitionId{rd_kafka_topic_name(m.rkt), m.partition});
    last_part = it == parts.end() ? nullptr : &it->second;
    last_rkt = m.rkt;
    last_partition = m.partition;
  }
  return last_part;
}

void Repartitioner::Impl::process(RdKafka::Message& m) {
  counters.in.fetch_add(1, std::memory_order_relaxed);
  Part* part = part_of(*m.c_ptr());
  if (part == nullptr) return;  // fetched before a revocation: read again by the next owner
  auto extracted = extractor.extract(view.of(m));
  if (extracted) {
    const std::int32_t slice = slice_of(fingerprinter(extracted->identity), partitions);
    (void)produce(m, internal_topic.get(), slice, Tag::Kind::kRepartitioned, nullptr, *part);
    return;
  }
  const identity::ExtractError& error = extracted.error();
  switch (config.on_invalid) {
    case config::OnInvalid::kDlq:
      (void)produce(m, dlq_topic.get(), RdKafka::Topic::PARTITION_UA, Tag::Kind::kDeadLetter,
                    &error, *part);
      return;
    case config::OnInvalid::kPass:
      // No identity, so no slice: the input partition's number keeps the
      // input's order; the dedup stage passes it on.
      (void)produce(m, internal_topic.get(), m.partition() % partitions, Tag::Kind::kPassed,
                    nullptr, *part);
      return;
    case config::OnInvalid::kDrop:
      if (!part->tracker->add(m.offset(), 0)) {
        fatal.set(fmt::format("offsets of {}[{}] went backwards at {}", m.topic_name(),
                              m.partition(), m.offset()));
      }
      counters.dropped.fetch_add(1, std::memory_order_relaxed);
      return;
    case config::OnInvalid::kFail:
      fatal.set(fmt::format(
          "on_invalid is 'fail' and the record at {}[{}]@{} has no identity: {} ({}); its offset "
          "is not committed. Fix the record or choose on_invalid: dlq | pass | drop",
          m.topic_name(), m.partition(), m.offset(), error.message,
          identity::to_string(error.reason)));
      return;
  }
}

bool Repartitioner::Impl::produce(RdKafka::Message& m, rd_kafka_topic_t* topic,
                                  std::int32_t partition, Tag::Kind kind,
                                  const identity::ExtractError* error, Part& part) {
  if (!part.tracker->add(m.offset(), 1)) {
    fatal.set(fmt::format("offsets of {}[{}] went backwards at {}", m.topic_name(), m.partition(),
                          m.offset()));
    return false;
  }
  // Headers through the C API: one copy of the record's headers (the C++
  // Headers API copies each header twice).
  rd_kafka_headers_t* in_headers = nullptr;
  rd_kafka_headers_t* headers =
      rd_kafka_message_headers(m.c_ptr(), &in_headers) == RD_KAFKA_RESP_ERR_NO_ERROR
          ? rd_kafka_headers_copy(in_headers)
          : rd_kafka_headers_new(4);
  char partition_buf[16], offset_buf[24];
  const std::string_view partition_text(
      partition_buf,
      std::to_chars(partition_buf, partition_buf + sizeof partition_buf, m.partition()).ptr -
          partition_buf);
  const std::string_view offset_text(
      offset_buf,
      std::to_chars(offset_buf, offset_buf + sizeof offset_buf, m.offset()).ptr - offset_buf);
  const std::string_view source = rd_kafka_topic_name(m.c_ptr()->rkt);
  auto add = [headers](std::string_view name, std::string_view value) {
    rd_kafka_header_add(headers, name.data(), static_cast<ssize_t>(name.size()), value.data(),
                        static_cast<ssize_t>(value.size()));
  };
  if (kind == Tag::Kind::kDeadLetter) {
    // The dead-letter contract of the dedup stage: the input record's
    // provenance and why it has no identity.
    add(kProvenanceTopicHeader, source);
    add(kProvenancePartitionHeader, partition_text);
    add(kProvenanceOffsetHeader, offset_text);
    add(kErrorHeader, identity::to_string(error->reason));
    add(kErrorMessageHeader, error->message);
  } else {
    add(kOriginTopicHeader, source);
    add(kOriginPartitionHeader, partition_text);
    add(kOriginOffsetHeader, offset_text);
  }
  const auto ts = m.timestamp();
  // Timestamps <= 0 cannot be produced as such (0 asks for "now").
  const std::int64_t out_ts =
      ts.type != RdKafka::MessageTimestamp::MSG_TIMESTAMP_NOT_AVAILABLE && ts.timestamp > 0
          ? ts.timestamp
          : 0;
  auto tag = std::make_unique<Tag>(Tag{part.tracker, m.partition(), m.offset(), kind});
  const void* key = m.key_pointer();
  const std::size_t key_len = key != nullptr ? m.key_len() : 0;
  void* payload = m.payload();
  const std::size_t payload_len = m.len();
  for (;;) {
    rd_kafka_resp_err_t err = rd_kafka_producev(
        producer->c_ptr(), RD_KAFKA_V_RKT(topic), RD_KAFKA_V_PARTITION(partition),
        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_VALUE(payload, payload_len),
        RD_KAFKA_V_KEY(key, key_len), RD_KAFKA_V_TIMESTAMP(out_ts), RD_KAFKA_V_HEADERS(headers),
        RD_KAFKA_V_OPAQUE(tag.get()), RD_KAFKA_V_END);
    if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      tag.release();  // comes back in the delivery report; the headers are librdkafka's
      return true;
    }
    if (err == RD_KAFKA_RESP_ERR__QUEUE_FULL && !fatal.raised()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the delivery thread drains
      continue;
    }
    rd_kafka_headers_destroy(headers);
    std::string reason = fmt::format("could not produce the record of {}[{}]@{} to topic '{}': {}",
                                     source, m.partition(), m.offset(), rd_kafka_topic_name(topic),
                                     describe_kafka_error(static_cast<RdKafka::ErrorCode>(err)));
    counters.delivery_errors.fetch_add(1, std::memory_order_relaxed);
    part.tracker->failed(m.offset(), reason);
    fatal.set(std::move(reason));
    return false;
  }
}

void Repartitioner::Impl::rebalance_cb(RdKafka::KafkaConsumer* c, RdKafka::ErrorCode err,
                                       std::vector<RdKafka::TopicPartition*>& tps) {
  counters.rebalances.fetch_add(1, std::memory_order_relaxed);
  last_part = nullptr;  // parts may change below
  const bool cooperative = c->rebalance_protocol() == "COOPERATIVE";
  if (err == RdKafka::ERR__ASSIGN_PARTITIONS) {
    joined_once = true;
    std::vector<PartitionId> added;
    for (auto* tp : tps) {
      PartitionId id{tp->topic(), tp->partition()};
      if (parts.try_emplace(id).second) added.push_back(id);
    }
    if (cooperative) {
      std::unique_ptr<RdKafka::Error> e(c->incremental_assign(tps));
      if (e) fatal.set("cannot take the assigned partitions: " + e->str());
    } else {
      c->assign(tps);
    }
    counters.assigned.store(static_cast<std::int64_t>(parts.size()), std::memory_order_relaxed);
    spdlog::info("repartition: assigned {} partition(s): {} (now {} in total)", added.size(),
                 join_ids(added), parts.size());
    return;
  }
  if (err == RdKafka::ERR__REVOKE_PARTITIONS) {
    revoke(tps);
    return;
  }
  fatal.set("consumer group rebalance failed: " + describe_kafka_error(err));
  if (cooperative) {
    std::unique_ptr<RdKafka::Error> e(c->incremental_unassign(tps));
  } else {
    c->unassign();
  }
}

void Repartitioner::Impl::revoke(std::vector<RdKafka::TopicPartition*>& tps) {
  const bool lost = consumer->assignment_lost();
  std::vector<PartitionId> revoked;
  for (auto* tp : tps) {
    PartitionId id{tp->topic(), tp->partition()};
    if (parts.count(id)) revoked.push_back(id);
  }
  // Not when lost: another member owns them and reads the uncommitted
  // records again; their copies are removed by the dedup stage.
  if (!lost) {
    wait_delivered(revoked, Clock::now() + config.shutdown_timeout);
    store_offsets(revoked);
  }
  for (const auto& id : revoked) parts.erase(id);
  if (consumer->rebalance_protocol() == "COOPERATIVE") {
    std::unique_ptr<RdKafka::Error> e(consumer->incremental_unassign(tps));
    if (e) spdlog::warn("repartition: releasing partitions failed: {}", e->str());
  } else {
    consumer->unassign();
  }
  counters.assigned.store(static_cast<std::int64_t>(parts.size()), std::memory_order_relaxed);
  spdlog::info("repartition: {} {} partition(s): {} (now {} in total)", lost ? "lost" : "revoked",
               revoked.size(), join_ids(revoked), parts.size());
}

void Repartitioner::Impl::wait_delivered(const std::vector<PartitionId>& ids,
                                         Clock::time_point deadline) {
  for (;;) {
    std::uint64_t in_flight = 0;
    for (const auto& id : ids) {
      if (auto it = parts.find(id); it != parts.end()) in_flight += it->second.tracker->in_flight();
    }
    if (in_flight == 0) return;
    if (Clock::now() >= deadline) {
      spdlog::warn(
          "repartition: {} records still unacknowledged after shutdown_timeout; their input "
          "offsets stay uncommitted and will be read again",
          in_flight);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void Repartitioner::Impl::store_offsets(const std::vector<PartitionId>& ids) {
  std::vector<StorePosition> positions;
  std::vector<Part*> updated;
  for (const auto& id : ids) {
    auto it = parts.find(id);
    if (it == parts.end()) continue;
    auto pos = it->second.tracker->committable();
    if (!pos || *pos <= it->second.stored) continue;
    positions.push_back({&id.topic, id.partition, *pos});
    updated.push_back(&it->second);
  }
  if (positions.empty()) return;
  const auto errors = store_positions(*consumer, positions);
  for (std::size_t i = 0; i < positions.size(); ++i) {
    if (errors[i] == RdKafka::ERR_NO_ERROR) {
      updated[i]->stored = positions[i].offset;
    } else {
      spdlog::warn("repartition: cannot hand {}[{}]@{} to the committer: {}; it will be retried",
                   *positions[i].topic, positions[i].partition, positions[i].offset,
                   describe_kafka_error(errors[i]));
    }
  }
}

void Repartitioner::Impl::offset_commit_cb(RdKafka::ErrorCode err,
                                           std::vector<RdKafka::TopicPartition*>& offsets) {
  if (err == RdKafka::ERR__NO_OFFSET) return;
  for (auto* tp : offsets) {
    const RdKafka::ErrorCode e = err != RdKafka::ERR_NO_ERROR ? err : tp->err();
    if (e == RdKafka::ERR_REBALANCE_IN_PROGRESS) continue;  // stays stored, sent again
    if (e != RdKafka::ERR_NO_ERROR) {
      spdlog::warn("repartition: commit of {}[{}]@{} failed: {}", tp->topic(), tp->partition(),
                   tp->offset(), describe_kafka_error(e));
      continue;
    }
    if (tp->offset() < 0) continue;
    auto& c = confirmed[PartitionId{tp->topic(), tp->partition()}];
    c = std::max(c, tp->offset());
  }
}

bool Repartitioner::Impl::all_stored_confirmed() const {
  for (const auto& [id, p] : parts) {
    if (p.stored < 0) continue;
    auto it = confirmed.find(id);
    if (it == confirmed.end() || it->second < p.stored) return false;
  }
  return true;
}

void Repartitioner::Impl::drain_until(Clock::time_point deadline,
                                      const std::function<bool()>& done) {
  // Serves callbacks without processing: a record fetched now is read again.
  while (!done() && Clock::now() < deadline) OwnedMessage msg(consumer->consume(50));
}

void Repartitioner::Impl::update_lag() {
  std::int64_t lag = 0;
  for (const auto& [id, p] : parts) {
    std::vector<RdKafka::TopicPartition*> one{
        RdKafka::TopicPartition::create(id.topic, id.partition)};
    std::int64_t low = -1, high = -1;
    if (consumer->position(one) == RdKafka::ERR_NO_ERROR && one[0]->offset() >= 0 &&
        consumer->get_watermark_offsets(id.topic, id.partition, &low, &high) ==
            RdKafka::ERR_NO_ERROR &&
        high >= 0) {
      lag += std::max<std::int64_t>(0, high - one[0]->offset());
    }
    RdKafka::TopicPartition::destroy(one);
  }
  counters.lag.store(lag, std::memory_order_relaxed);
}

Status Repartitioner::Impl::open_topics() {
  internal_topic.reset(
      rd_kafka_topic_new(producer->c_ptr(), config.repartition.topic.c_str(), nullptr));
  if (config.on_invalid == config::OnInvalid::kDlq) {
    dlq_topic.reset(rd_kafka_topic_new(producer->c_ptr(), config.dlq_topic.c_str(), nullptr));
  }
  if (!internal_topic || (config.on_invalid == config::OnInvalid::kDlq && !dlq_topic)) {
    return fail("repartition producer: cannot create the topic handles: " +
                describe_kafka_error(static_cast<RdKafka::ErrorCode>(rd_kafka_last_error())));
  }
  return {};
}

Status Repartitioner::Impl::run(const std::atomic<bool>& stop) {
  if (ran) return fail("a Repartitioner runs only once");
  ran = true;
  // Topic handles only now, after prepare_topics(): a handle asks the
  // cluster for the topic's metadata, which creates a missing topic with the
  // broker's default partition count where auto.create.topics.enable is on.
  if (auto s = open_topics(); !s) return s;
  std::atomic<bool> delivery_stop{false};
  std::thread delivery([&] {
    while (!delivery_stop.load(std::memory_order_relaxed)) producer->poll(50);
  });
  auto stop_delivery = [&] {
    delivery_stop = true;
    delivery.join();
  };
  if (auto err = consumer->subscribe(config.input.topics); err != RdKafka::ERR_NO_ERROR) {
    stop_delivery();
    return fail("cannot subscribe to the input topics: " + describe_kafka_error(err));
  }
  subscribed = true;
  spdlog::info("repartition: joined consumer group '{}': input -> '{}' ({} partitions)", group,
               config.repartition.topic, partitions);
  constexpr auto kStoreEvery = std::chrono::milliseconds(50);
  constexpr auto kLagEvery = std::chrono::seconds(1);
  auto next_store = Clock::now() + kStoreEvery;
  auto next_lag = Clock::now() + kLagEvery;
  while (!stop.load(std::memory_order_relaxed) && !fatal.raised()) {
    OwnedMessage msg(consumer->consume(20));
    if (classify_consumed(msg->err(), msg->topic_name(), *consumer, fatal,
                          "repartition consumer") == Consumed::kRecord) {
      process(*msg);
    }
    const auto now = Clock::now();
    if (now >= next_store) {
      store_offsets(ids());
      next_store = now + kStoreEvery;
    }
    if (now >= next_lag) {
      update_lag();
      next_lag = now + kLagEvery;
    }
  }

  const bool graceful = !fatal.raised();
  spdlog::info(graceful ? "repartition: shutting down: waiting for in-flight records"
                        : "repartition: stopping after a fatal error; committing what was "
                          "acknowledged");
  const auto deadline =
      Clock::now() + (graceful ? config.shutdown_timeout : std::chrono::milliseconds(5'000));
  wait_delivered(ids(), deadline);
  store_offsets(ids());
  drain_until(deadline, [this] { return all_stored_confirmed(); });
  if (!all_stored_confirmed()) {
    spdlog::warn(
        "repartition: not every final offset was confirmed within shutdown_timeout; the next "
        "owner reads those records again (the dedup stage removes their copies)");
  }
  // librdkafka 2.0.2 aborts when a cooperative member closes before its
  // first SyncGroup (pipeline/README.md): wait for that first round.
  if (!joined_once) drain_until(Clock::now() + first_join_wait, [this] { return joined_once; });
  if (auto err = consumer->close(); err != RdKafka::ERR_NO_ERROR) {
    spdlog::warn("repartition: leaving the consumer group: {}", describe_kafka_error(err));
  }
  producer->flush(5'000);
  stop_delivery();
  spdlog::info(
      "repartition: {} records in, {} repartitioned, {} dead-lettered, {} dropped, {} "
      "passed",
      counters.in.load(), counters.repartitioned.load(), counters.dead_lettered.load(),
      counters.dropped.load(), counters.passed.load());
  if (fatal.raised()) return fail(fatal.message());
  spdlog::info("repartition: stopped cleanly");
  return {};
}

Repartitioner::Repartitioner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Repartitioner::~Repartitioner() = default;

Result<std::unique_ptr<Repartitioner>> Repartitioner::create(const config::Config& config) {
  if (!config.repartition.enabled() || config.repartition.partitions < 1) {
    return fail(
        "repartition: the config has no repartition stage (repartition.topic and "
        "repartition.partitions)");
  }
  auto extractor = identity::IdentityExtractor::create(config.identity.extractor);
  if (!extractor) return fail("identity.extractor: " + extractor.error().message);
  auto impl = std::make_unique<Impl>(config, std::move(*extractor));
  if (auto s = impl->build_clients(); !s) return fail(s.error().message);
  return std::unique_ptr<Repartitioner>(new Repartitioner(std::move(impl)));
}

Status Repartitioner::prepare_topics() {
  return prepare_repartition_topics(*impl_->producer, impl_->config);
}

Status Repartitioner::run(const std::atomic<bool>& stop) { return impl_->run(stop); }

RepartitionStats Repartitioner::stats() const {
  const Counters& c = impl_->counters;
  RepartitionStats s;
  s.in = c.in.load(std::memory_order_relaxed);
  s.repartitioned = c.repartitioned.load(std::memory_order_relaxed);
  s.dead_lettered = c.dead_lettered.load(std::memory_order_relaxed);
  s.dropped = c.dropped.load(std::memory_order_relaxed);
  s.passed = c.passed.load(std::memory_order_relaxed);
  s.delivery_errors = c.delivery_errors.load(std::memory_order_relaxed);
  s.lag = c.lag.load(std::memory_order_relaxed);
  s.assigned = c.assigned.load(std::memory_order_relaxed);
  s.rebalances = c.rebalances.load(std::memory_order_relaxed);
  return s;
}

}  // namespace kdedup::pipeline
