// Unit tests of the config loader: defaults, interpolation, --set, schema
// errors with key paths, semantic checks, protected librdkafka keys.

#include "kdedup/config/config.h"

#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "process.h"

namespace kdedup::config {
namespace {

using ::testing::HasSubstr;

constexpr const char* kMinimal = R"(
group_id: g
input:
  topics: [in]
output:
  topic: out
window: 10m
dlq_topic: dlq
identity:
  salt: s3cret-s3cret-s3cret
kafka:
  bootstrap.servers: 127.0.0.1:9092
)";

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

LoadReport check(const std::string& yaml, const std::vector<std::string>& overrides = {},
                 std::map<std::string, std::string> vars = {}) {
  return check_config_text(yaml, "test.yaml", overrides, env_of(std::move(vars)));
}

/// Every error as "path: message" text, one per line, for readable failures.
std::string errors_of(const LoadReport& r) {
  std::string out;
  for (const auto& e : r.errors) out += to_string(e) + "\n";
  return out;
}

bool has_error_at(const LoadReport& r, const std::string& path, const std::string& fragment = "") {
  for (const auto& e : r.errors) {
    if (e.path == path && e.message.find(fragment) != std::string::npos) return true;
  }
  return false;
}

TEST(ConfigLoad, MinimalConfigGetsDocumentedDefaults) {
  auto r = check(kMinimal);
  ASSERT_TRUE(r.ok()) << errors_of(r);
  const Config& c = *r.config;
  EXPECT_EQ(c.group_id, "g");
  EXPECT_EQ(c.input.topics, std::vector<std::string>{"in"});
  EXPECT_EQ(c.output.topic, "out");
  EXPECT_EQ(c.output.partitioning, Partitioning::kInput);
  EXPECT_EQ(c.identity.extractor, "key");
  EXPECT_EQ(c.window_ms(), 600'000);
  EXPECT_EQ(c.max_future_skew.count(), 60'000);
  EXPECT_TRUE(c.filter_enabled);
  EXPECT_EQ(c.filter.type, filter::FilterType::kTimer);
  EXPECT_DOUBLE_EQ(c.filter.fpp, 0.01);
  EXPECT_EQ(c.filter.capacity, 1'000'000u);
  EXPECT_EQ(c.filter.ticks_per_window, 192u);  // normalized: the 8-bit timer default
  EXPECT_EQ(c.tick_scale(), filter::TickScale(600'000, 192));
  EXPECT_EQ(c.threads, 2u);
  EXPECT_EQ(c.batch_size, 512u);
  EXPECT_EQ(c.on_invalid, OnInvalid::kDlq);
  EXPECT_EQ(c.delivery, Delivery::kIdempotent);
  EXPECT_EQ(c.commit_interval.count(), 1000);
  EXPECT_EQ(c.shutdown_timeout.count(), 30'000);
  EXPECT_EQ(c.state.dir, "/var/lib/kdedup");
  EXPECT_EQ(c.state.reconcile_tail_records, 10'000);
  EXPECT_EQ(c.state.min_free_bytes, 64ULL << 20);
  EXPECT_EQ(c.state.park_after.count(), 300'000);
  EXPECT_EQ(c.metrics.address, "0.0.0.0:9464");
  EXPECT_EQ(c.metrics.audit_sample, 1024u);
  EXPECT_EQ(c.log_level, "info");
  EXPECT_TRUE(r.warnings.empty());
}

TEST(ConfigLoad, EveryKeyIsRead) {
  auto r = check(R"(
group_id: grp
input: {topics: [a, b]}
output: {topic: c, partitioning: key}
identity: {extractor: "json:/user,json:/id", salt: x}
window: 2h
max_future_skew: 0
filter:
  enabled: false
  type: exact
  fpp: 0.001
  capacity: 42
  ticks_per_window: 60
  timer_bits: 16
  equal_timers: 2
  growth: cardinality
  min_bytes: 1MiB
  max_bytes: 2GiB
threads: 8
batch_size: 64
on_invalid: drop
duplicates_topic: dups
delivery: transactional
commit_interval: 250ms
shutdown_timeout: 1m
kafka: {bootstrap.servers: "k:9092", linger.ms: 5, enable.ssl.certificate.verification: false}
consumer: {fetch.max.bytes: 1048576, group.instance.id: pod-0}
producer: {compression.type: zstd}
state: {dir: /data, snapshot_interval: 10s, snapshot_records: 7, reconcile_tail_records: 500,
        min_free_bytes: 1GiB, park_after: 90s}
metrics: {address: "", per_partition: false, audit_sample: 0}
log_level: debug
)");
  ASSERT_TRUE(r.ok()) << errors_of(r);
  const Config& c = *r.config;
  EXPECT_EQ(c.input.topics, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.output.partitioning, Partitioning::kKey);
  EXPECT_EQ(c.identity.extractor, "json:/user,json:/id");
  EXPECT_EQ(c.window_ms(), 7'200'000);
  EXPECT_EQ(c.max_future_skew.count(), 0);
  EXPECT_FALSE(c.filter_enabled);
  EXPECT_EQ(c.filter.type, filter::FilterType::kExact);
  EXPECT_DOUBLE_EQ(c.filter.fpp, 0.001);
  EXPECT_EQ(c.filter.capacity, 42u);
  EXPECT_EQ(c.filter.ticks_per_window, 60u);
  EXPECT_EQ(c.filter.timer_bits, 16);
  EXPECT_EQ(c.filter.equal_timers, 2);
  EXPECT_EQ(c.filter.growth, filter::Growth::kCardinality);
  EXPECT_EQ(c.filter.min_bytes, 1u << 20);
  EXPECT_EQ(c.filter.max_bytes, 2ULL << 30);
  EXPECT_EQ(c.threads, 8u);
  EXPECT_EQ(c.batch_size, 64u);
  EXPECT_EQ(c.on_invalid, OnInvalid::kDrop);
  EXPECT_EQ(c.duplicates_topic, "dups");
  EXPECT_EQ(c.delivery, Delivery::kTransactional);
  EXPECT_EQ(c.commit_interval.count(), 250);
  EXPECT_EQ(c.shutdown_timeout.count(), 60'000);
  // librdkafka values are passed on as the text that was written.
  EXPECT_EQ(c.kafka.at("linger.ms"), "5");
  EXPECT_EQ(c.kafka.at("enable.ssl.certificate.verification"), "false");
  EXPECT_EQ(c.consumer.at("fetch.max.bytes"), "1048576");
  EXPECT_EQ(c.producer.at("compression.type"), "zstd");
  EXPECT_EQ(c.state.dir, "/data");
  EXPECT_EQ(c.state.snapshot_interval.count(), 10'000);
  EXPECT_EQ(c.state.snapshot_records, 7u);
  EXPECT_EQ(c.state.reconcile_tail_records, 500);
  EXPECT_EQ(c.state.min_free_bytes, 1ULL << 30);
  EXPECT_EQ(c.state.park_after.count(), 90'000);
  EXPECT_EQ(c.metrics.address, "");
  EXPECT_FALSE(c.metrics.per_partition);
  EXPECT_EQ(c.metrics.audit_sample, 0u);
  EXPECT_EQ(c.log_level, "debug");
}

TEST(ConfigLoad, StateKeys) {
  // An empty state dir turns snapshots off (every assignment rebuilds).
  auto none = check(std::string(kMinimal) + "state: {dir: \"\"}\n");
  ASSERT_TRUE(none.ok()) << errors_of(none);
  EXPECT_EQ(none.config->state.dir, "");
  auto zero = check(std::string(kMinimal) + "state: {reconcile_tail_records: 0}\n");
  EXPECT_TRUE(has_error_at(zero, "state.reconcile_tail_records", "")) << errors_of(zero);
  auto bad = check(std::string(kMinimal) + "state: {min_free_bytes: lots}\n");
  EXPECT_TRUE(has_error_at(bad, "state.min_free_bytes", "")) << errors_of(bad);
  auto big = check(std::string(kMinimal), {"state.min_free_bytes=1TiB"});
  ASSERT_TRUE(big.ok()) << errors_of(big);
  EXPECT_EQ(big.config->state.min_free_bytes, 1ULL << 40);
  // Parking: 0 (with or without a unit) turns it off; anything else needs
  // a unit.
  for (const char* off : {"0", "0s", "0ms"}) {
    auto never = check(std::string(kMinimal) + "state: {park_after: " + off + "}\n");
    ASSERT_TRUE(never.ok()) << off << ": " << errors_of(never);
    EXPECT_EQ(never.config->state.park_after.count(), 0) << off;
  }
  auto unitless = check(std::string(kMinimal) + "state: {park_after: 30}\n");
  EXPECT_TRUE(has_error_at(unitless, "state.park_after", "")) << errors_of(unitless);
  auto word = check(std::string(kMinimal) + "state: {park_after: soon}\n");
  EXPECT_TRUE(has_error_at(word, "state.park_after", "")) << errors_of(word);
  // The largest: what int64 milliseconds hold (never reached); a day more
  // is an error naming the key.
  auto largest = check(std::string(kMinimal) + "state: {park_after: 106751991167d}\n");
  ASSERT_TRUE(largest.ok()) << errors_of(largest);
  EXPECT_EQ(largest.config->state.park_after.count(), 106751991167LL * 86'400'000);
  auto beyond = check(std::string(kMinimal) + "state: {park_after: 106751991168d}\n");
  EXPECT_TRUE(has_error_at(beyond, "state.park_after", "too large a duration"))
      << errors_of(beyond);
}

TEST(ConfigLoad, NumericLookingStringsStayStrings) {
  auto r = check(std::string(kMinimal) + "state:\n  dir: 2024\n", {"group_id=123"});
  ASSERT_TRUE(r.ok()) << errors_of(r);
  EXPECT_EQ(r.config->group_id, "123");
  EXPECT_EQ(r.config->state.dir, "2024");
}

TEST(ConfigLoad, ReportsEveryErrorWithItsKeyPath) {
  auto r = check(R"(
group_id: g
input: {topics: []}
output: {topic: out, partitioning: sideways}
window: 10 minutes
filter: {fpp: 0.7, timer_bits: 5, capacity: -1}
threads: 0
on_invalid: explode
kafka: {bootstrap.servers: "k:1"}
metrics: {address: "nowhere"}
)");
  EXPECT_FALSE(r.ok());
  const std::string all = errors_of(r);
  EXPECT_TRUE(has_error_at(r, "input.topics")) << all;
  EXPECT_TRUE(has_error_at(r, "output.partitioning")) << all;
  EXPECT_TRUE(has_error_at(r, "window")) << all;
  EXPECT_TRUE(has_error_at(r, "filter.fpp")) << all;
  EXPECT_TRUE(has_error_at(r, "filter.timer_bits")) << all;
  EXPECT_TRUE(has_error_at(r, "filter.capacity")) << all;
  EXPECT_TRUE(has_error_at(r, "threads")) << all;
  EXPECT_TRUE(has_error_at(r, "on_invalid")) << all;
  EXPECT_TRUE(has_error_at(r, "metrics.address", "host:port")) << all;
  // Errors point at the file location of the offending value.
  for (const auto& e : r.errors) {
    if (e.path == "threads") {
      EXPECT_EQ(e.where, "test.yaml:7:10");
    }
  }
}

TEST(ConfigLoad, RequiredKeysAreNamed) {
  auto r = check("log_level: info\n");
  const std::string all = errors_of(r);
  EXPECT_FALSE(r.ok());
  for (const char* key : {"group_id", "input", "output", "window", "kafka"}) {
    EXPECT_THAT(all, HasSubstr(key)) << all;
  }
}

TEST(ConfigLoad, UnknownKeysAreRejectedWithASuggestion) {
  auto r = check(std::string(kMinimal) + "filter:\n  fppp: 0.1\ncolour: blue\n");
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(has_error_at(r, "filter.fppp", "did you mean 'fpp'")) << errors_of(r);
  EXPECT_TRUE(has_error_at(r, "colour", "unknown key")) << errors_of(r);
}

TEST(ConfigLoad, DuplicateKeyIsAnError) {
  auto r = check(std::string(kMinimal) + "threads: 2\nthreads: 3\n");
  EXPECT_TRUE(has_error_at(r, "threads", "duplicate")) << errors_of(r);
}

TEST(ConfigLoad, SemanticChecks) {
  auto r = check(R"(
group_id: g
input: {topics: [a, b]}
output: {topic: b}
window: 100ms
filter: {min_bytes: 2MiB, max_bytes: 1MiB}
on_invalid: dlq
duplicates_topic: a
kafka: {other: x}
)");
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(has_error_at(r, "output.topic", "input topic")) << errors_of(r);
  EXPECT_TRUE(has_error_at(r, "dlq_topic", "required when on_invalid is dlq")) << errors_of(r);
  EXPECT_TRUE(has_error_at(r, "duplicates_topic")) << errors_of(r);
  EXPECT_TRUE(has_error_at(r, "filter.max_bytes",
                           "filter.min_bytes (2.0 MiB) is more than filter.max_bytes (1.0 MiB)"))
      << errors_of(r);
  EXPECT_TRUE(has_error_at(r, "kafka.bootstrap.servers", "required")) << errors_of(r);

  // Ticks shorter than a millisecond are fine: the mapping is exact.
  auto ticks = check(std::string(kMinimal) + "filter: {ticks_per_window: 1000, timer_bits: 16}\n",
                     {"window=500ms"});
  EXPECT_TRUE(ticks.ok()) << errors_of(ticks);
}

TEST(ConfigLoad, AFloorAboveTheLargestPartNamesTheKeySetAndBothValues) {
  // Only min_bytes set, above the default max_bytes (1 GiB): said at min_bytes.
  auto min = check(std::string(kMinimal) + "filter: {min_bytes: 2GiB}\n");
  EXPECT_TRUE(has_error_at(min, "filter.min_bytes",
                           "filter.min_bytes (2.00 GiB) is more than filter.max_bytes (1.00 GiB, "
                           "the default): the floor every filter starts at cannot pass the "
                           "largest part it may add; lower filter.min_bytes or raise "
                           "filter.max_bytes"))
      << errors_of(min);
  // Only max_bytes set, below the default floor (64 KiB): said at max_bytes.
  auto max = check(std::string(kMinimal) + "filter: {max_bytes: 32KiB}\n");
  EXPECT_TRUE(has_error_at(max, "filter.max_bytes",
                           "filter.min_bytes (64.0 KiB, the default) is more than "
                           "filter.max_bytes (32.0 KiB)"))
      << errors_of(max);
  // The edge: equal is a filter that never grows past its floor.
  auto equal = check(std::string(kMinimal) + "filter: {min_bytes: 32KiB, max_bytes: 32KiB}\n");
  EXPECT_TRUE(equal.ok()) << errors_of(equal);
}

TEST(ConfigLoad, CompactFilterTypeAndItsLimits) {
  auto r = check(std::string(kMinimal) + "filter: {type: compact, fpp: 0.001}\n");
  ASSERT_TRUE(r.ok()) << errors_of(r);
  EXPECT_EQ(r.config->filter.type, filter::FilterType::kCompact);
  EXPECT_EQ(r.config->filter.ticks_per_window, 10u);  // normalized: one tick is 10% of the window

  auto ticks = check(std::string(kMinimal) + "filter: {type: compact, ticks_per_window: 300}\n");
  EXPECT_TRUE(has_error_at(ticks, "filter.ticks_per_window", "compact")) << errors_of(ticks);
  auto fpp = check(std::string(kMinimal) + "filter: {type: compact, fpp: 1e-8}\n");
  EXPECT_TRUE(has_error_at(fpp, "filter.fpp", "compact")) << errors_of(fpp);
  auto typo = check(std::string(kMinimal) + "filter: {type: cuckoo}\n");
  EXPECT_TRUE(has_error_at(typo, "filter.type", "compact")) << errors_of(typo);
}

TEST(ConfigLoad, ProtectedLibrdkafkaKeysAreRejectedWithTheReason) {
  auto r = check(std::string(kMinimal) + R"(
consumer: {enable.auto.commit: true, group.id: x, enable.auto.offset.store: true}
producer: {enable.idempotence: false, transactional.id: t}
)");
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(has_error_at(r, "consumer.enable.auto.commit", "commits offsets itself"))
      << errors_of(r);
  EXPECT_TRUE(has_error_at(r, "consumer.group.id", "group_id")) << errors_of(r);
  EXPECT_TRUE(has_error_at(r, "consumer.enable.auto.offset.store")) << errors_of(r);
  EXPECT_TRUE(has_error_at(r, "producer.enable.idempotence", "forces")) << errors_of(r);
  EXPECT_TRUE(has_error_at(r, "producer.transactional.id", "derives")) << errors_of(r);

  // isolation.level is protected only for transactional delivery.
  std::string with_isolation =
      std::string(kMinimal) + "consumer: {isolation.level: read_uncommitted}\n";
  EXPECT_TRUE(check(with_isolation).ok());
  auto tx = check(with_isolation, {"delivery=transactional"});
  EXPECT_TRUE(has_error_at(tx, "consumer.isolation.level", "read_committed")) << errors_of(tx);

  // --set cannot sneak them in either.
  auto set = check(kMinimal, {"kafka.enable.auto.commit=true"});
  EXPECT_TRUE(has_error_at(set, "kafka.enable.auto.commit", "cannot be set")) << errors_of(set);
}

TEST(ConfigLoad, LibrdkafkaChecksEveryPropertyAtItsKeyPath) {
  auto r = check(std::string(kMinimal) + R"(
  no.such.property: 1
  socket.timeout.ms: 30000
consumer: {socket.timeout.ms: soon, fetch.wait.max.ms: 10}
producer: {acks: sometimes, linger.ms: 5, compression.type: zstd}
)");
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(has_error_at(r, "kafka.no.such.property", "No such configuration property"))
      << errors_of(r);
  EXPECT_TRUE(has_error_at(r, "consumer.socket.timeout.ms", "Invalid value")) << errors_of(r);
  EXPECT_TRUE(has_error_at(r, "producer.acks", "librdkafka refuses it")) << errors_of(r);
  EXPECT_EQ(r.errors.size(), 3u) << errors_of(r);
  EXPECT_TRUE(check_kafka_property("linger.ms", "5"));
  EXPECT_FALSE(check_kafka_property("linger.ms", "-5"));
}

TEST(ConfigSecrets, WhichLibrdkafkaPropertiesAreSecret) {
  for (const char* name :
       {"sasl.password", "ssl.key.password", "ssl.key.pem", "ssl_key", "ssl.keystore.password",
        "sasl.oauthbearer.client.secret", "sasl.oauthbearer.config", "SSL.KEY.PASSWORD"}) {
    EXPECT_TRUE(is_secret_property(name)) << name;
  }
  for (const char* name : {"bootstrap.servers", "sasl.username", "linger.ms", "client.id"}) {
    EXPECT_FALSE(is_secret_property(name)) << name;
  }
  // librdkafka's message may quote the value: a secret's never comes out.
  const std::string error = kafka_property_error(
      "ssl.key.password", "hunter2", "Invalid value \"hunter2\" for configuration property");
  EXPECT_EQ(error.find("hunter2"), std::string::npos) << error;
  EXPECT_THAT(error, HasSubstr("(value hidden)"));
  EXPECT_THAT(kafka_property_error("acks", "sometimes", "Invalid value \"sometimes\""),
              HasSubstr("sometimes"));
}

TEST(ConfigSecrets, WrongTypesNameTheKeyButNeverTheValue) {
  auto r = check(R"(
group_id: g
input: {topics: [in]}
output: {topic: out}
window: 10m
dlq_topic: dlq
identity: {salt: [the-salt]}
kafka: {bootstrap.servers: "k:1", sasl.password: [the-password], ssl.key.pem: {a: the-pem}}
producer: {sasl.oauthbearer.client.secret: [the-client-secret]}
)",
                 {"consumer.ssl.key.password=[the-flag-password]", "kafka=[the-whole-map]"});
  EXPECT_FALSE(r.ok());
  const std::string all = errors_of(r);
  for (const char* key : {"identity.salt", "producer.sasl.oauthbearer.client.secret",
                          "consumer.ssl.key.password", "kafka"}) {
    EXPECT_TRUE(has_error_at(r, key)) << key << "\n" << all;
  }
  for (const char* secret : {"the-salt", "the-password", "the-pem", "the-client-secret",
                             "the-flag-password", "the-whole-map"}) {
    EXPECT_EQ(all.find(secret), std::string::npos) << secret << " printed:\n" << all;
  }
  EXPECT_THAT(all, HasSubstr("--set consumer.ssl.key.password=(value hidden)"));
  // Other values are still quoted: they help and are not secret.
  auto other = check(kMinimal, {"group_id=[a-group]"});
  EXPECT_THAT(errors_of(other), HasSubstr("a-group"));
}

TEST(ConfigLoad, TransactionalDeliveryNeedsAStableInstanceId) {
  auto none = check(kMinimal, {"delivery=transactional"});
  EXPECT_TRUE(has_error_at(none, "delivery", "consumer.group.instance.id")) << errors_of(none);
  EXPECT_TRUE(check(kMinimal, {"delivery=transactional", "consumer.group.instance.id=pod-0"}).ok());
  EXPECT_TRUE(check(kMinimal, {"delivery=transactional", "kafka.group.instance.id=pod-0"}).ok());
  auto empty = check(kMinimal, {"delivery=transactional", "consumer.group.instance.id="});
  EXPECT_TRUE(has_error_at(empty, "delivery", "stable instance id")) << errors_of(empty);
  EXPECT_TRUE(check(kMinimal).ok()) << "idempotent delivery needs none";
}

TEST(ConfigLoad, EffectiveLibrdkafkaProperties) {
  auto r = check(R"(
group_id: g
input: {topics: [in]}
output: {topic: out}
window: 10m
dlq_topic: dlq
kafka: {bootstrap.servers: "k:1", client.id: base}
consumer: {client.id: cons, partition.assignment.strategy: range, group.instance.id: m}
producer: {client.id: prod}
)",
                 {"delivery=transactional"});
  ASSERT_TRUE(r.ok()) << errors_of(r);
  auto consumer = consumer_properties(*r.config);
  EXPECT_EQ(consumer.at("client.id"), "cons");
  EXPECT_EQ(consumer.at("bootstrap.servers"), "k:1");
  EXPECT_EQ(consumer.at("partition.assignment.strategy"), "range");
  EXPECT_EQ(consumer.at("group.id"), "g");
  EXPECT_EQ(consumer.at("enable.auto.commit"), "false");
  EXPECT_EQ(consumer.at("isolation.level"), "read_committed");
  auto producer = producer_properties(*r.config);
  EXPECT_EQ(producer.at("client.id"), "prod");
  EXPECT_EQ(producer.at("enable.idempotence"), "true");

  auto plain = check(kMinimal);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(consumer_properties(*plain.config).at("partition.assignment.strategy"),
            "cooperative-sticky");
  // The prefetch: kdedup's default, unless kafka or consumer names it.
  EXPECT_EQ(consumer_properties(*plain.config).at("queued.min.messages"), "500000");
  EXPECT_EQ(consumer.at("queued.min.messages"), "500000");
  auto own = check(kMinimal, {"kafka.queued.min.messages=2000"});
  ASSERT_TRUE(own.ok()) << errors_of(own);
  EXPECT_EQ(consumer_properties(*own.config).at("queued.min.messages"), "2000");
  own = check(kMinimal, {"kafka.queued.min.messages=2000", "consumer.queued.min.messages=1"});
  ASSERT_TRUE(own.ok()) << errors_of(own);
  EXPECT_EQ(consumer_properties(*own.config).at("queued.min.messages"), "1");
  // The byte bound: 64 MiB an instance, shared out among the workers'
  // queues (idempotent delivery); transactional reads one queue, librdkafka's.
  EXPECT_EQ(consumer_properties(*plain.config).at("queued.max.messages.kbytes"),
            std::to_string(65536 / plain.config->threads));
  auto four = check(kMinimal, {"threads=4"});
  ASSERT_TRUE(four.ok()) << errors_of(four);
  EXPECT_EQ(consumer_properties(*four.config).at("queued.max.messages.kbytes"), "16384");
  EXPECT_EQ(consumer.count("queued.max.messages.kbytes"), 0u);
  own = check(kMinimal, {"threads=4", "consumer.queued.max.messages.kbytes=1000"});
  ASSERT_TRUE(own.ok()) << errors_of(own);
  EXPECT_EQ(consumer_properties(*own.config).at("queued.max.messages.kbytes"), "1000");
}

TEST(ConfigInterpolation, VariablesAndDefaults) {
  auto r = check(R"(
group_id: ${GROUP}
input: {topics: ["${TOPIC:-events}"]}
output: {topic: "${PREFIX}-out"}
window: ${WINDOW:-5m}
dlq_topic: dlq
identity: {salt: "${SALT:-}"}
filter:
  fpp: ${FPP:-0.02}
kafka: {bootstrap.servers: "${BOOT}", sasl.password: "p$${literal}"}
)",
                 {}, {{"GROUP", "grp"}, {"PREFIX", "pre"}, {"BOOT", "b:9092"}, {"FPP", "0.005"}});
  ASSERT_TRUE(r.ok()) << errors_of(r);
  EXPECT_EQ(r.config->group_id, "grp");
  EXPECT_EQ(r.config->input.topics[0], "events");
  EXPECT_EQ(r.config->output.topic, "pre-out");
  EXPECT_EQ(r.config->window_ms(), 300'000);
  EXPECT_DOUBLE_EQ(r.config->filter.fpp, 0.005);  // a plain ${VAR} can still be a number
  EXPECT_EQ(r.config->kafka.at("bootstrap.servers"), "b:9092");
  EXPECT_EQ(r.config->kafka.at("sasl.password"), "p${literal}");
  // An empty salt is allowed, with a warning.
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_EQ(r.warnings[0].path, "identity.salt");
}

TEST(ConfigLoad, ASaltShorterThan16BytesIsWarnedAboutWithoutPrintingIt) {
  auto shorter = check(kMinimal, {"identity.salt=fifteen-bytes!!"});
  ASSERT_TRUE(shorter.ok()) << errors_of(shorter);
  ASSERT_EQ(shorter.warnings.size(), 1u);
  EXPECT_EQ(shorter.warnings[0].path, "identity.salt");
  EXPECT_THAT(shorter.warnings[0].message, HasSubstr("15 bytes, shorter than 16"));
  EXPECT_EQ(to_string(shorter.warnings[0]).find("fifteen"), std::string::npos);
  EXPECT_TRUE(check(kMinimal, {"identity.salt=sixteen-bytes!!!"}).warnings.empty());
}

TEST(ConfigLoad, AParkAfterThatCannotTakeEffectIsWarnedAbout) {
  // The default (5m) says nothing without a state dir; one the user set does.
  EXPECT_TRUE(check(std::string(kMinimal) + "state: {dir: \"\"}\n").warnings.empty());
  auto no_dir = check(std::string(kMinimal) + "state: {dir: \"\", park_after: 1m}\n");
  ASSERT_TRUE(no_dir.ok()) << errors_of(no_dir);
  ASSERT_EQ(no_dir.warnings.size(), 1u);
  EXPECT_EQ(no_dir.warnings[0].path, "state.park_after");
  EXPECT_THAT(no_dir.warnings[0].message,
              HasSubstr("parks only partitions that have had no record since they were assigned"));
  EXPECT_THAT(no_dir.warnings[0].message, HasSubstr("state.dir is empty"));
  EXPECT_THAT(to_string(no_dir.warnings[0]), HasSubstr(":"));  // where it was set
  auto passthrough =
      check(std::string(kMinimal) + "state: {park_after: 1m}\n", {"filter.enabled=false"});
  ASSERT_TRUE(passthrough.ok()) << errors_of(passthrough);
  ASSERT_EQ(passthrough.warnings.size(), 1u);
  EXPECT_THAT(passthrough.warnings[0].message, HasSubstr("has no effect: the filter is disabled"));
  auto confirmed = check(std::string(kMinimal) + "state: {park_after: 1m}\n",
                         {"filter.type=timer", "filter.confirm_store=true"});
  ASSERT_TRUE(confirmed.ok()) << errors_of(confirmed);
  EXPECT_TRUE(confirmed.warnings.empty()) << "confirmed mode parks too";
  EXPECT_TRUE(check(std::string(kMinimal) + "state: {dir: \"\", park_after: 0}\n").warnings.empty())
      << "0 turns parking off: nothing to warn about";
  EXPECT_TRUE(check(std::string(kMinimal) + "state: {park_after: 1m}\n").warnings.empty());
}

TEST(ConfigInterpolation, UnsetVariableNamesVariableAndKey) {
  auto r = check(std::string(kMinimal) + "state: {dir: \"${STATE_DIR}/x\"}\n");
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(has_error_at(r, "state.dir", "STATE_DIR is not set")) << errors_of(r);

  auto bad = check(std::string(kMinimal) + "state: {dir: \"${1BAD}\"}\n");
  EXPECT_TRUE(has_error_at(bad, "state.dir", "not a variable reference")) << errors_of(bad);
  auto open = check(std::string(kMinimal) + "state: {dir: \"${OPEN\"}\n");
  EXPECT_TRUE(has_error_at(open, "state.dir", "unterminated")) << errors_of(open);
}

TEST(ConfigOverrides, SetScalarsListsAndLibrdkafkaKeys) {
  auto r =
      check(kMinimal,
            {"filter.fpp=0.001", "input.topics=[x, y]", "kafka.bootstrap.servers=127.0.0.1:1234",
             "consumer.fetch.wait.max.ms=10", "identity.salt=", "threads=4", "metrics.address="});
  ASSERT_TRUE(r.ok()) << errors_of(r);
  EXPECT_DOUBLE_EQ(r.config->filter.fpp, 0.001);
  EXPECT_EQ(r.config->input.topics, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(r.config->kafka.at("bootstrap.servers"), "127.0.0.1:1234");
  EXPECT_EQ(r.config->consumer.at("fetch.wait.max.ms"), "10");
  EXPECT_EQ(r.config->identity.salt, "");
  EXPECT_EQ(r.config->threads, 4u);
  EXPECT_EQ(r.config->metrics.address, "");
}

TEST(ConfigOverrides, BadOverridesAreErrors) {
  auto r = check(kMinimal,
                 {"nonsense", "filter.fpp=abc", "window.x=1", "=3", "filter..fpp=1", "a.b=[1,"});
  EXPECT_FALSE(r.ok());
  const std::string all = errors_of(r);
  EXPECT_THAT(all, HasSubstr("--set nonsense")) << all;
  EXPECT_TRUE(has_error_at(r, "filter.fpp")) << all;
  EXPECT_TRUE(has_error_at(r, "window", "not a map")) << all;
  EXPECT_TRUE(has_error_at(r, "filter..fpp", "empty component")) << all;
  EXPECT_TRUE(has_error_at(r, "a.b", "not valid YAML")) << all;
}

TEST(ConfigSyntax, YamlSyntaxErrorGivesFileLineAndColumn) {
  auto r = check("group_id: g\ninput:\n  topics: [a, b\noutput: x\n");
  ASSERT_EQ(r.errors.size(), 1u) << errors_of(r);
  EXPECT_THAT(r.errors[0].message, HasSubstr("YAML syntax error"));
  EXPECT_THAT(r.errors[0].where, ::testing::StartsWith("test.yaml:"));
  EXPECT_THAT(r.errors[0].where, ::testing::MatchesRegex("test.yaml:[0-9]+:[0-9]+"));
}

TEST(ConfigSyntax, EmptyAndNonMapDocuments) {
  EXPECT_THAT(errors_of(check("")), HasSubstr("empty"));
  EXPECT_THAT(errors_of(check("# only a comment\n")), HasSubstr("empty"));
  EXPECT_THAT(errors_of(check("- a\n- b\n")), HasSubstr("top level must be a map"));
  EXPECT_THAT(errors_of(check("just text")), HasSubstr("top level must be a map"));
}

TEST(ConfigSyntax, AliasBombIsBounded) {
  std::string yaml = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  char prev = 'a';
  for (char name = 'b'; name <= 'k'; ++name) {
    yaml += std::string(1, name) + ": &" + name + " [";
    for (int i = 0; i < 10; ++i) yaml += std::string(i ? ", *" : "*") + prev;
    yaml += "]\n";
    prev = name;
  }
  auto r = check(yaml);
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(errors_of(r), HasSubstr("more than"));
}

TEST(ConfigFile, MissingFileIsAnError) {
  auto r = check_config_file("/nonexistent/kdedup.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(errors_of(r), HasSubstr("cannot open config file"));
  auto loaded = load_config("/nonexistent/kdedup.yaml");
  ASSERT_FALSE(loaded);
  EXPECT_THAT(loaded.error().message, HasSubstr("/nonexistent/kdedup.yaml"));
}

TEST(ConfigFile, ShippedExamplesAreValid) {
  auto env = env_of({{"KDEDUP_BOOTSTRAP", "127.0.0.1:9092"}, {"KDEDUP_SALT", "salt"}});
  for (const char* name : {"config/kdedup.yaml", "config/local.yaml"}) {
    auto r = check_config_file(std::string(KDEDUP_SOURCE_DIR) + "/" + name, {}, env);
    EXPECT_TRUE(r.ok()) << name << "\n" << errors_of(r);
  }
}

TEST(ByteSize, ParsesUnits) {
  EXPECT_EQ(parse_byte_size("65536").value(), 65536u);
  EXPECT_EQ(parse_byte_size("64KiB").value(), 65536u);
  EXPECT_EQ(parse_byte_size("1GiB").value(), 1ULL << 30);
  EXPECT_EQ(parse_byte_size("10MB").value(), 10'000'000u);
  EXPECT_EQ(parse_byte_size("3 B").value(), 3u);
  EXPECT_FALSE(parse_byte_size(""));
  EXPECT_FALSE(parse_byte_size("0"));
  EXPECT_FALSE(parse_byte_size("1XB"));
  EXPECT_FALSE(parse_byte_size("KiB"));
  EXPECT_FALSE(parse_byte_size("99999999999999999999"));
  EXPECT_FALSE(parse_byte_size("17000000TiB"));
}

TEST(Schema, EmbeddedSchemaIsTheSourceFile) {
  EXPECT_EQ(std::string(schema_json()), kdedup::testing::read_file(std::string(KDEDUP_SOURCE_DIR) +
                                                                   "/schemas/config.schema.json"));
}

}  // namespace
}  // namespace kdedup::config

namespace kdedup::config {
namespace {

TEST(ConfigRepartition, OffByDefaultAndTheDedupStageReadsTheInput) {
  auto r = check(kMinimal);
  ASSERT_TRUE(r.ok()) << errors_of(r);
  EXPECT_FALSE(r.config->repartition.enabled());
  EXPECT_EQ(r.config->on_duplicate, OnDuplicate::kKeepFirst);
  EXPECT_EQ(dedup_stage(*r.config).input.topics, (std::vector<std::string>{"in"}));
}

TEST(ConfigRepartition, TheDedupStageReadsTheInternalTopicInItsOwnGroup) {
  auto r = check(std::string(kMinimal) +
                 "repartition:\n  topic: in-by-id\n  partitions: 8\non_duplicate: refresh\n");
  ASSERT_TRUE(r.ok()) << errors_of(r);
  const Config& c = *r.config;
  EXPECT_TRUE(c.repartition.enabled());
  EXPECT_EQ(c.repartition.partitions, 8);
  EXPECT_TRUE(c.repartition.create_topic);
  EXPECT_EQ(c.repartition.replication_factor, -1);
  EXPECT_EQ(repartition_group(c), "g-repartition");
  EXPECT_EQ(dedup_stage(c).input.topics, (std::vector<std::string>{"in-by-id"}));
  EXPECT_EQ(c.input.topics, (std::vector<std::string>{"in"}));
  EXPECT_EQ(c.on_duplicate, OnDuplicate::kRefresh);
  EXPECT_THAT(summary(c), HasSubstr("repartition -> 'in-by-id' (8 partitions)"));
}

TEST(ConfigRepartition, ErrorsNameTheKey) {
  auto missing = check(std::string(kMinimal) + "repartition:\n  topic: x\n");
  EXPECT_TRUE(has_error_at(missing, "repartition.partitions")) << errors_of(missing);
  auto zero = check(std::string(kMinimal) + "repartition:\n  topic: x\n  partitions: 0\n");
  EXPECT_TRUE(has_error_at(zero, "repartition.partitions")) << errors_of(zero);
  auto output = check(std::string(kMinimal) + "repartition:\n  topic: out\n  partitions: 4\n");
  EXPECT_TRUE(has_error_at(output, "repartition.topic", "output.topic")) << errors_of(output);
  auto input = check(std::string(kMinimal) + "repartition:\n  topic: in\n  partitions: 4\n");
  EXPECT_TRUE(has_error_at(input, "repartition.topic", "input topic")) << errors_of(input);
  auto group =
      check(std::string(kMinimal) + "repartition:\n  topic: x\n  partitions: 4\n  group_id: g\n");
  EXPECT_TRUE(has_error_at(group, "repartition.group_id")) << errors_of(group);
  auto rf = check(std::string(kMinimal) +
                  "repartition:\n  topic: x\n  partitions: 4\n  replication_factor: 0\n");
  EXPECT_TRUE(has_error_at(rf, "repartition.replication_factor")) << errors_of(rf);
  auto dup = check(std::string(kMinimal) + "on_duplicate: renew\n");
  EXPECT_FALSE(dup.ok());
  EXPECT_THAT(errors_of(dup), HasSubstr("on_duplicate"));
}

// 4-bit timers saturate under a memory budget (docs/performance.md): the
// combination is refused naming the key, each alone is fine.
TEST(ConfigLoad, FourBitTimersUnderAMemoryBudgetAreRefused) {
  auto both =
      check(std::string(kMinimal) + "filter: {timer_bits: 4}\nmemory: {max_bytes: 256MiB}\n");
  EXPECT_FALSE(both.ok());
  EXPECT_TRUE(has_error_at(both, "filter.timer_bits", "memory budget")) << errors_of(both);
  EXPECT_TRUE(check(std::string(kMinimal) + "filter: {timer_bits: 4}\n").ok());
  EXPECT_TRUE(
      check(std::string(kMinimal) + "filter: {timer_bits: 8}\nmemory: {max_bytes: 256MiB}\n").ok());
  EXPECT_TRUE(check(std::string(kMinimal) +
                    "filter: {type: aging, timer_bits: 4}\nmemory: {max_bytes: 256MiB}\n")
                  .ok());
}

// Confirmed mode confirms a probabilistic filter's duplicates in a store
// that lives in state.dir: refused naming the key for the exact filter, in
// passthrough and without state.dir.
TEST(ConfigLoad, ConfirmStoreNeedsAProbabilisticFilterAndAStateDir) {
  auto on = check(std::string(kMinimal) + "filter: {type: compact, confirm_store: true}\n");
  ASSERT_TRUE(on.ok()) << errors_of(on);
  EXPECT_TRUE(on.config->confirm_store);
  EXPECT_NE(summary(*on.config).find("confirmed"), std::string::npos) << summary(*on.config);
  EXPECT_FALSE(check(kMinimal).config->confirm_store);

  auto exact = check(std::string(kMinimal) + "filter: {type: exact, confirm_store: true}\n");
  EXPECT_TRUE(has_error_at(exact, "filter.confirm_store", "exact filter has no false positives"))
      << errors_of(exact);
  auto off = check(std::string(kMinimal) + "filter: {enabled: false, confirm_store: true}\n");
  EXPECT_TRUE(has_error_at(off, "filter.confirm_store", "nothing to confirm")) << errors_of(off);
  auto no_dir =
      check(std::string(kMinimal) + "filter: {confirm_store: true}\nstate: {dir: \"\"}\n");
  EXPECT_TRUE(has_error_at(no_dir, "filter.confirm_store", "needs state.dir")) << errors_of(no_dir);
  auto typo = check(std::string(kMinimal) + "filter: {confirm_store: yes please}\n");
  EXPECT_FALSE(typo.ok());
}

}  // namespace
}  // namespace kdedup::config
