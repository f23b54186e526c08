// raw_copy: the physical limit `kdedup run` is measured against
// (pipeline_bench --compare cost). A minimal librdkafka consume -> produce
// loop with the client settings kdedup would use for the same config
// (config::consumer_properties / producer_properties: the same fetch sizes,
// linger, batching, idempotence) and the same consume batch size, through
// the cheapest calls librdkafka has (batches from the consumer queue,
// produce by topic handle), and nothing
// else: no identity, filter, provenance headers, delivery tracking or offset
// bookkeeping. Offsets are committed by librdkafka's auto commit every
// `commit_interval` (stored as consumed), so the copy is at-most-once and
// only a yardstick.
//
// With `--set raw_copy.provenance=true` it also asks librdkafka for what
// kdedup's output format needs from it, and nothing of kdedup's own work:
// the input's headers copied plus kdedup's three provenance headers on every
// record, and a delivery report per record (counted, nothing else). The
// difference between the two copies is what the format costs inside
// librdkafka; the rest of kdedup run's cost over it is kdedup's code.
// `raw_copy.headers=true` and `raw_copy.reports=true` ask for one half each
// (pipeline_bench --compare format), to tell the two costs apart.
//
// It takes kdedup's own command line so the pipeline rig can start it in
// place of kdedup:  raw_copy run --config PATH [--set key=value]...
// Output partition = input partition (output.partitioning: input). SIGTERM
// flushes, commits and leaves the group.

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafkacpp.h>

#include <fmt/format.h>

#include "kdedup/config/config.h"
#include "kdedup/pipeline/provenance.h"

namespace {

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

/// What the copy asks librdkafka for beyond consume and produce.
struct Extras {
  bool headers = false;  // the input's headers taken over, three provenance headers added
  bool reports = false;  // a delivery report per record
};

/// Applies one `--set` of the copy's own (raw_copy.*); false for any other.
bool take_option(std::string_view set, Extras& extras) {
  if (set == "raw_copy.provenance=true") {
    extras.headers = extras.reports = true;
  } else if (set == "raw_copy.headers=true") {
    extras.headers = true;
  } else if (set == "raw_copy.reports=true") {
    extras.reports = true;
  } else {
    return false;
  }
  return true;
}

/// Counts delivery reports; a failure is printed (the copy goes on).
class CountReports final : public RdKafka::DeliveryReportCb {
 public:
  void dr_cb(RdKafka::Message& message) override {
    if (message.err() == RdKafka::ERR_NO_ERROR) {
      ++delivered_;
    } else {
      std::fprintf(stderr, "raw_copy: delivery failed: %s\n", message.errstr().c_str());
    }
  }

