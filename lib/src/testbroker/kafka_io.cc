#include "kdedup/testbroker/kafka_io.h"

#include <unistd.h>

#include <librdkafka/rdkafkacpp.h>

#include <atomic>
#include <random>

#include <fmt/format.h>

#include "kdedup/common/kafka_log.h"

namespace kdedup::testbroker {

std::optional<std::string> KafkaRecord::header(std::string_view name) const {
  for (const auto& h : headers) {
    if (h.name == name) return h.value;
  }
  return std::nullopt;
}

namespace {

/// The test clients' log lines and errors, into the process's log (never
/// librdkafka's raw stderr lines). Stateless: one instance serves them all.
class ClientLog final : public RdKafka::EventCb {
 public:
  void event_cb(RdKafka::Event& event) override {
    if (event.type() == RdKafka::Event::EVENT_LOG) {
      log_librdkafka("test client", event.severity(), event.fac(), event.str());
    } else if (event.type() == RdKafka::Event::EVENT_ERROR) {
      log_librdkafka("test client", RdKafka::Event::EVENT_SEVERITY_ERROR,
                     RdKafka::err2str(event.err()), event.str());
    }
  }
};

Result<std::unique_ptr<RdKafka::Conf>> make_conf(const std::string& bootstrap,
                                                 const KafkaProperties& props) {
  std::unique_ptr<RdKafka::Conf> conf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  std::string err;
  static ClientLog log;
  if (conf->set("event_cb", static_cast<RdKafka::EventCb*>(&log), err) != RdKafka::Conf::CONF_OK) {
    return fail("event_cb: " + err);
  }
  if (conf->set("bootstrap.servers", bootstrap, err) != RdKafka::Conf::CONF_OK) {
    return fail("bootstrap.servers: " + err);
  }
  for (const auto& [k, v] : props) {
    if (conf->set(k, v, err) != RdKafka::Conf::CONF_OK) {
      return fail(fmt::format("kafka property {}={}: {}", k, v, err));
    }
  }
  return conf;
}

std::string unique_group(std::string_view purpose) {
  static std::atomic<unsigned> seq{0};
  std::random_device rd;
  return fmt::format("kdedup-{}-{}-{}-{:x}", purpose, getpid(), seq++, rd());
}

struct TopicPartitionList {
  std::vector<RdKafka::TopicPartition*> parts;
  ~TopicPartitionList() { RdKafka::TopicPartition::destroy(parts); }
};

// A consumer used only for metadata, watermarks, assign() and committed():
// it never subscribes, so it never joins or disturbs a group.
Result<std::unique_ptr<RdKafka::KafkaConsumer>> make_consumer(const std::string& bootstrap,
                                                              const std::string& group) {
  auto conf = make_conf(bootstrap, {{"group.id", group},
                                    {"enable.auto.commit", "false"},
                                    {"enable.partition.eof", "true"},
                                    {"auto.offset.reset", "earliest"},
                                    {"log_level", "3"}});
  if (!conf) return tl::unexpected(conf.error());
  std::string err;
  std::unique_ptr<RdKafka::KafkaConsumer> c(RdKafka::KafkaConsumer::create(conf->get(), err));
  if (!c) return fail("cannot create consumer: " + err);
  return c;
}

Result<int> partition_count(RdKafka::KafkaConsumer& consumer, const std::string& topic,
                            std::chrono::milliseconds timeout) {
  std::string err;
  std::unique_ptr<RdKafka::Topic> t(RdKafka::Topic::create(&consumer, topic, nullptr, err));
  if (!t) return fail(fmt::format("topic {}: {}", topic, err));
  RdKafka::Metadata* raw = nullptr;
  auto e = consumer.metadata(false, t.get(), &raw, static_cast<int>(timeout.count()));
  std::unique_ptr<RdKafka::Metadata> md(raw);
  if (e != RdKafka::ERR_NO_ERROR) {
    return fail(fmt::format("topic {}: metadata: {}", topic, RdKafka::err2str(e)));
  }
  for (const auto* tm : *md->topics()) {
    if (tm->topic() != topic) continue;
    if (tm->err() != RdKafka::ERR_NO_ERROR) {
      return fail(fmt::format("topic {}: {}", topic, RdKafka::err2str(tm->err())));
    }
    return static_cast<int>(tm->partitions()->size());
  }
  return fail(fmt::format("topic {}: not in cluster metadata", topic));
}

}  // namespace

// ---------------------------------------------------------------- producer

struct RecordProducer::Impl : public RdKafka::DeliveryReportCb {
  std::unique_ptr<RdKafka::Producer> producer;
  DeliveryFn on_delivery;
  std::uint64_t delivered = 0;
  std::uint64_t failed = 0;
  std::string first_error;

