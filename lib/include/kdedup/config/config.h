#pragma once
// The kdedup configuration: one YAML file, `${VAR}` / `${VAR:-default}`
// interpolation in every string, `--set key.path=value` overrides, validated
// against schemas/config.schema.json (compiled into the binary) and then by
// semantic checks the schema cannot express. Every problem is reported with
// the key path it concerns ("filter.fpp", "kafka.enable.auto.commit"), all of
// them at once, so one run of `kdedup validate` shows everything to fix.
//
// Loading happens once at startup on the main thread; the resulting Config is
// an immutable value that any thread may read.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kdedup/common/result.h"
#include "kdedup/filter/sliding_filter.h"
#include "kdedup/filter/tick_scale.h"

namespace kdedup::config {

using std::chrono::milliseconds;

/// Where each output record goes.
enum class Partitioning : std::uint8_t {
  kInput,  ///< output partition = input partition (checked at startup)
  kKey,    ///< the producer's partitioner on the record key
};

/// What happens to a record whose identity cannot be extracted.
enum class OnInvalid : std::uint8_t {
  kDlq,   ///< produce it to dlq_topic with an error header
  kPass,  ///< emit it to the output topic as if distinct
  kDrop,  ///< drop it (counted)
  kFail,  ///< stop the service with an error
};

/// What a duplicate does to its identity's time in the filter.
enum class OnDuplicate : std::uint8_t {
  /// First-test-then-set (seed 000 §4): only distinct records are inserted;
  /// an identity is remembered for one window from its last delivery.
  kKeepFirst,
  /// A duplicate renews its identity (SlidingFilter::insert at its tick): a
  /// stream of repeats stays suppressed while it continues. An identity that
  /// repeats more often than once a window is never emitted again.
  kRefresh,
};

/// How output is made durable relative to input offsets.
enum class Delivery : std::uint8_t {
  kIdempotent,     ///< idempotent producer + output reconciliation on recovery
  kTransactional,  ///< Kafka transactions, offsets sent in the transaction
};

struct InputConfig {
  std::vector<std::string> topics;  ///< one or more, required
};

struct OutputConfig {
  std::string topic;  ///< required
  Partitioning partitioning = Partitioning::kInput;
};

/// The optional repartition stage (pipeline/repartition.h): input records
/// are re-produced to an internal topic, partitioned by identity hash, and
/// the dedup stage consumes that topic instead of the input.
struct RepartitionConfig {
  std::string topic;                     ///< the internal topic; empty = no repartition stage
  std::int32_t partitions = 0;           ///< its partition count (>= 1 when topic is set)
  bool create_topic = true;              ///< create it when missing (else it must exist)
  std::int16_t replication_factor = -1;  ///< for creation; -1 = the broker's default
  /// The repartition stage's consumer group; empty = "<group_id>-repartition".
  std::string group_id;

