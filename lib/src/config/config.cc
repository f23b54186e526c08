// Config loading: YAML -> interpolate -> --set -> JSON Schema -> typed Config
// with semantic checks (see config.h). Every stage collects all of its errors
// instead of stopping at the first, so a user fixes a file in one pass.

#include "kdedup/config/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include <librdkafka/rdkafka.h>

#include "confirm_check.h"
#include "kdedup/common/byte_size.h"
#include "kdedup/common/duration.h"
#include "kdedup/filter/fingerprint.h"
#include "schema_check.h"
#include "schema_embed.h"
#include "yaml_json.h"

namespace kdedup::config {
namespace {

using detail::Document;
using detail::dotted;
using detail::Json;
using detail::KeyPath;
using detail::pointer;

/// librdkafka keys kdedup sets itself because correctness depends on them.
struct ProtectedKey {
  const char* name;
  const char* reason;
};
constexpr ProtectedKey kProtectedKeys[] = {
    {"enable.auto.commit",
     "kdedup commits offsets itself, only after the output is delivered; auto commit could "
     "commit records that were never written (silent loss)"},
    {"enable.auto.offset.store",
     "kdedup stores offsets itself after delivery reports; automatic storing would commit "
     "undelivered records"},
    {"enable.idempotence",
     "kdedup forces the idempotent producer (true): recovery relies on it to emit no duplicates"},
    {"group.id", "set the consumer group with the top-level key group_id"},
    {"transactional.id",
     "kdedup derives the transactional id from group_id and the member so zombies are fenced"},
};
constexpr const char* kIsolationReason =
    "with delivery: transactional kdedup reads read_committed itself; another isolation level "
    "would deduplicate aborted records";

// ----------------------------------------------------------- typed build ----

/// Reads typed values out of the validated JSON; each failed semantic check
/// becomes an Issue at its key path.
class Builder {
 public:
  Builder(const Document& doc, std::vector<Issue>& errors) : doc_(doc), errors_(errors) {}

  const Json* at(const KeyPath& path) const {
    const Json* node = &doc_.root;
    for (const auto& part : path) {
      if (!node->is_object() || !node->contains(part)) return nullptr;
      node = &(*node)[part];
    }
    return node;
  }

  std::string str(const KeyPath& path, std::string fallback) const {
    const Json* v = at(path);
    return v != nullptr && v->is_string() ? v->get<std::string>() : fallback;
  }
  template <class T>
  T number(const KeyPath& path, T fallback) const {
    const Json* v = at(path);
    return v != nullptr && v->is_number() ? v->get<T>() : fallback;
  }
  bool boolean(const KeyPath& path, bool fallback) const {
    const Json* v = at(path);
    return v != nullptr && v->is_boolean() ? v->get<bool>() : fallback;
  }

  milliseconds duration(const KeyPath& path, milliseconds fallback, bool allow_zero = false) {
    const Json* v = at(path);
    if (v == nullptr || !v->is_string()) return fallback;
    std::string text = v->get<std::string>();
    if (allow_zero && !text.empty() && text.find_first_not_of('0') != 0 &&
        text.find_first_not_of("0msdh") == std::string::npos) {
      return milliseconds{0};
    }
    auto ms = parse_duration_ms(text);
    if (!ms) {
      error(path, ms.error().message);
      return fallback;
    }
    return milliseconds{*ms};
  }

  std::uint64_t bytes(const KeyPath& path, std::uint64_t fallback) {
    const Json* v = at(path);
    if (v == nullptr) return fallback;
    if (v->is_number_unsigned() || v->is_number_integer()) {
      return v->get<std::int64_t>() > 0 ? v->get<std::uint64_t>() : fallback;
    }
    if (!v->is_string()) return fallback;
    auto n = parse_byte_size(v->get<std::string>());
    if (!n) {
      error(path, n.error().message);
      return fallback;
    }
    return *n;
  }

  KafkaProperties properties(const std::string& map) const {
    KafkaProperties out;
    const Json* v = at({map});
    if (v == nullptr || !v->is_object()) return out;
    for (auto& [key, value] : v->items()) {
      if (value.is_string()) {
        out[key] = value.get<std::string>();
      } else {
        auto it = doc_.plain_text.find(pointer({map, key}));
        out[key] = it != doc_.plain_text.end() ? it->second : value.dump();
      }
    }
    return out;
  }

