#pragma once
// AgingFilter: the time-limited Age-Partitioned Bloom Filter of seed 002 §6
// (extending Shtul, Baquero, Almeida, "Age-Partitioned Bloom Filters", 2020).
// The lowest memory per in-window identity of the filter family.
//
// Structure (seed 002 §5.1, §6). A sequence of bit slices s0 (newest) ..
// s_{N-1} (oldest), N >= k + l. A distinct identity sets one bit in each of
// s0..s_{k-1}. When the generation counter (eq. 4-5) runs out, the filter
// shifts: every slice moves one position older and a fresh s0, sized from the
// observed insertion rate (eq. 6-8), is added. A slice is retired only once
// its newest insertion is older than the window (eq. 3), so N grows above
// k + l while the insertion rate rises and returns to k + l when it falls.
// A query reports a duplicate when k consecutive in-window slices match
// (Algorithm 1). Slices k positions apart never hold the same insertion, so
// only k hash functions exist: slice number q (counted from creation) uses
// function q mod k, and probes come from the 128-bit Fingerprint by double
// hashing, h_j = lo + j * hi.
//
// Window guarantee, in ticks (see sliding_filter.h): an identity delivered at
// tick t is a duplicate at every `now` with now - t <= ticks_per_window (W):
// no false negatives inside the window. A slice only remembers its newest
// insertion tick, so the identity's own k slices stay in the window until at
// most W + G - 1 ticks after t, where no generation lasts more than
// G = generation_limit() ticks (1.25 * (W + 2) / l + 1, rounded up). After
// that it still matches a window j generations younger if the j bits it never
// set there happen to be set: probability about 2^-j (the soft edge of every
// APBF), fading into the ordinary false-positive rate. A reappearance right
// after the window is therefore more likely to be dropped than a new identity.
//
// Choosing (k, l). For the target fpp, (k, l) minimise the bits per element
// (k + l) * k / (l * ln 2) subject to the APBF worst-case false-positive
// probability (fill ratios of seed 002 eq. 2 just before a shift, the
// probability that some k consecutive slices all match) being <= fpp, with
// l <= kMaxL to bound query work and keep generations several ticks long.
// The pairs are computed from that formula, not copied from a table; see
// choose_aging_shape().
//
// Sizing for a rising rate. Each generation is sized from the rate of the
// recent ticks (eq. 6), so while the rate rises generations last less than
// (W + 2) / l ticks and the window holds more than l of them (N above
// k + l, as §6 allows; §7 sees the false-positive rate go "a bit over" the
// target then): each one more is a run of k consecutive slices a query may
// match. Sized at eq. 8's ln 2, the estimate passed the target along every
// rise measured (up to 1.35x for a burst within a tick, with 38% more
// generations than l), and so did the false positives (1.46% over the 16
// ticks after it, fpp 1%). Slices are sized for the worst case with
// kRunHeadroom x l more generations than l (load_for(): a load a little
// under ln 2), which holds the target along those rises for 4.5% more bits
// at fpp 1% (docs/performance.md, "The aging filter along a rising rate").
//
// Deviations from the paper, each to keep the window exact under a coarse
// tick clock:
// - eq. 6's t_span / l is (W + 2) / l ticks: an entry is alive for W + 1
//   tick values, plus one tick for the partial ticks at both ends of a
//   generation, so the slice shifted out of position k + l - 1 has left the
//   window and N settles at k + l, not k + l + 1;
// - the rate in eq. 6 is counted over whole ticks, from the start of the tick
//   in which a recent generation began to the start of the current tick,
//   spanning at least max(W / 8, (W + 2) / l) ticks (a generation can fit in
//   one tick, and partial ticks at its ends would make the rate, and with it
//   every slice size, noisy); history reaching across an idle gap is left
//   out, and the rate is never below this tick's insertions so far, so
//   traffic resuming after a pause does not produce a run of tiny slices;
//   past the first window, onto a window holding more than the tick so
//   far, that bound gives a generation at most kSurgeStep times the
//   window's share of one (holds / l), so that a burst within one tick is
//   not taken for a window at its rate;
// - eq. 8 divides by load_for(fpp) rather than ln 2 (above);
// - eq. 7 is capped at k * tg, so oversized older slices (a falling rate, an
//   over-dimensioned start) do not carry over into the new s0 (the paper's
//   §7.1 observes s0 "updated down to the optimal value at the very first
//   shift");
// - a generation is also closed after G ticks, so a sudden rate drop cannot
//   stretch how long identities are remembered.
//
// Memory follows load (DESIGN.md): `capacity` is a hint. The first k + l
// slices together hold at most the floor min_bytes (less when the hint needs
// less); from the first shift on, eq. 6-8 size every new s0 from the
// measured rate, so the filter grows under load and returns to the rate's
// size within about a window of a fall (oversized slices, from a restored
// snapshot too, retire as the clock moves). Under a shared MemoryBudget
// (memory_budget.h) each slice is reserved before it is added; with the
// budget's pressure raising the target fpp, slices are sized for more
// insertions per bit (load_for(): the eq. 2 fills at a higher load), and the
// current ones may take more before the next shift. When the budget refuses
// a new s0, the filter keeps its current generation open until the next
// tick (its slices fill past their design load, which raises the fpp; no
// entry is lost, and the window edge only gets softer).
//
// Serialized form: envelope kind FilterType::kAging, version 1, checksummed;
// restore validates every field (sizes, slice numbering, tick order, set-bit
// counts against the bits) and rejects trailing bytes.
//
// Owned by one thread (the worker owning its Slice); no method is
// thread-safe, as for every SlidingFilter.

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "kdedup/filter/memory_budget.h"
#include "kdedup/filter/sliding_filter.h"