 private:
  std::uint64_t delivered_ = 0;
};

/// The input's headers plus kdedup's provenance headers, as kdedup builds
/// them (output_producer.cc): the input's list taken over, three added.
rd_kafka_headers_t* provenance_headers(rd_kafka_message_t& m) {
  rd_kafka_headers_t* headers = nullptr;
  if (rd_kafka_message_detach_headers(&m, &headers) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    headers = rd_kafka_headers_new(3);
  }
  const fmt::format_int partition(m.partition);
  const fmt::format_int offset(m.offset);
  const std::string_view topic = rd_kafka_topic_name(m.rkt);
  auto add = [&](std::string_view name, std::string_view value) {
    rd_kafka_header_add(headers, name.data(), static_cast<ssize_t>(name.size()), value.data(),
                        static_cast<ssize_t>(value.size()));
  };
  add(kdedup::pipeline::kProvenanceTopicHeader, topic);
  add(kdedup::pipeline::kProvenancePartitionHeader, {partition.data(), partition.size()});
  add(kdedup::pipeline::kProvenanceOffsetHeader, {offset.data(), offset.size()});
  return headers;
}

bool set_all(RdKafka::Conf& conf, const kdedup::config::KafkaProperties& props) {
  std::string err;
  for (const auto& [key, value] : props) {
    if (conf.set(key, value, err) != RdKafka::Conf::CONF_OK) {
      std::fprintf(stderr, "raw_copy: property %s: %s\n", key.c_str(), err.c_str());
      return false;
    }
  }
  return true;
}

int copy(const kdedup::config::Config& config, Extras extras) {
  // kdedup's own default reset position, unless the config sets one.
  kdedup::config::KafkaProperties consumer_props{{"auto.offset.reset", "earliest"}};
  for (const auto& [key, value] : kdedup::config::consumer_properties(config)) {
    consumer_props[key] = value;
  }
  consumer_props["enable.auto.commit"] = "true";
  consumer_props["enable.auto.offset.store"] = "true";
  consumer_props["auto.commit.interval.ms"] = std::to_string(config.commit_interval.count());
  std::unique_ptr<RdKafka::Conf> cconf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  std::unique_ptr<RdKafka::Conf> pconf(RdKafka::Conf::create(RdKafka::Conf::CONF_GLOBAL));
  if (!set_all(*cconf, consumer_props) ||
      !set_all(*pconf, kdedup::config::producer_properties(config))) {
    return 1;
  }
  CountReports reports;
  std::string conf_err;
  if (extras.reports && pconf->set("dr_cb", &reports, conf_err) != RdKafka::Conf::CONF_OK) {
    std::fprintf(stderr, "raw_copy: dr_cb: %s\n", conf_err.c_str());
    return 1;
  }
  std::string err;
  std::unique_ptr<RdKafka::KafkaConsumer> consumer(
      RdKafka::KafkaConsumer::create(cconf.get(), err));
  std::unique_ptr<RdKafka::Producer> producer(RdKafka::Producer::create(pconf.get(), err));
  if (!consumer || !producer) {
    std::fprintf(stderr, "raw_copy: %s\n", err.c_str());
    return 1;
  }
  if (consumer->subscribe(config.input.topics) != RdKafka::ERR_NO_ERROR) {
    std::fprintf(stderr, "raw_copy: cannot subscribe\n");
    return 1;
  }
  // The cheapest librdkafka allows: records in batches from the consumer
  // queue (C API), produced by topic handle, no per-record wrapper.
  rd_kafka_queue_t* queue = rd_kafka_queue_get_consumer(consumer->c_ptr());
  rd_kafka_topic_t* out =
      rd_kafka_topic_new(producer->c_ptr(), config.output.topic.c_str(), nullptr);
  if (queue == nullptr || out == nullptr) {
    std::fprintf(stderr, "raw_copy: no consumer queue or output topic handle\n");
    return 1;
  }
  std::vector<rd_kafka_message_t*> batch(std::max<std::uint32_t>(1, config.batch_size));
  while (g_stop == 0) {
    ssize_t n = rd_kafka_consume_batch_queue(queue, 0, batch.data(), batch.size());
    if (n == 0) n = rd_kafka_consume_batch_queue(queue, 20, batch.data(), 1);
    for (ssize_t i = 0; i < n; ++i) {
      rd_kafka_message_t* m = batch[static_cast<std::size_t>(i)];
      if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        rd_kafka_timestamp_type_t type = RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        const std::int64_t ts = rd_kafka_message_timestamp(m, &type);
        const std::size_t key_len = m->key != nullptr ? m->key_len : 0;
        rd_kafka_headers_t* headers = extras.headers ? provenance_headers(*m) : nullptr;
        for (;;) {
          const rd_kafka_resp_err_t e =
              headers != nullptr
                  ? rd_kafka_producev(
                        producer->c_ptr(), RD_KAFKA_V_RKT(out), RD_KAFKA_V_PARTITION(m->partition),
                        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                        RD_KAFKA_V_VALUE(m->payload, m->len), RD_KAFKA_V_KEY(m->key, key_len),
                        RD_KAFKA_V_TIMESTAMP(ts > 0 ? ts : 0), RD_KAFKA_V_HEADERS(headers),
                        RD_KAFKA_V_END)
                  : rd_kafka_producev(
                        producer->c_ptr(), RD_KAFKA_V_RKT(out), RD_KAFKA_V_PARTITION(m->partition),
                        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                        RD_KAFKA_V_VALUE(m->payload, m->len), RD_KAFKA_V_KEY(m->key, key_len),
                        RD_KAFKA_V_TIMESTAMP(ts > 0 ? ts : 0), RD_KAFKA_V_END);
          if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
            if (e != RD_KAFKA_RESP_ERR_NO_ERROR && headers != nullptr) {
              rd_kafka_headers_destroy(headers);
            }
            break;
          }
          producer->poll(1);
        }
      } else if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
        std::fprintf(stderr, "raw_copy: consume: %s\n", rd_kafka_message_errstr(m));
      }
      rd_kafka_message_destroy(m);
    }
    producer->poll(0);
  }
  rd_kafka_topic_destroy(out);
  rd_kafka_queue_destroy(queue);
  producer->flush(10'000);
  consumer->commitSync();
  consumer->close();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  std::vector<std::string> overrides;
  Extras extras;
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--config") && i + 1 < argc) {
      path = argv[++i];
    } else if (!std::strcmp(argv[i], "--set") && i + 1 < argc) {
      if (!take_option(argv[++i], extras)) overrides.emplace_back(argv[i]);
    } else {
      std::fprintf(stderr, "raw_copy: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (argc < 2 || std::strcmp(argv[1], "run") != 0 || path.empty()) {
    std::fprintf(stderr, "usage: raw_copy run --config PATH [--set key=value]...\n");
    return 2;
  }
  auto config = kdedup::config::load_config(path, overrides);
  if (!config) {
    std::fprintf(stderr, "raw_copy: %s\n", config.error().message.c_str());
    return 1;
  }
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  return copy(*config, extras);
}