  /// Records a semantic error unless the schema already reported this key
  /// (one message per problem).
  void error(const KeyPath& path, std::string message) {
    const std::string name = dotted(path, &doc_.root);
    for (const auto& e : errors_) {
      if (e.path == name) return;
    }
    auto it = doc_.where.find(pointer(path));
    errors_.push_back(Issue{dotted(path, &doc_.root), std::move(message),
                            it == doc_.where.end() ? "" : it->second});
  }

 private:
  const Document& doc_;
  std::vector<Issue>& errors_;
};

void check_metrics_address(Builder& b, const std::string& address) {
  if (address.empty()) return;
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    b.error({"metrics", "address"},
            "'" + address + "' is not host:port (e.g. 0.0.0.0:9464); empty turns metrics off");
    return;
  }
  std::string port = address.substr(colon + 1);
  char* end = nullptr;
  long value = std::strtol(port.c_str(), &end, 10);
  if (*end != '\0' || value < 0 || value > 65535) {
    b.error({"metrics", "address"}, "port '" + port + "' is not a number in 0..65535");
  }
}

// The internal topic is read by the dedup stage and written by the
// repartition stage: it must be none of the other topics.
void check_repartition(Builder& b, const Config& c, const std::set<std::string>& inputs) {
  const RepartitionConfig& r = c.repartition;
  if (!b.at({"repartition"})) return;
  if (r.topic.empty()) {
    b.error({"repartition", "topic"},
            "required when the repartition block is present (the internal topic records are "
            "re-keyed into); remove the block to deduplicate the input partitions directly");
    return;
  }
  if (r.partitions < 1) {
    b.error({"repartition", "partitions"},
            "required: the internal topic's partition count (1 or more; the dedup stage's "
            "slices, seed 000 §3)");
  }
  for (const auto& [name, topic] :
       {std::pair<const char*, const std::string*>{"output.topic", &c.output.topic},
        {"dlq_topic", &c.dlq_topic},
        {"duplicates_topic", &c.duplicates_topic}}) {
    if (!topic->empty() && *topic == r.topic) {
      b.error({"repartition", "topic"},
              "'" + r.topic + "' is also " + name + ": the internal topic must be its own");
    }
  }
  if (inputs.count(r.topic)) {
    b.error({"repartition", "topic"},
            "'" + r.topic + "' is also an input topic: kdedup would repartition its own output");
  }
  if (r.replication_factor == 0 || r.replication_factor < -1) {
    b.error({"repartition", "replication_factor"},
            "must be -1 (the broker's default) or 1 or more, got " +
                std::to_string(r.replication_factor));
  }
  if (!r.group_id.empty() && r.group_id == c.group_id) {
    b.error({"repartition", "group_id"},
            "must differ from group_id: the two stages are separate consumer groups");
  }
}

/// The filter section, normalized (filter::normalize() fills in what
/// depends on the rest and names the field it refuses).
filter::FilterConfig read_filter(Builder& b) {
  filter::FilterConfig f;
  std::string type = b.str({"filter", "type"}, "timer");
  if (auto parsed = filter::parse_filter_type(type)) f.type = *parsed;
  f.fpp = b.number<double>({"filter", "fpp"}, 0.01);
  f.capacity = b.number<std::uint64_t>({"filter", "capacity"}, 1'000'000);
  f.ticks_per_window = b.number<std::uint32_t>({"filter", "ticks_per_window"}, 0);
  f.timer_bits = static_cast<std::uint8_t>(b.number<unsigned>({"filter", "timer_bits"}, 8));
  f.equal_timers = static_cast<std::uint8_t>(b.number<unsigned>({"filter", "equal_timers"}, 0));
  f.growth = b.str({"filter", "growth"}, "density") == "cardinality" ? filter::Growth::kCardinality
                                                                     : filter::Growth::kDensity;
  f.min_bytes = b.bytes({"filter", "min_bytes"}, f.min_bytes);
  f.max_bytes = b.bytes({"filter", "max_bytes"}, f.max_bytes);
  if (f.min_bytes > f.max_bytes) {
    // Named at the key the file sets (max_bytes when both are), with both
    // values: one of them may be the default.
    const bool max_set = b.at({"filter", "max_bytes"}) != nullptr;
    const bool min_set = b.at({"filter", "min_bytes"}) != nullptr;
    b.error(max_set ? KeyPath{"filter", "max_bytes"} : KeyPath{"filter", "min_bytes"},
            "filter.min_bytes (" + format_bytes(f.min_bytes) + (min_set ? "" : ", the default") +
                ") is more than filter.max_bytes (" + format_bytes(f.max_bytes) +
                (max_set ? "" : ", the default") +
                "): the floor every filter starts at cannot pass the largest part it may add; "
                "lower filter.min_bytes or raise filter.max_bytes");
    return f;
  }
  auto normalized = filter::normalize(f);
  if (normalized) return *normalized;
  // normalize() names the field first ("fpp must be ...").
  const std::string& msg = normalized.error().message;
  std::string field = msg.substr(0, msg.find(' '));
  static const std::set<std::string> kFields = {
      "fpp",          "capacity", "timer_bits", "ticks_per_window", "min_bytes", "max_bytes",
      "equal_timers", "type",     "growth"};
  b.error(kFields.count(field) ? KeyPath{"filter", field} : KeyPath{"filter"}, msg);
  return f;
}

/// What is read and written, and how each record is routed.
void read_streams(Builder& b, Config& c) {
  c.group_id = b.str({"group_id"}, "");
  if (const Json* topics = b.at({"input", "topics"}); topics != nullptr && topics->is_array()) {
    for (const auto& t : *topics) {
      if (t.is_string()) c.input.topics.push_back(t.get<std::string>());
    }
  }
  c.output.topic = b.str({"output", "topic"}, "");
  c.output.partitioning = b.str({"output", "partitioning"}, "input") == "key"
                              ? Partitioning::kKey
                              : Partitioning::kInput;
  c.identity.extractor = b.str({"identity", "extractor"}, c.identity.extractor);
  c.identity.salt = b.str({"identity", "salt"}, "");
  c.window = b.duration({"window"}, c.window);
  c.max_future_skew = b.duration({"max_future_skew"}, c.max_future_skew, true);
  c.filter_enabled = b.boolean({"filter", "enabled"}, true);
  c.filter = read_filter(b);
  c.confirm_store = b.boolean({"filter", "confirm_store"}, false);
  c.threads = b.number<std::uint32_t>({"threads"}, c.threads);
  c.batch_size = b.number<std::uint32_t>({"batch_size"}, c.batch_size);
  std::string on_invalid = b.str({"on_invalid"}, "dlq");
  c.on_invalid = on_invalid == "pass"   ? OnInvalid::kPass
                 : on_invalid == "drop" ? OnInvalid::kDrop
                 : on_invalid == "fail" ? OnInvalid::kFail
                                        : OnInvalid::kDlq;
  c.on_duplicate = b.str({"on_duplicate"}, "keep_first") == "refresh" ? OnDuplicate::kRefresh
                                                                      : OnDuplicate::kKeepFirst;
  c.repartition.topic = b.str({"repartition", "topic"}, "");
  c.repartition.partitions = b.number<std::int32_t>({"repartition", "partitions"}, 0);
  c.repartition.create_topic = b.boolean({"repartition", "create_topic"}, true);
  c.repartition.replication_factor =
      static_cast<std::int16_t>(b.number<int>({"repartition", "replication_factor"}, -1));
  c.repartition.group_id = b.str({"repartition", "group_id"}, "");
  c.dlq_topic = b.str({"dlq_topic"}, "");
  c.duplicates_topic = b.str({"duplicates_topic"}, "");
}

/// Delivery, the Kafka clients, state, memory, metrics and logs.
void read_service(Builder& b, Config& c) {
  c.delivery = b.str({"delivery"}, "idempotent") == "transactional" ? Delivery::kTransactional
                                                                    : Delivery::kIdempotent;
  c.commit_interval = b.duration({"commit_interval"}, c.commit_interval);
  c.shutdown_timeout = b.duration({"shutdown_timeout"}, c.shutdown_timeout);
  c.kafka = b.properties("kafka");
  c.consumer = b.properties("consumer");
  c.producer = b.properties("producer");
  c.state.dir = b.str({"state", "dir"}, c.state.dir);
  c.state.snapshot_interval = b.duration({"state", "snapshot_interval"}, c.state.snapshot_interval);
  c.state.snapshot_records =
      b.number<std::uint64_t>({"state", "snapshot_records"}, c.state.snapshot_records);
  c.state.reconcile_tail_records =
      b.number<std::int64_t>({"state", "reconcile_tail_records"}, c.state.reconcile_tail_records);
  c.state.min_free_bytes = b.bytes({"state", "min_free_bytes"}, c.state.min_free_bytes);
  c.state.rebuild_lateness =
      b.duration({"state", "rebuild_lateness"}, c.state.rebuild_lateness, true);
  c.state.park_after = b.duration({"state", "park_after"}, c.state.park_after, true);
  c.memory.max_bytes = b.bytes({"memory", "max_bytes"}, c.memory.max_bytes);
  if (c.memory.max_bytes != 0 && c.filter_enabled && c.filter.type == filter::FilterType::kTimer &&
      c.filter.timer_bits == 4) {
    // Measured (docs/performance.md "Memory budget"): 4-bit timers react an
    // eighth of a window at a time, partitions starve one another and the
    // filters saturate, dropping most new identities: refuse, not degrade.
    b.error({"filter", "timer_bits"},
            "4-bit timers cannot share a memory budget (memory.max_bytes is set): under "
            "pressure they saturate and drop most new records; use timer_bits 8 or 16, or no "
            "memory.max_bytes");
  }
  c.metrics.address = b.str({"metrics", "address"}, c.metrics.address);
  c.metrics.per_partition = b.boolean({"metrics", "per_partition"}, true);
  c.metrics.audit_sample =
      b.number<std::uint32_t>({"metrics", "audit_sample"}, c.metrics.audit_sample);
  c.log_level = b.str({"log_level"}, c.log_level);
}

/// Topics must not feed back into the input, and on_invalid: dlq needs one.
void check_topics(Builder& b, const Config& c, const std::set<std::string>& inputs) {
  if (inputs.count(c.output.topic)) {
    b.error({"output", "topic"},
            "'" + c.output.topic + "' is also an input topic: kdedup would read its own output");
  }
  if (c.on_invalid == OnInvalid::kDlq && c.dlq_topic.empty()) {
    b.error({"dlq_topic"},
            "required when on_invalid is dlq (or choose on_invalid: pass, drop or fail)");
  }
  if (!c.dlq_topic.empty() && (inputs.count(c.dlq_topic) || c.dlq_topic == c.output.topic)) {
    b.error({"dlq_topic"}, "'" + c.dlq_topic + "' must differ from the input and output topics");
  }
  if (!c.duplicates_topic.empty() &&
      (inputs.count(c.duplicates_topic) || c.duplicates_topic == c.output.topic)) {
    b.error({"duplicates_topic"},
            "'" + c.duplicates_topic + "' must differ from the input and output topics");
  }
}

/// Confirmed mode needs a probabilistic filter and state.dir
/// (confirm_check.h); every problem at filter.confirm_store.
void check_confirm_store(Builder& b, const Config& c) {
  for (const auto& problem : confirm_store_problems(c)) {
    b.error({"filter", "confirm_store"}, problem);
  }
}

/// The kafka / consumer / producer maps: no protected key, and each
/// property as the clients of `kdedup run` would take it.
void check_kafka_properties(Builder& b, const Config& c) {
  for (const char* map : {"kafka", "consumer", "producer"}) {
    const KafkaProperties& props = std::string_view(map) == "kafka"      ? c.kafka
                                   : std::string_view(map) == "consumer" ? c.consumer
                                                                         : c.producer;
    for (const auto& [key, value] : props) {
      for (const auto& p : kProtectedKeys) {
        if (key == p.name) b.error({map, key}, std::string("cannot be set: ") + p.reason);
      }
      if (key == "isolation.level" && c.delivery == Delivery::kTransactional) {
        b.error({map, key}, std::string("cannot be set: ") + kIsolationReason);
      }
      // Unknown names and invalid values, as the clients of `kdedup run`
      // would refuse them (b.error keeps one message per key).
      if (auto checked = check_kafka_property(key, value); !checked) {
        b.error({map, key}, checked.error().message);
      }
    }
  }
}

/// delivery: transactional derives transactional.id = <group_id>-<instance
/// id> from the consumer's static member id: it must exist and be stable
/// across restarts so a restarted member fences its own predecessor.
void check_transactional(Builder& b, const Config& c) {
  if (c.delivery != Delivery::kTransactional) return;
  // The consumer's own setting wins over the common one, even when empty.
  for (const KafkaProperties* props : {&c.consumer, &c.kafka}) {
    if (auto it = props->find("group.instance.id"); it != props->end()) {
      if (!it->second.empty()) return;
      break;
    }
  }
  b.error({"delivery"},
          "transactional needs a stable instance id per member: set "
          "consumer.group.instance.id (e.g. \"${POD_NAME}\"); kdedup derives "
          "transactional.id = <group_id>-<group.instance.id> from it");
}

void check_bootstrap(Builder& b, const Config& c) {
  auto has_bootstrap = [](const KafkaProperties& p) {
    auto it = p.find("bootstrap.servers");
    auto it2 = p.find("metadata.broker.list");
    return (it != p.end() && !it->second.empty()) || (it2 != p.end() && !it2->second.empty());
  };
  if (!has_bootstrap(c.kafka) && !(has_bootstrap(c.consumer) && has_bootstrap(c.producer))) {
    b.error({"kafka", "bootstrap.servers"},
            "required: the Kafka brokers to connect to (host:port,...)");
  }
}

/// An empty or short salt is allowed, with a warning saying what it risks.
void warn_about_salt(const Document& doc, const Config& c, std::vector<Issue>& warnings) {
  auto it = doc.where.find("/identity/salt");
  const std::string where = it == doc.where.end() ? "" : it->second;
  if (c.identity.salt.empty()) {
    warnings.push_back(Issue{"identity.salt",
                             "empty: anyone who knows the hash can craft identities that collide "
                             "with others' and suppress them; set a secret (e.g. ${KDEDUP_SALT})",
                             where});
  } else if (c.identity.salt.size() < filter::kMinSaltBytes) {
    warnings.push_back(Issue{
        "identity.salt",
        std::to_string(c.identity.salt.size()) + " bytes, shorter than " +
            std::to_string(filter::kMinSaltBytes) +
            ": a short salt can be guessed offline from the check value snapshots store "
            "(kdedup snapshot inspect shows it), and then colliding identities crafted; use " +
            std::to_string(filter::kMinSaltBytes) + " or more random bytes",
        where});
  }
}

/// A park_after the user set that cannot take full effect: parking reads
/// a filter back from its snapshot (only a partition that has had no record
/// needs none).
void warn_about_parking(const Document& doc, const Config& c, std::vector<Issue>& warnings) {
  auto it = doc.where.find("/state/park_after");
  if (it == doc.where.end() || c.state.park_after.count() == 0) return;
  const char* why = !c.filter_enabled ? "has no effect: the filter is disabled"
                    : c.state.dir.empty()
                        ? "parks only partitions that have had no record since they were assigned: "
                          "state.dir is empty (no snapshots to read the others back from)"
                        : nullptr;
  if (why == nullptr) return;
  warnings.push_back(Issue{"state.park_after", why, it->second});
}

/// The typed Config of a schema-valid document, and the semantic checks the
/// schema cannot express (each an Issue at its key, in this order: the
/// first message of a key is the one kept).
Config build(const Document& doc, std::vector<Issue>& errors, std::vector<Issue>& warnings) {
  Builder b(doc, errors);
  Config c;
  read_streams(b, c);
  read_service(b, c);
  const std::set<std::string> inputs(c.input.topics.begin(), c.input.topics.end());
  check_topics(b, c, inputs);
  check_repartition(b, c, inputs);
  check_confirm_store(b, c);
  check_metrics_address(b, c.metrics.address);
  check_kafka_properties(b, c);
  check_transactional(b, c);
  check_bootstrap(b, c);
  warn_about_salt(doc, c, warnings);
  warn_about_parking(doc, c, warnings);
  for (const auto& w : warnings) c.warnings.push_back(to_string(w));
  return c;
}

LoadReport check_document(Document& doc, const std::vector<std::string>& overrides,
                          LoadReport report) {
  for (const auto& o : overrides) detail::apply_override(o, doc, report.errors);
  detail::complete_from_schema(doc, report.errors);
  detail::validate_schema(doc, report.errors);
  Config config = build(doc, report.errors, report.warnings);
  if (report.errors.empty()) report.config = std::move(config);
  return report;
}

}  // namespace

