// verify_by_identity (output_oracle.h): the oracle over the whole input, for
// copies of an identity spread over partitions.

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "kdedup/testbroker/output_oracle.h"

namespace kdedup::testbroker {
namespace {

using SourceKey = std::tuple<std::string, std::int32_t, std::int64_t>;

void note(std::vector<std::string>& examples, std::size_t limit, std::string text) {
  if (examples.size() < limit) examples.push_back(std::move(text));
}

std::string where(const SourceKey& k) {
  return std::get<0>(k) + "[" + std::to_string(std::get<1>(k)) + "]@" +
         std::to_string(std::get<2>(k));
}

/// Emitted records of the identities, by timestamp; counts unexpected and
/// repeated source offsets into `report`.
std::map<std::string, std::vector<std::int64_t>> emissions(
    const std::map<SourceKey, const InputRecord*>& by_source,
    const std::vector<OutputRecord>& output, const VerifySpec& spec, VerifyReport& report) {
  std::map<std::string, std::vector<std::int64_t>> emitted;
  std::set<SourceKey> seen;
  for (const auto& o : output) {
    const std::string at =
        "output[" + std::to_string(o.partition) + "]@" + std::to_string(o.offset);
    if (!o.malformed.empty() || !o.source_topic || !o.source_partition || !o.source_offset) {
      ++report.unexpected;
      note(report.unexpected_examples, spec.examples, at + ": no usable provenance " + o.malformed);
      continue;
    }
    const SourceKey key{*o.source_topic, *o.source_partition, *o.source_offset};
    auto it = by_source.find(key);
    if (it == by_source.end()) {
      ++report.unexpected;
      note(report.unexpected_examples, spec.examples, at + ": names no input record " + where(key));
      continue;
    }
    if (spec.check_payload && (o.key != it->second->key || o.value != it->second->value)) {
      ++report.unexpected;
      note(report.unexpected_examples, spec.examples, at + ": payload differs from " + where(key));
      continue;
    }
    if (!seen.insert(key).second) {
      ++report.duplicated;
      note(report.duplicated_examples, spec.examples, at + ": " + where(key) + " emitted again");
      continue;
    }
    emitted[it->second->identity].push_back(it->second->timestamp_ms);
  }
  for (auto& [id, times] : emitted) std::sort(times.begin(), times.end());
  return emitted;
}

}  // namespace

VerifyReport verify_by_identity(const std::vector<InputRecord>& input,
                                const std::vector<OutputRecord>& output, const VerifySpec& spec) {
  VerifyReport report;
  report.input_records = input.size();
  report.output_records = output.size();
  const std::int64_t window = spec.window_ms;
  const std::int64_t tick =
      spec.tick_ms > 0 ? spec.tick_ms : std::max<std::int64_t>(1, window / 64);

  std::map<SourceKey, const InputRecord*> by_source;
  std::map<std::string, std::vector<std::int64_t>> occurrences;
  for (const auto& r : input) {
    by_source[{r.topic, r.partition, r.offset}] = &r;
    occurrences[r.identity].push_back(r.timestamp_ms);
  }
  const auto emitted = emissions(by_source, output, spec, report);

  for (auto& [id, times] : occurrences) {
    std::sort(times.begin(), times.end());
    // The exact filter over the merged input, first-test-then-set.
    std::optional<std::int64_t> delivered;
    for (std::int64_t t : times) {
      if (!delivered || t - *delivered > window) {
        ++report.oracle_distinct;
        delivered = t;
      }
    }
    auto e = emitted.find(id);
    const std::vector<std::int64_t> none;
    const std::vector<std::int64_t>& em = e == emitted.end() ? none : e->second;
    for (std::size_t i = 1; i < em.size(); ++i) {
      const std::int64_t gap = em[i] - em[i - 1];
      if (gap <= window) {
        ++report.duplicated;
        note(report.duplicated_examples, spec.examples,
             "identity '" + id + "' emitted twice " + std::to_string(gap) + " ms apart");
      } else if (gap <= window + tick) {
        ++report.ambiguous;
      }
    }
    for (std::int64_t t : times) {
      auto near = std::lower_bound(em.begin(), em.end(), t - window - tick);
      if (near != em.end() && *near <= t + window + tick) {
        if (std::abs(*near - t) > window) ++report.ambiguous;
        continue;
      }
      ++report.lost;
      note(report.lost_examples, spec.examples,
           "identity '" + id + "' at " + std::to_string(t) + " ms: no emission within the window");
    }
  }
  return report;
}

}  // namespace kdedup::testbroker
