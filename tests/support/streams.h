#pragma once
// Deterministic event streams for filter tests and benchmarks, and a runner
// that scores a SlidingFilter against an exact oracle.
//
// Streams follow the synthetic workloads of seed 000 §7: identities drawn
// uniformly or Zipf(alpha = 1.0) from a domain of a given size (a smaller
// domain means more duplicates), a base arrival rate per tick, and optional
// bursts of 2x or 5x that rate during the middle third of the stream. The
// same StreamSpec (seed included) always yields the same events.
//
// Not thread-safe; each test builds its own streams.

#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <vector>

#include "kdedup/filter/fingerprint.h"
#include "kdedup/filter/sliding_filter.h"

namespace kdedup::testing {

using filter::Fingerprint;
using filter::Tick;

enum class Distribution : std::uint8_t { kUniform, kZipf };

/// Shape of a synthetic stream (seed 000 §7).
struct StreamSpec {
  Distribution distribution = Distribution::kUniform;
  double zipf_alpha = 1.0;        ///< skew of kZipf draws
  std::uint64_t domain = 10'000;  ///< number of distinct identities drawn from
  double base_rate = 100.0;       ///< events per tick outside the burst (fractions accumulate)
  std::uint64_t ticks = 1'000;    ///< stream length in ticks
  double burst_factor = 1.0;      ///< rate multiplier in the middle third (1 = steady, 2, 5)
  Tick first_tick = 0;            ///< tick of the first event
  std::uint64_t seed = 1;         ///< RNG seed and identity salt
};

struct Event {
  Fingerprint fp;
  Tick tick = 0;
};

/// Events per tick at stream-relative tick `i` (0-based): base_rate, times
/// burst_factor for i in [ticks/3, 2*ticks/3).
[[nodiscard]] double rate_at(const StreamSpec& spec, std::uint64_t i);

/// The fingerprint of identity number `id` of the domain salted by `seed`:
/// a fixed bijective mix, so identities never collide within a domain.
[[nodiscard]] Fingerprint identity_fingerprint(std::uint64_t id, std::uint64_t seed);

/// Yields the events of a StreamSpec one at a time without storing them
/// (benchmarks stream hundreds of millions of events).
class EventStream {
 public:
  explicit EventStream(const StreamSpec& spec);

  /// Writes the next event and returns true, or returns false at the end.
  bool next(Event& out);

  /// Draws one identity number in [0, domain) from the configured distribution.
  std::uint64_t draw_identity();

 private:
  StreamSpec spec_;
  std::mt19937_64 rng_;
  std::vector<double> zipf_cdf_;  // cumulative weights of ranks 1..domain (kZipf only)
  std::uint64_t tick_index_ = 0;  // stream-relative tick being emitted
  std::uint64_t left_in_tick_ = 0;
  double carry_ = 0.0;  // fractional events carried to the next tick
  bool started_ = false;
};

/// All events of a stream, in order.
[[nodiscard]] std::vector<Event> generate_stream(const StreamSpec& spec);

/// Bytes of filter state a filter of `c`'s type, fpp and shape holds when
/// it is sized for exactly `ids` distinct identities a window: the timer
/// filter's pre-sized sub-filter, the compact filter's pre-sized table, the
/// aging filter's (k, l) model; 0 for the exact filter (which has none).
[[nodiscard]] std::uint64_t presized_bytes(filter::FilterConfig c, std::uint64_t ids);

/// New identities (`per_window` a window of `window` ticks, for seven
/// windows) and, from the fourth window on, `burst` more new ones within
/// `ticks` ticks: family_bench --short-bursts' streams.
[[nodiscard]] std::vector<Event> short_burst_stream(std::uint32_t window, double per_window,
                                                    double burst, std::uint64_t ticks);

/// Ticks a window of the streams family_bench generates (and the tests that
/// measure its streams): finer than any filter's ticks, so that every filter
/// sees the same events on its own tick scale (lay_on_ticks()).
inline constexpr Tick kFineTicksPerWindow = 4096;

/// `events`, generated at kFineTicksPerWindow ticks a window, on a filter's
/// `window` ticks a window.
void lay_on_ticks(std::vector<Event>& events, std::uint32_t window);

/// The most of `stamps` (ascending, in ms) within one window of
/// `window_ms`: the most identities delivered within a window, when they
/// are the stamps of the deliveries.
[[nodiscard]] std::size_t most_within(const std::vector<std::int64_t>& stamps,
                                      std::int64_t window_ms);

/// Outcome of scoring a filter against the oracle. "Delivered" means the
/// filter under test emitted the identity as distinct within the window.
struct OracleCounts {
  std::uint64_t events = 0;
  std::uint64_t true_positives = 0;   ///< duplicate, and delivered within the window
  std::uint64_t true_negatives = 0;   ///< distinct, and not delivered within the window
  std::uint64_t false_positives = 0;  ///< duplicate, but not delivered within the window
  std::uint64_t false_negatives = 0;  ///< distinct, but delivered within the window
  /// Per identity: events that are the first query of an identity since its
  /// last delivery (or ever) while it is not delivered within the window,
  /// and those of them judged duplicate. A false match lasts as long as the
  /// entry it matches, so an identity that recurs meanwhile is judged a
  /// duplicate again: fp_rate() counts every such event, this counts the
  /// identity once per absence (the filter's false-positive probability).
  std::uint64_t first_queries = 0;
  std::uint64_t first_query_false_positives = 0;
  /// FP / (events whose truth is "not delivered"); 0 when there were none.
  [[nodiscard]] double fp_rate() const;
  /// first_query_false_positives / first_queries; 0 when there were none.
  [[nodiscard]] double first_query_fp_rate() const;
};

/// True when events[i] is the last event of its tick (events in tick order):
/// an observer of run_against_oracle() with `tick_chunks`, or one event at a
/// time, sees there the filter as that tick closes.
[[nodiscard]] bool closes_tick(std::span<const Event> events, std::size_t i);

/// Called after each event: index in the stream, the event, the filter's
/// decision and the oracle's truth (true = delivered within the window).
using OracleObserver = std::function<void(std::size_t index, const Event& event,
                                          filter::Decision decision, bool delivered)>;

/// Runs `filter` over `events` next to an exact oracle (seed 000 Definition 4:
/// an event is a duplicate iff it was *delivered* within the window).
///
/// The oracle is an ExactFilter with the filter's ticks_per_window holding
/// exactly what the filter under test delivered. For each event, in order:
///   truth    = oracle.contains(fp, tick)          (ExactFilter::contains)
///   decision = filter.test_and_insert(fp, tick)
///   if decision is distinct: insert into the oracle too.
/// FP = decided duplicate while truth says not delivered; FN = decided
/// distinct while truth says delivered; fp_rate() = FP / (events whose truth
/// is "not delivered"). The oracle records each delivery with
/// ExactFilter::insert, so a false negative (a re-delivery) moves the
/// identity's last delivery to its tick.
///
/// batch > 1 feeds the filter through test_and_insert_batch in chunks of that
/// size; truth is still evaluated event by event in order, which is exact
/// because the oracle only changes on the filter's own decisions. The
/// observer runs once a chunk is decided, so it sees the filter up to
/// batch - 1 events ahead; with `tick_chunks` a chunk also ends at every
/// change of tick, so that the observer of a tick's last event sees the
/// filter as that tick closes (before the next tick's first event, which
/// may free or add a part).
OracleCounts run_against_oracle(filter::SlidingFilter& filter, std::span<const Event> events,
                                std::size_t batch = 1, const OracleObserver& observer = {},
                                bool tick_chunks = false);

}  // namespace kdedup::testing