std::string to_string(const Issue& issue) {
  std::string out = issue.path.empty() ? std::string() : issue.path + ": ";
  out += issue.message;
  if (!issue.where.empty()) out += " (" + issue.where + ")";
  return out;
}

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

LoadReport check_config_text(std::string_view yaml, const std::string& source_name,
                             const std::vector<std::string>& overrides, const EnvLookup& env) {
  LoadReport report;
  Document doc;
  if (!detail::parse_yaml_document(yaml, source_name, env, doc, report.errors)) return report;
  try {
    return check_document(doc, overrides, std::move(report));
  } catch (const std::exception& e) {
    // Schema machinery throws only on internal faults (e.g. a regex engine
    // limit); report it rather than crash.
    LoadReport failed;
    failed.errors.push_back(
        Issue{"", std::string("internal error while validating: ") + e.what(), source_name});
    return failed;
  }
}

LoadReport check_config_file(const std::string& path, const std::vector<std::string>& overrides,
                             const EnvLookup& env) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    LoadReport report;
    report.errors.push_back(
        Issue{"", "cannot open config file: " + std::string(std::strerror(errno)), path});
    return report;
  }
  std::ostringstream text;
  text << in.rdbuf();
  return check_config_text(text.str(), path, overrides, env);
}

Result<Config> load_config(const std::string& path, const std::vector<std::string>& overrides) {
  LoadReport report = check_config_file(path, overrides);
  if (report.ok()) return std::move(*report.config);
  std::string message = "invalid configuration " + path + ":";
  for (const auto& e : report.errors) message += "\n  " + to_string(e);
  return fail(message);
}