namespace kdedup::filter {

/// The (k, l) pair of an aging filter and its worst-case fpp (seed 002 §5.4).
struct AgingShape {
  std::uint32_t k = 0;  ///< slices an identity is written to / must match
  std::uint32_t l = 0;  ///< extra slices: the window holds about l generations
  double fpp = 0.0;     ///< worst-case false-positive probability of (k, l)
  /// Bits per in-window identity at steady state: (k + l) * k / (l * ln 2).
  [[nodiscard]] double bits_per_element() const noexcept;
};

/// Worst-case false-positive probability of an APBF with k + l slices: the
/// chance that some k consecutive slices all match when slice i < k has fill
/// 1 - 2^-((i+1)/k) and older slices have fill 1/2 (seed 002 eq. 2). With
/// `load` (insertions per bit a slice takes over its k generations, ln 2 in
/// the paper) slice i < k has fill 1 - e^(-load (i+1)/k) and older ones
/// 1 - e^(-load).
[[nodiscard]] double aging_worst_case_fpp(std::uint32_t k, std::uint32_t l) noexcept;
[[nodiscard]] double aging_worst_case_fpp(std::uint32_t k, std::uint32_t l, double load) noexcept;

/// Smallest bits per element (k + l) * k / (l ln 2) over k in [1, kMaxK],
/// l in [1, kMaxL] with aging_worst_case_fpp(k, l) <= fpp. `fpp` must be in
/// [kMinFpp, 0.5).
[[nodiscard]] AgingShape choose_aging_shape(double fpp);

class AgingFilter final : public SlidingFilter {
 public:
  static constexpr std::uint32_t kMaxK = 48;
  static constexpr std::uint32_t kMaxL = 64;
  static constexpr double kMinFpp = 1e-9;  ///< needs k <= kMaxK
  static constexpr std::uint64_t kMinSliceBits = 64;
  static constexpr std::uint64_t kMaxSliceBits = 1ULL << 32;  ///< 512 MiB per slice
  /// Past the first window, a rate taken from the tick in progress gives a
  /// generation at most this many times the window's share of one
  /// (insertion_rate(): fewer, larger generations keep the estimate lower).
  static constexpr double kSurgeStep = 4.0;
  /// Slices are sized for the worst case with this share of l more
  /// generations in the window (load_for()): a rising rate's shorter
  /// generations make the window hold more than l of them.
  static constexpr double kRunHeadroom = 0.35;
  /// The lowest design load load_for() gives (insertions per bit).
  static constexpr double kMinLoad = 1e-3;

  /// `config` must be normalized (see normalize()); capacity sizes the first
  /// k + l slices for that many distinct identities per window.
  explicit AgingFilter(const FilterConfig& config);

  FilterType type() const noexcept override { return FilterType::kAging; }
  const FilterConfig& config() const noexcept override { return config_; }
  Decision test_and_insert(const Fingerprint& fp, Tick now) override;
  /// Same decisions as the sequential loop; prefetches the cache lines the
  /// insertion of a later element will touch.
  void test_and_insert_batch(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                             std::span<Decision> out) override;
  /// Sets the identity's bits in s0..s_{k-1}: it matches the newest k
  /// slices from now on, whatever older slices hold.
  void insert(const Fingerprint& fp, Tick now) override;
  /// Moves the clock; retires slices past the window beyond the first k + l.
  void advance(Tick now) override;
  FilterStats stats() const override;
  std::string serialize() const override;

  /// Payload of an envelope of kind kAging (called by restore_filter).
  static Result<std::unique_ptr<SlidingFilter>> restore(std::string_view payload,
                                                        std::uint16_t version);

