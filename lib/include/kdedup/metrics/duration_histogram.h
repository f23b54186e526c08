#pragma once
// Duration histograms gathered on the hot path without locks and merged into
// Prometheus histograms by someone else.
//
// prometheus-cpp's Histogram::Observe() takes a mutex per call, so the worker
// threads never call it. Instead:
//
//   worker, per record    DurationCounts<B>::observe()        plain integers, on its stack
//   worker, per batch     DurationHistogram<B>::add() / observe()   relaxed atomic adds
//   bridge, per period    DurationHistogram<B>::read(), minus the previous reading,
//                         PartitionMetrics::add_*() -> Histogram::ObserveMultiple()
//
// The bucket bounds below are the ONLY definition of these histograms'
// buckets: the metrics module registers the Prometheus histograms with them
// and the pipeline's counters are instantiated on them, so a bucket index
// means the same `le` on both sides.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace kdedup::metrics {

/// Upper bounds (Prometheus `le`, seconds) of kdedup_batch_processing_seconds.
/// A batch takes from tens of microseconds (a small batch, hot cache) to a
/// second (a large batch behind a slow producer).
inline constexpr std::array<double, 14> kBatchProcessingBounds{
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5};

/// Upper bounds (seconds) of kdedup_record_age_at_emit_seconds: the normal
/// pipeline delay (milliseconds) up to an hour-long backlog after an outage.
inline constexpr std::array<double, 16> kEmitAgeBounds{0.005, 0.01,  0.025, 0.05,  0.1,  0.25,
                                                       0.5,   1.0,   2.5,   5.0,   10.0, 30.0,
                                                       60.0,  300.0, 900.0, 3600.0};

/// Upper bounds (seconds) of kdedup_confirm_lookup_seconds: one batch's
/// lookups of filter positives in the confirm store (the staged deliveries
/// in memory, then one RocksDB MultiGet): microseconds from memory and the
/// block cache, milliseconds from disk.
inline constexpr std::array<double, 14> kConfirmLookupBounds{
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001,
    0.0025,  0.005,    0.01,    0.025,  0.05,    0.1,    0.5};

/// The bounds in whole nanoseconds, so observations compare as integers.
/// Every bound above is a whole number of nanoseconds, and `le` is inclusive:
/// an observation of exactly a bound falls in that bound's bucket.
template <std::size_t N>
[[nodiscard]] constexpr std::array<std::uint64_t, N> bounds_in_nanos(
    const std::array<double, N>& seconds) noexcept {
  std::array<std::uint64_t, N> out{};
  for (std::size_t i = 0; i < N; ++i) {
    out[i] = static_cast<std::uint64_t>(seconds[i] * 1e9 + 0.5);
  }
  return out;
}

/// Observations of one duration histogram as plain integers: what a worker
/// gathers during one batch, and what a reader copies out of a
/// DurationHistogram. `Bounds` is one of the arrays above.
///
/// `buckets[i]` counts observations in bucket i alone (not cumulative); the
/// last one is +Inf. `sum_nanos` wraps modulo 2^64 (an hour-old backlog of a
/// few million records would overflow it): only differences between two
/// readings of the same histogram mean something, see since().
template <const auto& Bounds>
struct DurationCounts {
  static constexpr std::size_t kBuckets = Bounds.size() + 1;
  static constexpr auto kBoundsNanos = bounds_in_nanos(Bounds);

  std::array<std::uint64_t, kBuckets> buckets{};
  std::uint64_t sum_nanos = 0;

  /// The bucket `nanos` falls in: the first bound >= it, or the +Inf bucket.
  [[nodiscard]] static constexpr std::size_t bucket_of(std::uint64_t nanos) noexcept {
    std::size_t i = 0;
    while (i < kBoundsNanos.size() && nanos > kBoundsNanos[i]) ++i;
    return i;
  }

  void observe(std::uint64_t nanos) noexcept {
    ++buckets[bucket_of(nanos)];
    sum_nanos += nanos;
  }

  [[nodiscard]] std::uint64_t count() const noexcept {
    std::uint64_t n = 0;
    for (std::uint64_t b : buckets) n += b;
    return n;
  }

  [[nodiscard]] double sum_seconds() const noexcept { return static_cast<double>(sum_nanos) / 1e9; }

  /// The observations made between `before` and this reading of the same
  /// histogram (unsigned, so a sum that wrapped in between still subtracts
  /// right). A bucket that went backwards means the histogram started over
  /// in between (a new one replaced it): then this whole reading is new.
  [[nodiscard]] DurationCounts since(const DurationCounts& before) const noexcept {
    for (std::size_t i = 0; i < kBuckets; ++i) {
      if (buckets[i] < before.buckets[i]) return *this;
    }
    DurationCounts d;
    for (std::size_t i = 0; i < kBuckets; ++i) d.buckets[i] = buckets[i] - before.buckets[i];
    d.sum_nanos = sum_nanos - before.sum_nanos;
    return d;
  }

  friend bool operator==(const DurationCounts&, const DurationCounts&) = default;
};

/// A duration histogram in relaxed atomics: written by the one thread that
/// owns what it measures (the worker that owns a partition), read by any
/// thread. A reader sees each bucket and the sum individually up to date, not
/// a consistent cut: a batch added while it reads may show in the buckets and
/// not yet in the sum. The next reading includes it, so over time nothing is
/// lost or counted twice.
template <const auto& Bounds>
class DurationHistogram {
 public:
  using Counts = DurationCounts<Bounds>;

  /// One observation (one relaxed add per bucket touched, plus the sum).
  void observe(std::uint64_t nanos) noexcept {
    buckets_[Counts::bucket_of(nanos)].fetch_add(1, std::memory_order_relaxed);
    sum_nanos_.fetch_add(nanos, std::memory_order_relaxed);
  }

  /// Adds observations gathered elsewhere (a batch's worth) at once.
  void add(const Counts& c) noexcept {
    for (std::size_t i = 0; i < Counts::kBuckets; ++i) {
      if (c.buckets[i] != 0) buckets_[i].fetch_add(c.buckets[i], std::memory_order_relaxed);
    }
    if (c.sum_nanos != 0) sum_nanos_.fetch_add(c.sum_nanos, std::memory_order_relaxed);
  }

  /// Everything observed so far.
  [[nodiscard]] Counts read() const noexcept {
    Counts c;
    for (std::size_t i = 0; i < Counts::kBuckets; ++i) {
      c.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
    }
    c.sum_nanos = sum_nanos_.load(std::memory_order_relaxed);
    return c;
  }

 private:
  std::array<std::atomic<std::uint64_t>, Counts::kBuckets> buckets_{};
  std::atomic<std::uint64_t> sum_nanos_{0};
};

/// Processing time of one batch of one partition.
using BatchTimeCounts = DurationCounts<kBatchProcessingBounds>;
using BatchTimeHistogram = DurationHistogram<kBatchProcessingBounds>;
/// Age of one record emitted to the output topic.
using EmitAgeCounts = DurationCounts<kEmitAgeBounds>;
using EmitAgeHistogram = DurationHistogram<kEmitAgeBounds>;
/// One batch's confirm store lookups (confirmed mode).
using ConfirmLookupCounts = DurationCounts<kConfirmLookupBounds>;
using ConfirmLookupHistogram = DurationHistogram<kConfirmLookupBounds>;

}  // namespace kdedup::metrics