KafkaProperties consumer_properties(const Config& config) {
  // queued.min.messages: librdkafka (2.0) stops fetching once the consumer
  // queue, shared by every assigned partition, holds this many records, and
  // looks again only at its broker threads' next wake-up, up to a second
  // later. With its default of 100,000 an instance working through a
  // backlog emptied the queue in a fraction of that second and waited out
  // the rest (docs/performance.md, "A backlog and the consumer's
  // prefetch"). The byte bound, queued.max.messages.kbytes, is
  // librdkafka's 64 MiB for the instance: with `delivery: idempotent`
  // each worker reads a queue of its own, bound by itself, so each gets
  // its share.
  KafkaProperties out{{"partition.assignment.strategy", "cooperative-sticky"},
                      {"queued.min.messages", std::to_string(kDefaultPrefetchRecords)}};
  if (config.delivery != Delivery::kTransactional) {
    const auto workers = static_cast<int>(std::max<std::uint32_t>(1, config.threads));
    out["queued.max.messages.kbytes"] =
        std::to_string(std::max(1, kDefaultPrefetchKbytes / workers));
  }
  for (const auto& [k, v] : config.kafka) out[k] = v;
  for (const auto& [k, v] : config.consumer) out[k] = v;
  out["group.id"] = config.group_id;
  out["enable.auto.commit"] = "false";
  out["enable.auto.offset.store"] = "false";
  if (config.delivery == Delivery::kTransactional) out["isolation.level"] = "read_committed";
  return out;
}

