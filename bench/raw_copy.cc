// raw_copy: the physical limit `kdedup run` is measured against
// (pipeline_bench --compare cost). A minimal librdkafka consume -> produce
// loop with the client settings kdedup would use for the same config
// (config::consumer_properties / producer_properties: the same fetch sizes,
// linger, batching, idempotence) and the same consume batch size, and nothing
// else: no identity, filter, provenance headers, delivery tracking or offset
// bookkeeping. Offsets are committed by librdkafka's auto commit every
// `commit_interval` (stored as consumed), so the copy is at-most-once and
// only a yardstick.
//
// It takes kdedup's own command line so the pipeline rig can start it in
// place of kdedup:  raw_copy run --config PATH [--set key=value]...
// Output partition = input partition (output.partitioning: input). SIGTERM
// flushes, commits and leaves the group.

#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <librdkafka/rdkafkacpp.h>

#include "kdedup/config/config.h"

namespace {

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

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

int copy(const kdedup::config::Config& config) {
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
  const std::string& out = config.output.topic;
  const std::uint32_t batch = config.batch_size;
  while (g_stop == 0) {
    for (std::uint32_t i = 0; i < batch && g_stop == 0; ++i) {
      std::unique_ptr<RdKafka::Message> m(consumer->consume(i == 0 ? 20 : 0));
      if (m->err() == RdKafka::ERR__TIMED_OUT || m->err() == RdKafka::ERR__PARTITION_EOF) break;
      if (m->err() != RdKafka::ERR_NO_ERROR) {
        std::fprintf(stderr, "raw_copy: consume: %s\n", m->errstr().c_str());
        break;
      }
      for (;;) {
        const RdKafka::ErrorCode e =
            producer->produce(out, m->partition(), RdKafka::Producer::RK_MSG_COPY, m->payload(),
                              m->len(), m->key_pointer(), m->key_pointer() ? m->key_len() : 0,
                              m->timestamp().timestamp, nullptr);
        if (e != RdKafka::ERR__QUEUE_FULL) break;
        producer->poll(1);
      }
    }
    producer->poll(0);
  }
  producer->flush(10'000);
  consumer->commitSync();
  consumer->close();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  std::vector<std::string> overrides;
  for (int i = 2; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--config") && i + 1 < argc) {
      path = argv[++i];
    } else if (!std::strcmp(argv[i], "--set") && i + 1 < argc) {
      overrides.emplace_back(argv[++i]);
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
  return copy(*config);
}
