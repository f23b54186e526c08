#pragma once
// AuditSampler: measures a filter's *observed* false-positive rate.
//
// An exact shadow set (ExactFilter) tracks the delivered set (seed 000,
// Definition 4) for a hash-selected 1/N of the identity space. For each
// sampled record the pipeline reports the real filter's decision:
//   - "duplicate" but the shadow never saw a delivery within the window:
//     a confirmed false positive (an event was wrongly dropped);
//   - "distinct" but the shadow holds a delivery within the window:
//     a false negative (a duplicate got through);
//   - "distinct": the shadow records the delivery (ExactFilter::insert). A
//     false negative is a real second delivery, so it moves the identity's
//     last delivery to now; the shadow holds the delivered set exactly.
// Observed FP rate = false_positives / truly_new, where truly_new counts the
// sampled records the shadow says were never delivered (FP + TN, the
// denominator of seed 000 §7's false-positive rate).
//
// Selection. A record is sampled iff mix(fp.lo ^ fp.hi) % N == 0, where mix
// is a bijective 64-bit finaliser (splitmix64's). Filters derive their probe
// positions from fp.lo and fp.hi directly: the timer filter picks the line
// from the top bits of fp.hi (multiply-high) and the in-line cells from bit
// fields of fp.lo; the aging filter probes fp.lo + j * fp.hi (mod slice
// size). Selecting on raw bits (say fp.hi % N == 0) would pin those bits in
// every sampled fingerprint: harmless for the timer filter's line choice,
// but it would shift every aging probe by a multiple of N and couple the
// sample to whichever bits some future filter reads. Folding both halves through a full-avalanche
// mixer makes the selected set independent of every bit range of either half, so sampled identities
// probe the filter like any other. The salt is already in the fingerprint, so nobody outside can
// predict which identities are audited.
//
// Memory: about 1/N of an exact filter for the same stream (~80 bytes per
// sampled identity alive in the window).
//
// Owned by the worker that owns the partition's Slice; not thread-safe, like
// the filter it audits. Ticks must be the filter's ticks.

#include <cstdint>

#include "kdedup/common/result.h"
#include "kdedup/filter/exact_filter.h"

namespace kdedup::metrics {

/// Counts accumulated since the last drain().
struct AuditCounts {
  std::uint64_t sampled = 0;          ///< sampled decisions seen
  std::uint64_t truly_new = 0;        ///< sampled records never delivered in the window
  std::uint64_t false_positives = 0;  ///< "duplicate" decisions on truly new records
  std::uint64_t false_negatives = 0;  ///< "distinct" decisions on delivered records
};

class AuditSampler {
 public:
  /// `ticks_per_window` must equal the audited filter's; `one_in` is N
  /// (1 audits everything). Errors name the offending argument.
  [[nodiscard]] static Result<AuditSampler> create(std::uint32_t ticks_per_window,
                                                   std::uint32_t one_in = 1024);

  /// True if `fp` belongs to the audited 1/N of the identity space. Cheap
  /// (a few multiplies); call it for every record.
  [[nodiscard]] bool selects(const filter::Fingerprint& fp) const noexcept;

  /// Reports the filter's decision on `fp` at tick `now` (non-decreasing).
  /// Records outside the sample are ignored, so calling it for every record
  /// is correct, only slower than checking selects() first.
  void observe(const filter::Fingerprint& fp, filter::Decision decision, filter::Tick now);

  /// A delivery decided elsewhere (AuditedFilter::insert: a rebuild from
  /// delivered records, on_duplicate: refresh): the shadow learns it, no
  /// decision is counted. Ignores records outside the sample.
  void record_delivery(const filter::Fingerprint& fp, filter::Tick now);

  /// Counts since the previous drain (for per-batch publishing).
  [[nodiscard]] AuditCounts drain() noexcept;

  /// Counts since creation.
  [[nodiscard]] const AuditCounts& totals() const noexcept { return totals_; }

  [[nodiscard]] std::uint32_t one_in() const noexcept { return one_in_; }

  /// Memory held by the shadow set.
  [[nodiscard]] std::uint64_t shadow_bytes() const;

 private:
  AuditSampler(const filter::FilterConfig& config, std::uint32_t one_in);
  [[nodiscard]] bool delivered(const filter::Fingerprint& fp, filter::Tick now) const;
  filter::ExactFilter shadow_;
  std::uint32_t one_in_;
  AuditCounts pending_;
  AuditCounts totals_;
};

}  // namespace kdedup::metrics
