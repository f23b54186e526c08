#include "kdedup/testbroker/output_oracle.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "kdedup/pipeline/provenance.h"

#include <simdjson.h>

namespace kdedup::testbroker {
namespace {

using SourceId = std::tuple<std::string, std::int32_t, std::int64_t>;
using TopicPartition = std::pair<std::string, std::int32_t>;

std::string describe(const SourceId& id) {
  return std::get<0>(id) + "[" + std::to_string(std::get<1>(id)) + "]@" +
         std::to_string(std::get<2>(id));
}

std::string describe_output(const OutputRecord& r) {
  return "output[" + std::to_string(r.partition) + "]@" + std::to_string(r.offset);
}

void note(std::size_t& count, std::vector<std::string>& examples, std::size_t keep,
          std::string text) {
  ++count;
  if (examples.size() < keep) examples.push_back(std::move(text));
}

/// How the oracle judged one input record.
enum class Verdict : std::uint8_t { kDistinct, kDuplicate, kAmbiguous };

}  // namespace

std::string VerifyReport::to_string() const {
  std::ostringstream o;
  o << "verifier: input " << input_records << ", oracle-distinct " << oracle_distinct << ", output "
    << output_records << ", ambiguous (window edge) " << ambiguous << " | lost " << lost
    << ", duplicated " << duplicated << ", out of order " << out_of_order << ", unexpected "
    << unexpected;
  if (fp_bound > 0) o << ", false positives " << false_positives << " (at most " << fp_bound << ")";
  o << (ok() ? " -> OK" : " -> FAILED") << "\n";
  auto list = [&o](const char* kind, std::size_t n, const std::vector<std::string>& ex) {
    if (n == 0) return;
    o << "  " << kind << " (" << n << ", first " << ex.size() << "):\n";
    for (const auto& e : ex) o << "    " << e << "\n";
  };
  list("lost", lost, lost_examples);
  list("duplicated", duplicated, duplicated_examples);
  list("out of order", out_of_order, out_of_order_examples);
  list("unexpected", unexpected, unexpected_examples);
  return o.str();
}

namespace {

/// The oracle's view of one verify_output() call: the input by source and
/// by partition, the output in reading order, and the verdicts.
class OutputOracle {
 public:
  OutputOracle(const std::vector<InputRecord>& input, const std::vector<OutputRecord>& output,
               const VerifySpec& spec);

  /// Per input partition in offset order: the oracle's verdicts, lost
  /// records, and emitted records that repeat an identity emitted within
  /// the window before them.
  void judge_input();
  /// Every output record against its source and the verdicts.
  void judge_output();
  VerifyReport finish();

 private:
  /// How a delivery at clock `then` stands at clock `now`.
  [[nodiscard]] Verdict age(std::int64_t then, std::int64_t now) const;
  void judge_partition(std::vector<const InputRecord*>& records);
  /// The payload and the verdict of the first copy of a source offset.
  void judge_copy(const OutputRecord& r, const SourceId& id, const InputRecord& in);

