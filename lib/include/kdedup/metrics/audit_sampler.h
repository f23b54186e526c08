#pragma once
// AuditSampler: measures a filter's *observed* false-positive rate.
//
// An exact shadow set (ExactFilter) tracks the delivered set (seed 000,
// Definition 4) for a hash-selected 1/N of the identity space. For each
// sampled record the pipeline reports the real filter's decision:
//   - "duplicate" but the shadow never saw a delivery within the window:
//     a wrongly dropped record (false_positive_records);
//   - "distinct" but the shadow holds a delivery within the window:
//     a false negative (a duplicate got through);
//   - "distinct": the shadow records the delivery (ExactFilter::insert). A
//     false negative is a real second delivery, so it moves the identity's
//     last delivery to now; the shadow holds the delivered set exactly.
//
// What the observed rate measures. The configured fpp is the probability
// that the filter answers "duplicate" to an identity not delivered within
// the window. Its answer for an identity depends on that identity's cells,
// so it is not a fresh draw for every copy: an identity dropped once meets
// the same cells on its next copies and is dropped again, as a matter of
// course. Counted per record, one unlucky identity with many copies weighs
// many times (the rate per record exceeds fpp: 1.5% against 0.91% per
// identity at fpp 0.01 in one stream). So each undelivered identity is one
// trial: its first record not delivered within the window is counted in
// truly_new, and in false_positives if the filter dropped it; its later
// copies while it stays undelivered, within one window of that drop, are
// neither trials nor false positives (a second, separate `dropped_` shadow
// remembers the drop for one window; after that the filter's cells that
// caused it have all been replaced, and the next copy is a new trial).
// Observed FP rate = false_positives / truly_new (FP + TN per identity, the
// denominator of seed 000 §7's false-positive rate), comparable with fpp;
// false_positive_records counts every wrongly dropped record, repeats too.
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
  std::uint64_t sampled = 0;  ///< sampled decisions seen
  /// Trials: sampled identities not delivered within the window, once per
  /// identity (its first such record; see the file comment).
  std::uint64_t truly_new = 0;
  std::uint64_t false_positives = 0;  ///< trials the filter answered "duplicate"
  std::uint64_t false_negatives = 0;  ///< "distinct" decisions on delivered records
  /// Every sampled record dropped although never delivered within the
  /// window: the trials' false positives and their later copies.
  std::uint64_t false_positive_records = 0;
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
  void count(const AuditCounts& c) noexcept;
  filter::ExactFilter shadow_;   // the delivered set
  filter::ExactFilter dropped_;  // identities whose trial was a false positive, for a window
  std::uint32_t one_in_;
  AuditCounts pending_;
  AuditCounts totals_;
};

}  // namespace kdedup::metrics