KafkaProperties producer_properties(const Config& config) {
  KafkaProperties out;
  for (const auto& [k, v] : config.kafka) out[k] = v;
  for (const auto& [k, v] : config.producer) out[k] = v;
  out["enable.idempotence"] = "true";
  return out;
}

bool is_secret_property(std::string_view name) noexcept {
  auto has = [&](std::string_view word) {
    return std::search(name.begin(), name.end(), word.begin(), word.end(), [](char a, char b) {
             return std::tolower(static_cast<unsigned char>(a)) == b;
           }) != name.end();
  };
  return has("password") || has("secret") || has("key") || has("sasl.oauthbearer.config");
}

std::string kafka_property_error(const std::string& name, const std::string& value,
                                 std::string librdkafka_error) {
  while (!librdkafka_error.empty() && librdkafka_error.back() == '\n') librdkafka_error.pop_back();
  if (is_secret_property(name) && !value.empty()) {
    for (auto pos = librdkafka_error.find(value); pos != std::string::npos;
         pos = librdkafka_error.find(value, pos + std::strlen(detail::kHiddenValue))) {
      librdkafka_error.replace(pos, value.size(), detail::kHiddenValue);
    }
  }
  return "librdkafka refuses it: " + librdkafka_error;
}

Status check_kafka_property(const std::string& name, const std::string& value) {
  // A scratch configuration per call: rd_kafka_conf_set() is librdkafka's
  // own check of names and values, the one the clients' set() runs.
  std::unique_ptr<rd_kafka_conf_t, decltype(&rd_kafka_conf_destroy)> conf(rd_kafka_conf_new(),
                                                                          &rd_kafka_conf_destroy);
  char err[512] = "";
  if (rd_kafka_conf_set(conf.get(), name.c_str(), value.c_str(), err, sizeof err) ==
      RD_KAFKA_CONF_OK) {
    return {};
  }
  return fail(kafka_property_error(name, value, err));
}

