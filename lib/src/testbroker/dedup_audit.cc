#include "kdedup/testbroker/dedup_audit.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <unordered_map>

#include <fmt/format.h>

#include "kdedup/filter/exact_filter.h"
#include "kdedup/filter/fingerprint.h"

namespace kdedup::testbroker {

namespace {

struct SourceKey {
  std::int32_t partition;
  std::int64_t offset;
  bool operator==(const SourceKey&) const = default;
};
struct SourceKeyHash {
  std::size_t operator()(const SourceKey& k) const noexcept {
    return std::hash<std::int64_t>()(k.offset * 1'000'003 + k.partition);
  }
};

// One partition's replay state: the exact filter judged against what was
// emitted, and a pure replay for the "exact distinct" figure.
struct PartitionReplay {
  std::unique_ptr<filter::ExactFilter> delivered;
  std::unique_ptr<filter::ExactFilter> pure;
  std::int64_t clock_ms = 0;
};

constexpr std::size_t kMaxProblems = 10;

}  // namespace

AuditReport audit_dedup(std::vector<AuditInput> inputs, const std::vector<AuditOutput>& outputs,
                        const AuditRules& rules) {
  AuditReport report;
  report.inputs = inputs.size();
  report.outputs = outputs.size();
  auto problem = [&](std::string text) {
    if (report.problems.size() < kMaxProblems) report.problems.push_back(std::move(text));
  };

  std::unordered_map<SourceKey, std::string, SourceKeyHash> input_identity;
  input_identity.reserve(inputs.size());
  for (const auto& in : inputs)
    input_identity.emplace(SourceKey{in.partition, in.offset}, in.identity);

  std::unordered_map<SourceKey, int, SourceKeyHash> emitted;
  emitted.reserve(outputs.size());
  for (const auto& out : outputs) {
    SourceKey k{out.source_partition, out.source_offset};
    auto it = input_identity.find(k);
    if (out.source_partition < 0 || it == input_identity.end()) {
      ++report.unknown_outputs;
      problem(fmt::format("output with key '{}' has no known source (partition {}, offset {})",
                          out.identity, out.source_partition, out.source_offset));
      continue;
    }
    if (it->second != out.identity) {
      ++report.unknown_outputs;
      problem(fmt::format("output for partition {} offset {} has key '{}', source key is '{}'",
                          k.partition, k.offset, out.identity, it->second));
      continue;
    }
    if (++emitted[k] == 1) ++report.distinct_outputs;
    if (emitted[k] == 2) {
      ++report.emitted_twice;
      problem(fmt::format("partition {} offset {} (key '{}') was emitted more than once",
                          k.partition, k.offset, out.identity));
    }
  }

  std::sort(inputs.begin(), inputs.end(), [](const AuditInput& a, const AuditInput& b) {
    return a.partition != b.partition ? a.partition < b.partition : a.offset < b.offset;
  });
  filter::FilterConfig fc;
  fc.type = filter::FilterType::kExact;
  fc.ticks_per_window = rules.scale.ticks_per_window();
  auto normalized = filter::normalize(fc);
  if (!normalized) {
    report.unknown_outputs = report.outputs;  // cannot judge: fail loudly
    problem("audit rules: " + normalized.error().message);
    return report;
  }
  const filter::Fingerprinter fingerprint("kdedup-audit");
  std::map<std::int32_t, PartitionReplay> partitions;
  for (const auto& in : inputs) {
    auto& p = partitions[in.partition];
    if (!p.delivered) {
      p.delivered = std::make_unique<filter::ExactFilter>(*normalized);
      p.pure = std::make_unique<filter::ExactFilter>(*normalized);
    }
    // Same clock rule as the pipeline's partition clock: max timestamp seen;
    // records without a timestamp are judged at the current clock.
    if (in.timestamp_ms > 0) p.clock_ms = std::max(p.clock_ms, in.timestamp_ms);
    const filter::Tick tick = rules.scale.tick(p.clock_ms);
    const auto fp = fingerprint(in.identity);

    if (p.pure->test_and_insert(fp, tick) == filter::Decision::kDistinct) ++report.exact_distinct;

    const bool duplicate = p.delivered->contains(fp, tick);
    const bool was_emitted = emitted.count(SourceKey{in.partition, in.offset}) > 0;
    if (!duplicate) ++report.new_candidates;
    if (was_emitted && duplicate) {
      ++report.false_negatives;
      problem(
          fmt::format("partition {} offset {} (key '{}') was emitted but duplicates a record "
                      "delivered within the window",
                      in.partition, in.offset, in.identity));
    } else if (was_emitted) {
      p.delivered->test_and_insert(fp, tick);
    } else if (!duplicate) {
      ++report.false_positives;
    } else {
      p.delivered->advance(tick);
    }
  }
  if (report.new_candidates > 0) {
    report.observed_fpp =
        static_cast<double>(report.false_positives) / static_cast<double>(report.new_candidates);
  }
  report.fp_bound = false_positive_bound(rules.fpp, report.new_candidates);
  if (report.false_positives > report.fp_bound) {
    problem(fmt::format("{} false positives exceed the bound {} for fpp {} over {} new records",
                        report.false_positives, report.fp_bound, rules.fpp, report.new_candidates));
  }
  return report;
}

std::uint64_t false_positive_bound(double fpp, std::uint64_t new_records) {
  // Binomial upper bound: mean + 4 standard deviations, plus a little slack
  // for small streams.
  const double mean = fpp * static_cast<double>(new_records);
  return static_cast<std::uint64_t>(std::ceil(mean + 4.0 * std::sqrt(mean) + 5.0));
}

}  // namespace kdedup::testbroker