  const VerifySpec& spec_;
  const std::int64_t tick_;
  VerifyReport report_;
  std::vector<const OutputRecord*> out_sorted_;  // (partition, offset): a reader's order
  std::map<SourceId, const InputRecord*> by_source_;
  std::map<TopicPartition, std::vector<const InputRecord*>> by_partition_;
  std::map<SourceId, std::size_t> copies_;  // emissions per source offset
  std::map<SourceId, Verdict> verdicts_;
  std::set<SourceId> reemitted_within_window_;
};

OutputOracle::OutputOracle(const std::vector<InputRecord>& input,
                           const std::vector<OutputRecord>& output, const VerifySpec& spec)
    : spec_(spec),
      tick_(spec.tick_ms > 0 ? spec.tick_ms : std::max<std::int64_t>(1, spec.window_ms / 64)) {
  report_.input_records = input.size();
  report_.output_records = output.size();
  out_sorted_.reserve(output.size());
  for (const auto& r : output) out_sorted_.push_back(&r);
  std::sort(out_sorted_.begin(), out_sorted_.end(), [](const auto* a, const auto* b) {
    return std::tie(a->partition, a->offset) < std::tie(b->partition, b->offset);
  });
  for (const auto& r : input) {
    by_source_[{r.topic, r.partition, r.offset}] = &r;
    by_partition_[{r.topic, r.partition}].push_back(&r);
  }
  for (const auto* r : out_sorted_) {
    if (r->malformed.empty() && r->source_topic && r->source_partition && r->source_offset) {
      ++copies_[{*r->source_topic, *r->source_partition, *r->source_offset}];
    }
  }
}

Verdict OutputOracle::age(std::int64_t then, std::int64_t now) const {
  if (spec_.scale) {
    return spec_.scale->tick(now) - spec_.scale->tick(then) <= spec_.scale->ticks_per_window()
               ? Verdict::kDuplicate
               : Verdict::kDistinct;
  }
  const std::int64_t age = now - then;
  if (age <= spec_.window_ms) return Verdict::kDuplicate;
  if (age <= spec_.window_ms + tick_) return Verdict::kAmbiguous;
  return Verdict::kDistinct;
}

void OutputOracle::judge_input() {
  for (auto& [tp, records] : by_partition_) judge_partition(records);
}

void OutputOracle::judge_partition(std::vector<const InputRecord*>& records) {
  const bool probabilistic = spec_.fpp > 0.0;
  std::sort(records.begin(), records.end(),
            [](const auto* a, const auto* b) { return a->offset < b->offset; });
  std::unordered_map<std::string, std::int64_t> delivered;  // oracle: identity -> clock
  std::unordered_map<std::string, std::int64_t> emitted;    // output: identity -> clock
  std::unordered_map<std::string, std::int64_t> pure;       // exact replay: identity -> clock
  std::int64_t clock = 0;
  for (const auto* r : records) {
    clock = std::max(clock, r->timestamp_ms);
    const SourceId id{r->topic, r->partition, r->offset};
    const bool in_output = copies_.count(id) > 0;
    if (in_output) ++report_.emitted_sources;
    Verdict v = Verdict::kDistinct;
    if (auto it = delivered.find(r->identity); it != delivered.end()) v = age(it->second, clock);
    verdicts_[id] = v;
    if (v == Verdict::kAmbiguous) ++report_.ambiguous;
    const auto p = pure.find(r->identity);
    const bool pure_distinct = p == pure.end() || age(p->second, clock) != Verdict::kDuplicate;
    if (pure_distinct) ++report_.exact_distinct;
    if (pure_distinct || spec_.refresh) pure[r->identity] = clock;
    // At the window edge the oracle follows what the output did.
    // Exact filters: the oracle delivers what it judges distinct. With
    // false positives, what the output holds is what was delivered.
    const bool oracle_delivers =
        probabilistic ? in_output
                      : v == Verdict::kDistinct || (v == Verdict::kAmbiguous && in_output);
    // Under refresh every occurrence renews the identity, whatever was
    // decided about it (a false positive's drop renews it too).
    if (oracle_delivers || spec_.refresh) delivered[r->identity] = clock;
    if (v == Verdict::kDistinct) {
      ++report_.oracle_distinct;
      if (!in_output && probabilistic) {
        ++report_.false_positives;
      } else if (!in_output) {
        note(report_.lost, report_.lost_examples, spec_.examples,
             describe(id) + " identity '" + r->identity + "': oracle-distinct, not in the output");
      }
    }
    if (in_output) {
      if (auto it = emitted.find(r->identity);
          it != emitted.end() && age(it->second, clock) == Verdict::kDuplicate) {
        reemitted_within_window_.insert(id);
      }
      emitted[r->identity] = clock;
    }
  }
}

void OutputOracle::judge_output() {
  std::map<std::pair<std::int32_t, TopicPartition>, std::int64_t> highest;  // per output partition
  std::map<SourceId, std::size_t> seen;
  for (const auto* r : out_sorted_) {
    if (!r->malformed.empty()) {
      note(report_.unexpected, report_.unexpected_examples, spec_.examples,
           describe_output(*r) + ": malformed provenance: " + r->malformed);
      continue;
    }
    if (!r->source_topic || !r->source_partition || !r->source_offset) {
      note(report_.unexpected, report_.unexpected_examples, spec_.examples,
           describe_output(*r) + ": no provenance headers");
      continue;
    }
    const SourceId id{*r->source_topic, *r->source_partition, *r->source_offset};
    const auto src = by_source_.find(id);
    if (src == by_source_.end()) {
      note(report_.unexpected, report_.unexpected_examples, spec_.examples,
           describe_output(*r) + " <- " + describe(id) + ": no such input record");
      continue;
    }
    const std::size_t copy = ++seen[id];
    if (copy > 1) {
      ++report_.copies;
      note(report_.duplicated, report_.duplicated_examples, spec_.examples,
           describe_output(*r) + " <- " + describe(id) + ": copy " + std::to_string(copy) +
               " of the same source offset");
      continue;
    }
    const TopicPartition source_tp{std::get<0>(id), std::get<1>(id)};
    auto& top = highest.try_emplace({r->partition, source_tp}, -1).first->second;
    if (*r->source_offset < top) {
      note(report_.out_of_order, report_.out_of_order_examples, spec_.examples,
           describe_output(*r) + " <- " + describe(id) + ": after source offset " +
               std::to_string(top) + " in the same output partition");
    }
    top = std::max(top, *r->source_offset);
    judge_copy(*r, id, *src->second);
  }
}

void OutputOracle::judge_copy(const OutputRecord& r, const SourceId& id, const InputRecord& in) {
  if (spec_.check_payload && (r.key != in.key || r.value != in.value)) {
    note(report_.unexpected, report_.unexpected_examples, spec_.examples,
         describe_output(r) + " <- " + describe(id) + ": key/value differ from the source");
    return;
  }
  if (verdicts_[id] != Verdict::kDuplicate) return;
  if (reemitted_within_window_.count(id)) {
    note(report_.duplicated, report_.duplicated_examples, spec_.examples,
         describe_output(r) + " <- " + describe(id) + ": identity '" + in.identity +
             "' emitted again within the window");
  } else {
    note(report_.unexpected, report_.unexpected_examples, spec_.examples,
         describe_output(r) + " <- " + describe(id) + ": identity '" + in.identity +
             "' is an oracle duplicate (its first occurrence was not emitted)");
  }
}

VerifyReport OutputOracle::finish() {
  if (spec_.fpp > 0.0) {
    report_.fp_bound = false_positive_bound(spec_.fpp, report_.oracle_distinct);
  }
  return std::move(report_);
}

}  // namespace

VerifyReport verify_output(const std::vector<InputRecord>& input,
                           const std::vector<OutputRecord>& output, const VerifySpec& spec) {
  OutputOracle oracle(input, output, spec);
  oracle.judge_input();
  oracle.judge_output();
  return oracle.finish();
}

std::uint64_t false_positive_bound(double fpp, std::uint64_t new_records) {
  // Binomial upper bound: mean + 4 standard deviations, plus a little slack
  // for small streams.
  const double mean = fpp * static_cast<double>(new_records);
  return static_cast<std::uint64_t>(std::ceil(mean + 4.0 * std::sqrt(mean) + 5.0));
}

Result<std::vector<InputRecord>> to_input_records(const std::vector<KafkaRecord>& records,
                                                  const std::string& extractor) {
  std::vector<InputRecord> out;
  out.reserve(records.size());
  const bool by_key = extractor == "key";
  const std::string pointer =
      extractor.rfind("json:", 0) == 0 ? extractor.substr(5) : std::string();
  if (!by_key && pointer.empty()) {
    return fail("verifier: identity extractor '" + extractor + "' not supported (key, json:/ptr)");
  }
  simdjson::dom::parser parser;
  for (const auto& r : records) {
    InputRecord in{r.topic, r.partition, r.offset, {}, r.timestamp_ms, r.key, r.value};
    const std::string where =
        r.topic + "[" + std::to_string(r.partition) + "]@" + std::to_string(r.offset);
    if (by_key) {
      if (!r.key) return fail("verifier: input " + where + " has no key");
      in.identity = *r.key;
    } else {
      simdjson::dom::element doc;
      if (parser.parse(r.value).get(doc) != simdjson::SUCCESS) {
        return fail("verifier: input " + where + " value is not JSON");
      }
      simdjson::dom::element field;
      if (doc.at_pointer(pointer).get(field) != simdjson::SUCCESS) {
        return fail("verifier: input " + where + " has no field " + pointer);
      }
      in.identity = simdjson::minify(field);
    }
    out.push_back(std::move(in));
  }
  return out;
}

std::vector<OutputRecord> to_output_records(const std::vector<KafkaRecord>& records,
                                            const pipeline::ProvenanceNames& names) {
  std::vector<OutputRecord> out;
  out.reserve(records.size());
  for (const auto& r : records) {
    OutputRecord o;
    o.partition = r.partition;
    o.offset = r.offset;
    o.key = r.key;
    o.value = r.value;
    // The service's own parser (provenance.h): one definition of the
    // headers, judged the same way recovery judges them.
    const auto topic = r.header(names.topic);
    const auto partition = r.header(names.partition);
    const auto offset = r.header(names.offset);
    pipeline::ProvenanceHeaders found;
    if (topic) found.topic = *topic;
    if (partition) found.partition = *partition;
    if (offset) found.offset = *offset;
    const pipeline::ProvenanceParse parsed = pipeline::parse_provenance(found, names);
    if (parsed.provenance) {
      o.source_topic = parsed.provenance->source.topic;
      o.source_partition = parsed.provenance->source.partition;
      o.source_offset = parsed.provenance->offset;
    } else if (parsed.malformed) {
      o.source_topic = topic;
      o.malformed = *parsed.malformed;
    }
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace kdedup::testbroker