std::string summary(const Config& c) {
  std::string topics;
  for (const auto& t : c.input.topics) topics += (topics.empty() ? "" : ",") + t;
  std::string out = "group " + c.group_id + ": " + topics + " -> " + c.output.topic + ", window " +
                    format_duration_ms(c.window.count()) + ", filter ";
  if (c.filter_enabled) {
    std::ostringstream fpp;
    fpp << c.filter.fpp;
    out += std::string(filter::to_string(c.filter.type)) + " fpp=" + fpp.str() +
           " ticks=" + std::to_string(c.filter.ticks_per_window);
  } else {
    out += "off (passthrough)";
  }
  out += ", on_invalid " + std::string(to_string(c.on_invalid)) + ", on_duplicate " +
         to_string(c.on_duplicate) + ", delivery " + to_string(c.delivery) + ", " +
         std::to_string(c.threads) + " threads";
  if (c.filter_enabled && c.confirm_store) out += ", confirmed (exact store in state.dir)";
  if (c.repartition.enabled()) {
    out += ", repartition -> '" + c.repartition.topic + "' (" +
           std::to_string(c.repartition.partitions) + " partitions)";
  }
  if (c.memory.max_bytes != 0) {
    std::ostringstream mib;
    mib.precision(1);
    mib << std::fixed << static_cast<double>(c.memory.max_bytes) / (1024.0 * 1024.0);
    out += ", memory budget " + mib.str() + " MiB";
  }
  return out;
}

