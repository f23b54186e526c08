#pragma once
// DedupAudit: checks a deduplicated output against the exact semantics
// (DESIGN.md "Semantics"), replaying every input partition in offset order
// with the same identity, event-time clock and tick rules as the pipeline:
// clock = max timestamp seen, tick = rules.scale.tick(clock)
// (filter::TickScale), an identity is a duplicate iff it was delivered within
// the last ticks_per_window ticks (kdedup/filter/exact_filter.h).
//
// "Delivered" means what the pipeline actually emitted: after a filter false
// positive drops a new identity, a later copy of it is, by the definition, not
// a duplicate. So the audit walks the input, looks up whether each record was
// emitted (provenance: source partition + offset), and classifies it:
//   emitted,  exactly new   -> correct
//   emitted,  exactly dup   -> false negative (must be 0)
//   dropped,  exactly dup   -> correct
//   dropped,  exactly new   -> false positive (allowed at rate ~fpp)
// plus outputs emitted twice, outputs with unknown provenance, and outputs
// whose key differs from their source record (all must be 0).
//
// Single-threaded; holds every input identity for the replay.

#include <cstdint>
#include <string>
#include <vector>

#include "kdedup/filter/tick_scale.h"

namespace kdedup::testbroker {

struct AuditInput {
  std::int32_t partition = 0;
  std::int64_t offset = 0;
  std::string identity;
  std::int64_t timestamp_ms = 0;
};

struct AuditOutput {
  std::int32_t source_partition = -1;  ///< -1 = provenance missing
  std::int64_t source_offset = -1;
  std::string identity;  ///< the output record's key
};

struct AuditRules {
  filter::TickScale scale{60'000, 60};  ///< the pipeline's time -> tick mapping
  double fpp = 0.01;                    ///< configured target false-positive probability
};

struct AuditReport {
  std::uint64_t inputs = 0;
  std::uint64_t outputs = 0;
  std::uint64_t distinct_outputs = 0;  ///< outputs with distinct known provenance
  std::uint64_t exact_distinct = 0;    ///< distinct count of a pure exact replay
  std::uint64_t new_candidates = 0;    ///< records that were new given what was emitted
  std::uint64_t false_positives = 0;   ///< new, but dropped
  std::uint64_t false_negatives = 0;   ///< duplicate, but emitted
  std::uint64_t emitted_twice = 0;
  std::uint64_t unknown_outputs = 0;  ///< no/unknown provenance or key mismatch
  double observed_fpp = 0.0;          ///< false_positives / new_candidates
  std::uint64_t fp_bound = 0;         ///< most false positives accepted for `fpp`
  std::vector<std::string> problems;  ///< the first few violations, readable

  /// No false negatives, nothing emitted twice or unknown, FPs within bound.
  [[nodiscard]] bool ok() const noexcept {
    return false_negatives == 0 && emitted_twice == 0 && unknown_outputs == 0 &&
           false_positives <= fp_bound;
  }
};

/// `inputs` may come in any order; they are replayed per partition by offset.
[[nodiscard]] AuditReport audit_dedup(std::vector<AuditInput> inputs,
                                      const std::vector<AuditOutput>& outputs,
                                      const AuditRules& rules);

/// The most false positives a filter at `fpp` may show over `new_records`
/// records that were new given what was emitted, without failing a check:
/// the binomial mean + 4 standard deviations + 5.
[[nodiscard]] std::uint64_t false_positive_bound(double fpp, std::uint64_t new_records);

}  // namespace kdedup::testbroker
