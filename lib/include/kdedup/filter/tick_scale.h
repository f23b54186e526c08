#pragma once
// TickScale: the one mapping from event time (milliseconds) to filter ticks,
// used by every path that judges records: `kdedup run` (Slice), `kdedup
// filter`, the demo's audit, the benchmarks and the test oracles.
//
//   tick(t) = floor(t * W / window)          W = ticks_per_window
//
// computed exactly in 128-bit arithmetic: a tick is window / W long, which
// need not be a whole number of milliseconds (1 s / 192 = 5.208 ms).
//
// The guarantee (DESIGN.md "Clock"), with the filters' rule that an entry
// inserted at tick a is alive at tick n iff n - a <= W (sliding_filter.h):
// an identity delivered at time t is a duplicate for every arrival at a time
// <= t + window, and (timer, exact and compact filters) is forgotten by
// t + window + one tick. Proof: tick(t + window) = floor(t W / window + W) =
// tick(t) + W, so the age at t + window is exactly W (alive); any time
// >= t + window + window / W maps to at least tick(t) + W + 1 (dead). Earlier
// versions divided by a whole tick length, floor(window / W) milliseconds,
// which shortened the window (a 1 s window with W = 192 remembered 960 ms).
//
// fingerprint() identifies the mapping (window, W and the mapping's version)
// for snapshots: a filter state is only meaningful under the mapping that
// numbered its ticks, so a snapshot taken with another window, another W or
// the old mapping is refused as "config changed" and the partition rebuilt.
//
// A value type; any thread.

#include <cstdint>
#include <string>

#include "kdedup/common/result.h"
#include "kdedup/filter/sliding_filter.h"

namespace kdedup::filter {

class TickScale {
 public:
  /// Version of the mapping, part of fingerprint(). 2 = exact rational
  /// mapping (1 = floor(t / floor(window / W)), before it was fixed).
  static constexpr std::uint32_t kMappingVersion = 2;

  /// `window_ms` > 0 and `ticks_per_window` > 0 (see make()).
  constexpr TickScale(std::int64_t window_ms, std::uint32_t ticks_per_window) noexcept
      : window_ms_(window_ms), ticks_(ticks_per_window) {}

  /// Checks the arguments; the error names the bad one.
  [[nodiscard]] static Result<TickScale> make(std::int64_t window_ms,
                                              std::uint32_t ticks_per_window);

  /// The tick at event time `time_ms` (>= 0; negative times count as 0).
  [[nodiscard]] Tick tick(std::int64_t time_ms) const noexcept {
    if (time_ms <= 0) return 0;
    __extension__ using Wide = unsigned __int128;  // time * W overflows 64 bits
    return static_cast<Tick>(static_cast<Wide>(time_ms) * ticks_ / static_cast<Wide>(window_ms_));
  }

  /// First millisecond of tick `t`: ceil(t * window / W).
  [[nodiscard]] std::int64_t start_ms(Tick t) const noexcept;

  [[nodiscard]] std::int64_t window_ms() const noexcept { return window_ms_; }
  [[nodiscard]] std::uint32_t ticks_per_window() const noexcept { return ticks_; }
  /// window / W in milliseconds (the window's precision); may be fractional.
  [[nodiscard]] double tick_ms() const noexcept {
    return static_cast<double>(window_ms_) / static_cast<double>(ticks_);
  }
  /// Whole milliseconds after the window at which a delivery is forgotten
  /// at the latest: ceil(window / W).
  [[nodiscard]] std::int64_t tick_ms_ceil() const noexcept {
    return (window_ms_ + ticks_ - 1) / ticks_;
  }
  /// "5.208ms": the tick length for logs.
  [[nodiscard]] std::string describe_tick() const;

  /// Digest of (window, W, kMappingVersion) for snapshot fingerprints.
  [[nodiscard]] std::uint64_t fingerprint() const noexcept;

  friend bool operator==(const TickScale&, const TickScale&) = default;

 private:
  std::int64_t window_ms_;
  std::uint32_t ticks_;
};

}  // namespace kdedup::filter