std::string_view schema_json() noexcept { return detail::kConfigSchema; }

Result<std::uint64_t> parse_byte_size(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
  if (i == 0)
    return fail("'" + std::string(text) + "' is not a byte size (e.g. 65536, 64KiB, 1GiB)");
  std::uint64_t value = 0;
  for (std::size_t j = 0; j < i; ++j) {
    std::uint64_t digit = static_cast<std::uint64_t>(text[j] - '0');
    if (value > (UINT64_MAX - digit) / 10) return fail("'" + std::string(text) + "' is too large");
    value = value * 10 + digit;
  }
  std::string_view unit = text.substr(i);
  if (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  struct Unit {
    const char* name;
    std::uint64_t factor;
  };
  static constexpr Unit kUnits[] = {{"", 1},
                                    {"B", 1},
                                    {"KB", 1000},
                                    {"MB", 1000'000},
                                    {"GB", 1000'000'000},
                                    {"TB", 1000'000'000'000},
                                    {"KiB", 1ULL << 10},
                                    {"MiB", 1ULL << 20},
                                    {"GiB", 1ULL << 30},
                                    {"TiB", 1ULL << 40}};
  for (const auto& u : kUnits) {
    if (unit == u.name) {
      if (value > UINT64_MAX / u.factor) return fail("'" + std::string(text) + "' is too large");
      if (value == 0) return fail("'" + std::string(text) + "' must be more than zero bytes");
      return value * u.factor;
    }
  }
  return fail("'" + std::string(text) + "': unknown unit '" + std::string(unit) +
              "' (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
}

const char* to_string(Partitioning value) noexcept {
  return value == Partitioning::kKey ? "key" : "input";
}
const char* to_string(OnDuplicate value) noexcept {
  return value == OnDuplicate::kRefresh ? "refresh" : "keep_first";
}

std::string repartition_group(const Config& config) {
  return config.repartition.group_id.empty() ? config.group_id + "-repartition"
                                             : config.repartition.group_id;
}

Config dedup_stage(const Config& config) {
  if (!config.repartition.enabled()) return config;
  Config c = config;
  c.input.topics = {config.repartition.topic};
  return c;
}

const char* to_string(OnInvalid value) noexcept {
  switch (value) {
    case OnInvalid::kDlq:
      return "dlq";
    case OnInvalid::kPass:
      return "pass";
    case OnInvalid::kDrop:
      return "drop";
    case OnInvalid::kFail:
      return "fail";
  }
  return "dlq";
}
const char* to_string(Delivery value) noexcept {
  return value == Delivery::kTransactional ? "transactional" : "idempotent";
}

}  // namespace kdedup::config