  void dr_cb(RdKafka::Message& m) override {
    if (m.err() != RdKafka::ERR_NO_ERROR) {
      if (failed++ == 0) {
        first_error = fmt::format("{} [{}]: {}", m.topic_name(), m.partition(), m.errstr());
      }
      return;
    }
    ++delivered;
    if (on_delivery) {
      on_delivery(reinterpret_cast<std::uintptr_t>(m.msg_opaque()), m.partition(), m.offset());
    }
  }
};

RecordProducer::RecordProducer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RecordProducer::~RecordProducer() {
  // Give queued records a short chance to go out; the caller decides about
  // completeness with flush().
  if (impl_->producer) impl_->producer->flush(1000);
}

Result<std::unique_ptr<RecordProducer>> RecordProducer::create(const std::string& bootstrap,
                                                               const KafkaProperties& extra) {
  KafkaProperties props{{"enable.idempotence", "true"},
                        {"linger.ms", "5"},
                        {"log_level", "3"},
                        {"queue.buffering.max.messages", "200000"}};
  for (const auto& [k, v] : extra) props[k] = v;
  auto conf = make_conf(bootstrap, props);
  if (!conf) return tl::unexpected(conf.error());
  auto impl = std::make_unique<Impl>();
  std::string err;
  if ((*conf)->set("dr_cb", static_cast<RdKafka::DeliveryReportCb*>(impl.get()), err) !=
      RdKafka::Conf::CONF_OK) {
    return fail("producer: " + err);
  }
  impl->producer.reset(RdKafka::Producer::create(conf->get(), err));
  if (!impl->producer) return fail("cannot create producer: " + err);
  return std::unique_ptr<RecordProducer>(new RecordProducer(std::move(impl)));
}

void RecordProducer::on_delivery(DeliveryFn fn) { impl_->on_delivery = std::move(fn); }

Status RecordProducer::produce(const std::string& topic, std::int32_t partition,
                               std::optional<std::string_view> key, std::string_view value,
                               std::int64_t timestamp_ms, const std::vector<Header>& headers,
                               std::uint64_t tag) {
  while (true) {
    RdKafka::Headers* hdrs = nullptr;
    if (!headers.empty()) {
      hdrs = RdKafka::Headers::create();
      for (const auto& h : headers) hdrs->add(h.name, h.value.data(), h.value.size());
    }
    auto e = impl_->producer->produce(
        topic, partition < 0 ? RdKafka::Topic::PARTITION_UA : partition,
        RdKafka::Producer::RK_MSG_COPY, const_cast<char*>(value.data()), value.size(),
        key ? key->data() : nullptr, key ? key->size() : 0, timestamp_ms, hdrs,
        reinterpret_cast<void*>(static_cast<std::uintptr_t>(tag)));
    if (e == RdKafka::ERR_NO_ERROR) {
      impl_->producer->poll(0);
      return {};
    }
    delete hdrs;  // not taken over on failure
    if (e != RdKafka::ERR__QUEUE_FULL) {
      return fail(fmt::format("produce to {}: {}", topic, RdKafka::err2str(e)));
    }
    impl_->producer->poll(50);
  }
}

Status RecordProducer::flush(std::chrono::milliseconds timeout) {
  auto e = impl_->producer->flush(static_cast<int>(timeout.count()));
  impl_->producer->poll(0);
  if (e != RdKafka::ERR_NO_ERROR) {
    return fail(fmt::format("producer flush: {} ({} records still queued)", RdKafka::err2str(e),
                            impl_->producer->outq_len()));
  }
  if (impl_->failed > 0) {
    return fail(
        fmt::format("{} records failed delivery; first: {}", impl_->failed, impl_->first_error));
  }
  return {};
}

std::uint64_t RecordProducer::delivered() const noexcept { return impl_->delivered; }
std::uint64_t RecordProducer::failed() const noexcept { return impl_->failed; }

// ---------------------------------------------------------------- readers

Result<std::vector<PartitionWatermarks>> query_watermarks(const std::string& bootstrap,
                                                          const std::string& topic,
                                                          std::chrono::milliseconds timeout) {
  auto consumer = make_consumer(bootstrap, unique_group("watermarks"));
  if (!consumer) return tl::unexpected(consumer.error());
  auto n = partition_count(**consumer, topic, timeout);
  if (!n) return tl::unexpected(n.error());
  std::vector<PartitionWatermarks> out;
  for (int p = 0; p < *n; ++p) {
    PartitionWatermarks w;
    w.partition = p;
    auto e = (*consumer)->query_watermark_offsets(topic, p, &w.low, &w.high,
                                                  static_cast<int>(timeout.count()));
    if (e != RdKafka::ERR_NO_ERROR) {
      return fail(fmt::format("topic {} [{}]: watermarks: {}", topic, p, RdKafka::err2str(e)));
    }
    out.push_back(w);
  }
  (*consumer)->close();
  return out;
}

Result<std::vector<KafkaRecord>> read_topic(const std::string& bootstrap, const std::string& topic,
                                            std::chrono::milliseconds timeout) {
  auto marks = query_watermarks(bootstrap, topic, timeout);
  if (!marks) return tl::unexpected(marks.error());
  auto consumer = make_consumer(bootstrap, unique_group("reader"));
  if (!consumer) return tl::unexpected(consumer.error());
  auto& c = **consumer;

  std::vector<std::vector<KafkaRecord>> by_partition(marks->size());
  std::vector<std::int64_t> next(marks->size());
  std::size_t open = 0;
  TopicPartitionList assignment;
  for (const auto& w : *marks) {
    next[static_cast<std::size_t>(w.partition)] = w.low;
    if (w.high > w.low) {
      ++open;
      assignment.parts.push_back(RdKafka::TopicPartition::create(topic, w.partition, w.low));
    }
  }
  if (open > 0) {
    if (auto e = c.assign(assignment.parts); e != RdKafka::ERR_NO_ERROR) {
      return fail(fmt::format("topic {}: assign: {}", topic, RdKafka::err2str(e)));
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (open > 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      return fail(
          fmt::format("topic {}: read did not reach the end within {} ms", topic, timeout.count()));
    }
    std::unique_ptr<RdKafka::Message> m(c.consume(100));
    if (m->err() == RdKafka::ERR__TIMED_OUT || m->err() == RdKafka::ERR__PARTITION_EOF) continue;
    if (m->err() != RdKafka::ERR_NO_ERROR) {
      return fail(fmt::format("topic {}: consume: {}", topic, m->errstr()));
    }
    auto p = static_cast<std::size_t>(m->partition());
    if (p >= by_partition.size() || m->offset() >= (*marks)[p].high) continue;
    KafkaRecord r;
    r.topic = topic;
    r.partition = m->partition();
    r.offset = m->offset();
    if (m->key_pointer())
      r.key = std::string(static_cast<const char*>(m->key_pointer()), m->key_len());
    r.value.assign(static_cast<const char*>(m->payload()), m->len());
    r.timestamp_ms = m->timestamp().timestamp;
    if (RdKafka::Headers* h = m->headers()) {
      for (const auto& hd : h->get_all()) {
        r.headers.push_back(Header{hd.key(), hd.value()
                                                 ? std::string(hd.value_string(), hd.value_size())
                                                 : std::string()});
      }
    }
    by_partition[p].push_back(std::move(r));
    next[p] = m->offset() + 1;
    if (next[p] >= (*marks)[p].high) --open;
  }
  c.close();
  std::vector<KafkaRecord> out;
  for (auto& part : by_partition) {
    for (auto& r : part) out.push_back(std::move(r));
  }
  return out;
}

Result<std::vector<std::int64_t>> committed_offsets(const std::string& bootstrap,
                                                    const std::string& group,
                                                    const std::string& topic,
                                                    std::chrono::milliseconds timeout) {
  auto consumer = make_consumer(bootstrap, group);
  if (!consumer) return tl::unexpected(consumer.error());
  auto n = partition_count(**consumer, topic, timeout);
  if (!n) return tl::unexpected(n.error());
  TopicPartitionList list;
  for (int p = 0; p < *n; ++p) list.parts.push_back(RdKafka::TopicPartition::create(topic, p));
  auto e = (*consumer)->committed(list.parts, static_cast<int>(timeout.count()));
  if (e != RdKafka::ERR_NO_ERROR) {
    return fail(
        fmt::format("group {} topic {}: committed offsets: {}", group, topic, RdKafka::err2str(e)));
  }
  std::vector<std::int64_t> out(static_cast<std::size_t>(*n), -1);
  for (auto* tp : list.parts) {
    if (tp->offset() >= 0) out[static_cast<std::size_t>(tp->partition())] = tp->offset();
  }
  // close() is skipped on purpose: this consumer never joined the group.
  return out;
}

}  // namespace kdedup::testbroker