  /// True if `fp` would be judged a duplicate at `now` (Algorithm 1), without
  /// inserting it. `now` below the filter's clock is treated as the clock.
  [[nodiscard]] bool contains(const Fingerprint& fp, Tick now) const;

  [[nodiscard]] const AgingShape& shape() const noexcept { return shape_; }
  /// G: the longest a generation may last, in ticks (see the guarantee above).
  [[nodiscard]] Tick generation_limit() const noexcept { return generation_limit_; }

  /// Charges the slices held now, then reserves every new s0 and releases
  /// every retired slice (memory_budget.h).
  void set_memory_budget(std::shared_ptr<MemoryBudget> budget) override;
  void quiet() override;
  /// Insertions per bit a slice takes over its k generations: load_for()
  /// of the configured fpp, more while budget pressure raises the target.
  [[nodiscard]] double load() const noexcept { return load_; }
  /// The load at which the worst-case fpp of k consecutive slices among k
  /// + (1 + kRunHeadroom) l reaches `fpp` (a little under ln 2 at the fpp
  /// (k, l) was chosen for).
  [[nodiscard]] double load_for(double fpp) const;

 private:
  struct Slice {
    std::vector<std::uint64_t> words;
    std::uint64_t bits = 0;        // m_i, a multiple of 64
    std::uint64_t ones = 0;        // set bits, for the fill ratio
    std::uint64_t inserted = 0;    // n_i: insertions into this slice
    std::uint64_t generation = 0;  // insertions made while this slice was s0
    Tick created = 0;              // tick it became s0 (start of its generation)
    std::uint64_t tick_base = 0;   // insertions before tick `created` began
    Tick last = 0;                 // t_i: newest insertion (or creation) tick
    std::uint64_t seq = 0;         // creation number; hash function seq mod k
    MemoryCharge charge;           // its bits in the MemoryBudget, if any
  };
  /// stats().bytes: the filter and its slices' bits.
  [[nodiscard]] std::uint64_t state_bytes() const;

  // Position p (0 = newest) in slices_, which keeps the newest at the back.
  Slice& at(std::size_t p) { return slices_[slices_.size() - 1 - p]; }
  const Slice& at(std::size_t p) const { return slices_[slices_.size() - 1 - p]; }
  std::uint64_t probe(const Slice& s, const Fingerprint& fp) const noexcept;
  bool in_window(const Slice& s, Tick now) const noexcept {
    return now - s.last <= config_.ticks_per_window;
  }
  void start(Tick now);
  void move_clock(Tick now);
  /// Closes a generation that has lasted generation_limit() ticks.
  void close_stale_generation();
  void write_bits(const Fingerprint& fp);
  /// False when the budget refused the new s0 (the generation stays open).
  bool shift();
  void retire_expired();
  void observe_budget();
  std::uint64_t slice_bits_for(double capacity) const;
  void prefetch(const Fingerprint& fp) const;
  double insertion_rate() const;
  /// False-positive probability of a query now (stats().fpp_estimate).
  [[nodiscard]] double fpp_now() const;
  std::uint64_t generation_size() const;
  static Slice make_slice(std::uint64_t bits, std::uint64_t seq, Tick now);
  /// Charges `bits` of a slice in the budget (`required`: past the limit
  /// too); false when the budget refuses.
  bool reserve(Slice& s, bool required);
  struct NoSlices {};
  AgingFilter(const FilterConfig& config, NoSlices);  // restore() fills the slices

  FilterConfig config_;
  std::shared_ptr<MemoryBudget> budget_;  // null: not accounted; outlives slices_
  BudgetLevel budget_level_;              // the level this filter sizes for
  MemoryDemand demand_;                   // what it would need at each level
  std::vector<double> level_load_;        // load per bit at each level's target
  /// Publishes what the filter would need at each level (once per tick).
  void publish_demand();
  double load_ = 0;      // insertions per bit over k generations
  bool denied_ = false;  // a shift was refused at this clock value
  AgingShape shape_;
  double target_interval_ = 0;  // (W + 2) / l ticks: eq. 6's t_span / l
  Tick generation_limit_ = 1;   // G
  Tick rate_horizon_ = 1;       // ticks of history behind the eq. 6 rate
  std::vector<Slice> slices_;   // oldest first, newest (s0) last
  Tick clock_ = 0;
  bool started_ = false;          // clock_ holds a real tick
  std::uint64_t remaining_ = 0;   // insertions until the next shift (eq. 5)
  std::uint64_t next_seq_ = 0;    // creation number of the next slice
  std::uint64_t insertions_ = 0;  // distinct decisions since creation
  std::uint64_t tick_base_ = 0;   // insertions_ when clock_ reached its value
};

}  // namespace kdedup::filter