  [[nodiscard]] bool enabled() const noexcept { return !topic.empty(); }
};

struct IdentityConfig {
  /// `key` | `value` | `header:NAME` | `json:/ptr[,json:/ptr...]`; parsed by
  /// the identity module (the schema checks the shape).
  std::string extractor = "key";
  std::string salt;  ///< secret; empty is allowed but warned about
};

struct StateConfig {
  /// RocksDB snapshot directory; empty = no snapshots (every assignment
  /// rebuilds from Kafka).
  std::string dir = "/var/lib/kdedup";
  milliseconds snapshot_interval{30'000};
  std::uint64_t snapshot_records = 1'000'000;
  /// Records read from the end of each output partition on assignment
  /// (output reconciliation, pipeline/reconcile.h): at least
  /// commit_interval x the output rate of one partition, with margin.
  std::int64_t reconcile_tail_records = 10'000;
  /// Free space kept on the state volume: a snapshot that would leave less
  /// is refused as "disk full" (state::StoreOptions::min_free_bytes).
  std::uint64_t min_free_bytes = 64ULL << 20;
  /// A partition rebuilt from the output (no usable snapshot) reads the
  /// output back to this much before the window: a delivered record whose
  /// timestamp is older than the record before it by more than this (a late
  /// record) may be missed by the rebuild.
  milliseconds rebuild_lateness{60'000};
  /// A partition without records for this long (wall clock) whose snapshot
  /// holds its filter as it stands frees the filter's memory and reads it
  /// back before its next record (pipeline/slice.h, Slice::park()); 0 =
  /// never. Needs `dir`.
  milliseconds park_after{300'000};
};

/// The instance-wide memory budget of the partitions' filters
/// (filter/memory_budget.h, DESIGN.md "Memory follows load").
struct MemoryConfig {
  /// Bytes of filter state all partitions of this process may hold together
  /// (one floor per partition is admitted past it); 0 = no budget. Past it
  /// kdedup raises the effective fpp evenly instead of growing.
  std::uint64_t max_bytes = 0;
};

struct MetricsConfig {
  std::string address = "0.0.0.0:9464";  ///< host:port of /metrics /healthz /readyz; empty = off
  bool per_partition = true;             ///< per-partition gauges (fill, fpp, load)
  std::uint32_t audit_sample = 1024;     ///< audit 1/N of the identity space; 0 = off
};

/// librdkafka properties, passed through as strings.
using KafkaProperties = std::map<std::string, std::string>;

/// The whole configuration, after defaults, interpolation and validation.
struct Config {
  std::string group_id;  ///< consumer group id, required
  InputConfig input;
  OutputConfig output;
  IdentityConfig identity;
  milliseconds window{0};  ///< sliding window, required
  milliseconds max_future_skew{60'000};
  bool filter_enabled = true;   ///< false = passthrough: every identifiable record is distinct
  filter::FilterConfig filter;  ///< normalized (ticks_per_window filled in)
  /// filter.confirm_store: confirmed mode (DESIGN.md "Confirmed mode"):
  /// every duplicate the filter finds is confirmed against an exact store in
  /// state.dir/confirm (timer, aging and compact filters; needs state.dir).
  bool confirm_store = false;
  std::uint32_t threads = 2;
  std::uint32_t batch_size = 512;
  OnInvalid on_invalid = OnInvalid::kDlq;
  OnDuplicate on_duplicate = OnDuplicate::kKeepFirst;
  RepartitionConfig repartition;
  std::string dlq_topic;         ///< non-empty when on_invalid = dlq
  std::string duplicates_topic;  ///< empty = drop duplicates (counted)
  Delivery delivery = Delivery::kIdempotent;
  milliseconds commit_interval{1'000};
  milliseconds shutdown_timeout{30'000};
  KafkaProperties kafka;     ///< common to consumer and producer
  KafkaProperties consumer;  ///< consumer-only, overrides kafka
  KafkaProperties producer;  ///< producer-only, overrides kafka
  StateConfig state;
  MemoryConfig memory;
  MetricsConfig metrics;
  std::string log_level = "info";  ///< trace|debug|info|warn|error|critical|off

  /// Things that are allowed but probably unintended (an empty salt).
  std::vector<std::string> warnings;

  [[nodiscard]] std::int64_t window_ms() const noexcept { return window.count(); }
  /// The time -> tick mapping of every partition (window, ticks_per_window).
  [[nodiscard]] filter::TickScale tick_scale() const noexcept {
    return filter::TickScale(std::max<std::int64_t>(1, window.count()),
                             std::max<std::uint32_t>(1, filter.ticks_per_window));
  }
};

/// One problem, tied to the key it concerns.
struct Issue {
  std::string path;     ///< dotted key path, e.g. "filter.fpp"; empty = the file itself
  std::string message;  ///< what is wrong and what is allowed
  std::string where;    ///< "file:line:column" or "--set"; empty when unknown
};

/// "filter.fpp: must be ... (kdedup.yaml:12:8)".
[[nodiscard]] std::string to_string(const Issue& issue);

/// Reads an environment variable; nullopt when unset. Tests pass their own.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

/// The process environment (getenv).
[[nodiscard]] EnvLookup process_env();

/// Everything a load found: the config when there were no errors, else every
/// error. Warnings are reported either way.
struct LoadReport {
  std::optional<Config> config;
  std::vector<Issue> errors;
  std::vector<Issue> warnings;
  [[nodiscard]] bool ok() const noexcept { return config.has_value() && errors.empty(); }
};

/// Loads and validates a config file. `overrides` are "key.path=value" texts
/// as given to --set; the value is parsed as a YAML scalar or flow collection
/// ("[a,b]"). Never throws; a missing file, a YAML syntax error (with line and
/// column), an unset variable, a schema violation or a failed semantic check
/// each become an Issue.
[[nodiscard]] LoadReport check_config_file(const std::string& path,
                                           const std::vector<std::string>& overrides = {},
                                           const EnvLookup& env = process_env());

/// Same as check_config_file for YAML text; `source_name` labels locations.
[[nodiscard]] LoadReport check_config_text(std::string_view yaml, const std::string& source_name,
                                           const std::vector<std::string>& overrides = {},
                                           const EnvLookup& env = process_env());

/// check_config_file, with every error joined into one message (one per line).
[[nodiscard]] Result<Config> load_config(const std::string& path,
                                         const std::vector<std::string>& overrides = {});

/// Records the consumer prefetches across its partitions before it stops
/// fetching (librdkafka's queued.min.messages; its own default is 100,000).
inline constexpr int kDefaultPrefetchRecords = 500'000;

/// Kilobytes of records the consumer prefetches per instance
/// (librdkafka's queued.max.messages.kbytes default, 64 MiB).
inline constexpr int kDefaultPrefetchKbytes = 65'536;

/// Consumer properties to give librdkafka: kdedup's defaults
/// (partition.assignment.strategy=cooperative-sticky, queued.min.messages=
/// kDefaultPrefetchRecords; with `delivery: idempotent`, where each worker
/// has a queue of its own, queued.max.messages.kbytes=kDefaultPrefetchKbytes
/// shared out among the workers), then `kafka`, then
/// `consumer`, then the keys correctness depends on (group.id, no auto
/// commit / offset store, read_committed when transactional).
[[nodiscard]] KafkaProperties consumer_properties(const Config& config);

/// Producer properties: `kafka`, then `producer`, then enable.idempotence=true.
/// transactional.id is not set here: the pipeline derives it per member.
[[nodiscard]] KafkaProperties producer_properties(const Config& config);

/// True for librdkafka properties whose values are secrets, never printed in
/// an error or log line: names containing "password", "secret" or "key"
/// (ssl.key.password, sasl.oauthbearer.client.secret, ssl.key.pem, ...) and
/// sasl.oauthbearer.config.
[[nodiscard]] bool is_secret_property(std::string_view name) noexcept;

/// Sets one librdkafka property on a scratch configuration, exactly as
/// `kdedup run` sets it on its clients: an error (librdkafka's words, a
/// secret's value hidden) when the name is unknown or the value invalid.
/// Validation calls it for every key of `kafka`, `consumer` and `producer`.
[[nodiscard]] Status check_kafka_property(const std::string& name, const std::string& value);

/// The message for librdkafka's refusal `librdkafka_error` of `name` =
/// `value`, with the value hidden when the property is a secret. Every place
/// that sets librdkafka properties reports through it.
[[nodiscard]] std::string kafka_property_error(const std::string& name, const std::string& value,
                                               std::string librdkafka_error);

/// One-line summary for `kdedup validate`.
[[nodiscard]] std::string summary(const Config& config);

/// The schema the config is validated against (schemas/config.schema.json).
[[nodiscard]] std::string_view schema_json() noexcept;

/// Byte sizes as people write them: 65536, "64KiB", "1GiB", "10MB".
[[nodiscard]] Result<std::uint64_t> parse_byte_size(std::string_view text);

[[nodiscard]] const char* to_string(Partitioning value) noexcept;
[[nodiscard]] const char* to_string(OnInvalid value) noexcept;
[[nodiscard]] const char* to_string(Delivery value) noexcept;
[[nodiscard]] const char* to_string(OnDuplicate value) noexcept;

/// The repartition stage's consumer group: repartition.group_id, or
/// "<group_id>-repartition".
[[nodiscard]] std::string repartition_group(const Config& config);

/// The config of the dedup stage when the repartition stage is on: the same
/// config reading the internal topic (repartition.topic) instead of
/// input.topics. Without repartition: `config` itself.
[[nodiscard]] Config dedup_stage(const Config& config);

}  // namespace kdedup::config
