// Timer filter: construction, the test-and-insert paths (one by one, and the
// batch path with its portable, AVX2 and AVX-512 probes), statistics. The
// design and the reasoning behind every constant are in timer_filter.h;
// growth and the budget are in timer_growth.cc, the clock and its scrub in
// timer_clock.cc, snapshots in timer_snapshot.cc.

#include "kdedup/filter/timer_filter.h"

#include "timer_cells.h"

namespace kdedup::filter {

TimerFilter::TimerFilter(const FilterConfig& config) : config_(config) {}
TimerFilter::~TimerFilter() = default;

Result<std::unique_ptr<TimerFilter>> TimerFilter::make_empty(const FilterConfig& config) {
  if (config.type != FilterType::kTimer) return fail("timer filter: config type is not timer");
  if (config.ticks_per_window == 0 ||
      config.ticks_per_window > max_timer_ticks_per_window(config.timer_bits)) {
    return fail("timer filter: ticks_per_window " + std::to_string(config.ticks_per_window) +
                " out of range for " + std::to_string(config.timer_bits) + "-bit timers");
  }
  std::unique_ptr<TimerFilter> f(new TimerFilter(config));
  f->cells_per_line_ = 512 / config.timer_bits;
  f->modulus_ = static_cast<std::uint32_t>((1U << config.timer_bits) - 1);
  f->period_ = f->modulus_ - 2 - config.ticks_per_window;  // P = G - 1 >= 1
  const std::uint32_t max_k = 64 / log2_of(f->cells_per_line_);
  const auto layout = sizing::choose_layout(f->cells_per_line_, kBudgetShare * config.fpp, max_k);
  if (layout.k == 0 || !(layout.elements_per_block > 0)) {
    return fail("timer filter: no layout reaches fpp " + std::to_string(config.fpp));
  }
  f->k_ = layout.k;
  f->model_ = sizing::BlockedModel::get(f->cells_per_line_, f->k_);
  f->target_ = config.fpp;
  f->lambda_full_ = layout.elements_per_block;
  // Queries in the window's buckets over the growth horizon and a bucket
  // more: recent() sums whole buckets.
  const std::uint64_t width = WindowCount::width_for(config.ticks_per_window);
  f->queries_span_ = static_cast<std::uint32_t>(f->growth_horizon() + width);
  f->queries_ = std::make_unique<WindowCount>();
  f->queries_->init(f->queries_span_, width);
  if (config.equal_timers > f->k_) {
    return fail("equal_timers (" + std::to_string(config.equal_timers) +
                ") must not exceed the number of probes k = " + std::to_string(f->k_) +
                " chosen for fpp " + std::to_string(config.fpp));
  }
  return f;
}

Result<std::unique_ptr<TimerFilter>> TimerFilter::create(const FilterConfig& config) {
  auto made = make_empty(config);
  if (!made) return tl::unexpected(made.error());
  std::unique_ptr<TimerFilter> f = std::move(*made);
  const std::uint64_t lines = f->initial_bytes() / kLineBytes;
  auto sub = f->new_subfilter(lines, true);
  if (!sub) return fail("timer filter: cannot allocate " + std::to_string(lines * 64) + " bytes");
  // Sized without any measured rate: a probe (see "Dynamic size").
  sub->share = kProbeShare;
  f->subs_.push_back(std::move(sub));
  f->refresh_threshold();
  return f;
}

Result<std::unique_ptr<TimerFilter>> TimerFilter::create_presized(const FilterConfig& config) {
  auto made = make_empty(config);
  if (!made) return tl::unexpected(made.error());
  std::unique_ptr<TimerFilter> f = std::move(*made);
  const std::uint64_t lines = f->presized_bytes() / kLineBytes;
  auto sub = f->new_subfilter(lines, true);
  if (!sub) return fail("timer filter: cannot allocate " + std::to_string(lines * 64) + " bytes");
  f->subs_.push_back(std::move(sub));
  f->refresh_threshold();
  return f;
}

std::uint64_t TimerFilter::presized_bytes() const noexcept {
  const double lines = std::ceil(static_cast<double>(config_.capacity) / lambda_full_);
  const double max_lines = static_cast<double>(std::max<std::uint64_t>(1, config_.max_bytes / 64));
  return static_cast<std::uint64_t>(std::clamp(lines, 1.0, max_lines)) * kLineBytes;
}

std::uint64_t TimerFilter::floor_lines() const noexcept {
  return std::max<std::uint64_t>(1, config_.min_bytes / kLineBytes);
}

std::uint64_t TimerFilter::initial_bytes() const noexcept {
  // The hint may start the filter below the floor, never above it.
  return std::min(presized_bytes() / kLineBytes, floor_lines()) * kLineBytes;
}

// The hot path's view of the sub-filters and its bookkeeping: kept beside
// the batch loops, which inline them.
void TimerFilter::refresh_view() {
  TickView& v = view_;
  v.count = static_cast<std::uint32_t>(subs_.size());
  bool shrunk = false;
  for (std::size_t i = 0; i < subs_.size(); ++i) {
    const SubFilter& s = *subs_[subs_.size() - 1 - i];
    v.subs[i] = {s.data.get(), s.span, s.lines, s.span / 2};
    shrunk = shrunk || s.shrunk();
  }
  v.shrunk = shrunk;
  v.k = k_;
  v.equal = config_.equal_timers;
  // The insert path needs these for every operation; a division per op (the
  // modulus is a runtime value) cost more than the rest of the age test.
  v.now_code = static_cast<std::uint32_t>(clock_ % modulus_) + 1;
  const LiveInterval live = live_interval(v.now_code, config_.ticks_per_window, modulus_);
  v.live_lo = live.lo;
  v.live_span = live.span;
  if (config_.timer_bits <= 8) {
    // Alive: the live.span + 1 codes from live.lo on, modulo 2^b (with 0,
    // empty, inside them when the interval wraps).
    auto& c = v.code_class;
    std::fill(c.begin(), c.end(), std::uint8_t{0});
    const std::uint32_t codes = modulus_ + 1;  // 2^b
    const std::uint32_t end = live.lo + live.span + 1;
    std::fill(c.begin() + live.lo, c.begin() + std::min(end, codes), kClassAlive);
    if (end > codes) std::fill(c.begin(), c.begin() + (end - codes), kClassAlive);
    c[0] = kClassEmpty;
  }
  const SubFilter& a = *subs_.back();
  const std::uint64_t held =
      config_.growth == Growth::kCardinality ? std::max(a.alive.sum, a.inserts) : a.alive.sum;
  const std::uint64_t limit = overfull_ ? overfull_limit_ : active_limit_;
  v.room = limit > held ? limit - held : 0;
}

void TimerFilter::commit_inserts(std::uint64_t n, std::uint64_t filled) {
  if (n == 0) return;
  SubFilter& a = *subs_.back();
  a.alive.add(n);
  a.inserts += n;
  a.nonempty += filled;
  a.last_insert = clock_;
  if (insertions_ == 0) first_tick_ = clock_;
  insertions_ += n;
  tick_inserts_ += n;
  view_.room = view_.room > n ? view_.room - n : 0;
}

namespace {

// The line of `fp` in sub-filter `s` of a view: multiply-high range
// reduction over its hash range, and past a shrink the hash lines beyond
// those held share a line with the one half the range back (linear hashing,
// "Shrink" in timer_filter.h). The batch loops' UnshrunkView skips that
// compare when no sub-filter is shrunk (the usual case).
template <class View>
[[gnu::always_inline]] inline std::uint8_t* line_of(const std::uint64_t hi, const View& view,
                                                    std::uint32_t s) {
  const auto& c = view.subs[s];
  std::uint64_t v = mulhi(hi, c.span);
  if constexpr (View::kMayBeShrunk) v = held_line(v, c.lines, c.back);
  return c.data + v * kLineBytes;
}

// Outcome of probe_once.
enum class Probe : std::uint8_t {
  kDuplicate,  ///< all k cells alive in some sub-filter: nothing written
  kInserted,   ///< distinct: the k cells of the active line now hold the clock's code
  kNeedSeal,   ///< distinct, but the active sub-filter is full: nothing written
};

// One test-and-insert against a TickView (first-test-then-set, seed 000 §4).
// `inserted` is how many inserts the caller has made into the active
// sub-filter since `view` was taken; on kInserted, `filled` is the number of
// cells that were empty before the write.
template <unsigned Bits, unsigned K>
[[gnu::always_inline]] inline Probe probe_once(const auto& view, const Fingerprint& fp,
                                               std::uint64_t inserted, std::uint32_t& filled) {
  // K != 0: the probe count as a compile-time constant, so that every loop
  // over the k cells unrolls and the positions stay in registers.
  const std::uint32_t k = K != 0 ? K : view.k;
  std::uint32_t pos[kMaxProbes];
  probe_positions<Cells<Bits>::kPerLine, K>(fp.lo, k, pos);
  // Newest sub-filter first: it holds the most recent, most often repeated ids.
  std::uint8_t* active = line_of(fp.hi, view, 0);
  std::uint32_t empty = 0;
  if (all_alive<Bits>(active, pos, k, view, empty) &&
      (view.equal == 0 || enough_equal<Bits>(active, pos, k, view.equal))) {
    return Probe::kDuplicate;
  }
  for (std::uint32_t s = 1; s < view.count; ++s) {
    const std::uint8_t* line = line_of(fp.hi, view, s);
    std::uint32_t unused;
    if (all_alive<Bits>(line, pos, k, view, unused) &&
        (view.equal == 0 || enough_equal<Bits>(line, pos, k, view.equal))) {
      return Probe::kDuplicate;
    }
  }
  if (inserted >= view.room) return Probe::kNeedSeal;
  // Distinct: insert into the active sub-filter (first-test-then-set).
  write_code<Bits>(active, pos, k, view.now_code);
  filled = empty;
  return Probe::kInserted;
}

// insert(): writes the clock's code into the k cells of the active line
// without testing them first (the identity was delivered: its lifetime
// starts now, whatever older cells say). kNeedSeal when the active is full.
template <unsigned Bits>
inline Probe write_once(const auto& view, const Fingerprint& fp, std::uint64_t inserted,
                        std::uint32_t& filled) {
  if (inserted >= view.room) return Probe::kNeedSeal;
  std::uint32_t pos[kMaxProbes];
  probe_positions<Cells<Bits>::kPerLine, 0>(fp.lo, view.k, pos);
  std::uint8_t* active = line_of(fp.hi, view, 0);
  filled = 0;
  for (std::uint32_t i = 0; i < view.k; ++i) filled += Cells<Bits>::get(active, pos[i]) == 0;
  write_code<Bits>(active, pos, view.k, view.now_code);
  return Probe::kInserted;
}

// The portable probe: probe_once.
template <unsigned Bits, unsigned K>
struct PortableProbe {
  [[gnu::always_inline]] static inline Probe run(const auto& view, const Fingerprint& fp,
                                                 std::uint64_t inserted, std::uint32_t& filled) {
    return probe_once<Bits, K>(view, fp, inserted, filled);
  }
};

#if KDEDUP_TIMER_X86
// The k probe cells of a 64-cell line as a bit mask (the cells of
// probe_positions: the raw 6-bit fields when distinct, else the slow path).
template <unsigned K>
[[gnu::always_inline]] inline std::uint64_t probe_mask64(std::uint64_t h, std::uint32_t k) {
  if (K != 0) k = K;
  std::uint64_t mask = 0;
#pragma GCC unroll 16
  for (std::uint32_t i = 0; i < k; ++i) mask |= std::uint64_t{1} << ((h >> (6 * i)) & 63);
  if (static_cast<std::uint32_t>(std::popcount(mask)) != k) [[unlikely]] {
    std::uint32_t pos[kMaxProbes];
    resolve_positions<64, K>(h, k, pos);
    mask = 0;
    for (std::uint32_t i = 0; i < k; ++i) mask |= std::uint64_t{1} << pos[i];
  }
  return mask;
}

// probe_once<8, K> without equal timers, on vectors, for either instruction
// set: the k positions are a 64-bit mask, `Line` reads the line into
// registers with the masks of its set and live cells (a few instructions for
// the whole line), and writes the clock's code into the probe cells in one
// go. Same outcome and the same bytes written as probe_once<8, K>. The run()
// functions below carry the instruction set's target; they cannot be
// always_inline (the run loop that calls them has the baseline target), so
// decide_batch_avx2/avx512 are flattened: everything they call is inlined
// into them, except move_clock and decide (noinline: cold, and large).
template <class Line, unsigned K>
[[gnu::always_inline]] inline Probe vector_probe(const auto& view, const Fingerprint& fp,
                                                 std::uint64_t inserted, std::uint32_t& filled) {
  const std::uint64_t want = probe_mask64<K>(fp.lo, view.k);
  const typename Line::Codes codes(view.live_lo, view.live_span);
  std::uint8_t* active = line_of(fp.hi, view, 0);
  const Line a(active, codes);
  if ((a.live & want) == want) return Probe::kDuplicate;
  for (std::uint32_t s = 1; s < view.count; ++s) {
    const Line other(line_of(fp.hi, view, s), codes);
    if ((other.live & want) == want) return Probe::kDuplicate;
  }
  if (inserted >= view.room) return Probe::kNeedSeal;
  a.write(active, want, view.now_code);
  filled = static_cast<std::uint32_t>(std::popcount(want & ~a.set));
  return Probe::kInserted;
}

// A line of 8-bit timers on AVX-512: one register; a masked store writes.
struct Avx512Line {
  struct Codes {
    __m512i lo, span;
    KDEDUP_AVX512_TARGET Codes(std::uint32_t l, std::uint32_t s)
        : lo(_mm512_set1_epi8(static_cast<char>(l))),
          span(_mm512_set1_epi8(static_cast<char>(s))) {}
  };
  __m512i x;
  std::uint64_t set;   // cells != 0
  std::uint64_t live;  // set cells whose code is in the live interval

  KDEDUP_AVX512_TARGET Avx512Line(const std::uint8_t* line, const Codes& c)
      : x(_mm512_load_si512(line)),
        set(_mm512_test_epi8_mask(x, x)),
        live(_mm512_cmple_epu8_mask(_mm512_sub_epi8(x, c.lo), c.span) & set) {}
  KDEDUP_AVX512_TARGET void write(std::uint8_t* line, std::uint64_t cells,
                                  std::uint32_t code) const {
    _mm512_mask_storeu_epi8(line, cells, _mm512_set1_epi8(static_cast<char>(code)));
  }
};

KDEDUP_AVX2_TARGET inline std::uint64_t movemask64(__m256i low, __m256i high) {
  return static_cast<std::uint32_t>(_mm256_movemask_epi8(low)) |
         std::uint64_t{static_cast<std::uint32_t>(_mm256_movemask_epi8(high))} << 32;
}

// All-ones in the byte lanes whose bit is set in `bits` (32 cells): each
// byte of `bits` is copied into 8 lanes and tested against one bit each.
KDEDUP_AVX2_TARGET inline __m256i byte_mask_avx2(std::uint32_t bits) {
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i select = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), spread);
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, select), select);
}

// A line of 8-bit timers on AVX2: two registers; written back whole, the
// probe cells blended in.
struct Avx2Line {
  struct Codes {
    __m256i lo, span;
    KDEDUP_AVX2_TARGET Codes(std::uint32_t l, std::uint32_t s)
        : lo(_mm256_set1_epi8(static_cast<char>(l))),
          span(_mm256_set1_epi8(static_cast<char>(s))) {}
  };
  __m256i x0, x1;
  std::uint64_t set;   // cells != 0
  std::uint64_t live;  // set cells whose code is in the live interval

  KDEDUP_AVX2_TARGET Avx2Line(const std::uint8_t* line, const Codes& c)
      : x0(_mm256_load_si256(reinterpret_cast<const __m256i*>(line))),
        x1(_mm256_load_si256(reinterpret_cast<const __m256i*>(line + 32))),
        set(~movemask64(_mm256_cmpeq_epi8(x0, _mm256_setzero_si256()),
                        _mm256_cmpeq_epi8(x1, _mm256_setzero_si256()))),
        live(movemask64(in_interval_avx2(x0, c.lo, c.span), in_interval_avx2(x1, c.lo, c.span)) &
             set) {}
  KDEDUP_AVX2_TARGET void write(std::uint8_t* line, std::uint64_t cells, std::uint32_t code) const {
    const __m256i v = _mm256_set1_epi8(static_cast<char>(code));
    const auto low = static_cast<std::uint32_t>(cells);
    const auto high = static_cast<std::uint32_t>(cells >> 32);
    _mm256_store_si256(reinterpret_cast<__m256i*>(line),
                       _mm256_blendv_epi8(x0, v, byte_mask_avx2(low)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(line + 32),
                       _mm256_blendv_epi8(x1, v, byte_mask_avx2(high)));
  }
};

template <unsigned K>
struct Avx512Probe {
  KDEDUP_AVX512_TARGET static inline Probe run(const auto& view, const Fingerprint& fp,
                                               std::uint64_t inserted, std::uint32_t& filled) {
    return vector_probe<Avx512Line, K>(view, fp, inserted, filled);
  }
};

template <unsigned K>
struct Avx2Probe {
  KDEDUP_AVX2_TARGET static inline Probe run(const auto& view, const Fingerprint& fp,
                                             std::uint64_t inserted, std::uint32_t& filled) {
    return vector_probe<Avx2Line, K>(view, fp, inserted, filled);
  }
};
#endif

}  // namespace

// noinline: kept out of the flattened vector batch loops (vector_probe).
template <unsigned Bits>
[[gnu::noinline]] Decision TimerFilter::decide(const Fingerprint& fp) {
  std::uint32_t filled = 0;
  Probe p = probe_once<Bits, 0>(view_, fp, 0, filled);
  if (p == Probe::kNeedSeal) {
    // The active is full: seal it and insert into a new one, or, when growth
    // was refused, into the same one up to its overfull limit (under a
    // memory budget); past that the identity is rejected until the next
    // tick: judged a duplicate, counted in the estimate (enter_overfull()).
    seal_and_grow();
    TickView v = view_;
    // Whatever room a new or reactivated sub-filter has, it takes this one.
    if (!overfull_) v.room = ~std::uint64_t{0};
    p = probe_once<Bits, 0>(v, fp, 0, filled);
    if (p == Probe::kNeedSeal) {
      ++rejected_;
      return Decision::kDuplicate;
    }
  }
  if (p == Probe::kDuplicate) return Decision::kDuplicate;
  commit_inserts(1, filled);
  return Decision::kDistinct;
}

Decision TimerFilter::test_and_insert(const Fingerprint& fp, Tick now) {
  if (now > clock_) move_clock(now);
  ++arrivals_;
  queries_->add(1);
  switch (config_.timer_bits) {
    case 4:
      return decide<4>(fp);
    case 8:
      return decide<8>(fp);
    default:
      return decide<16>(fp);
  }
}

template <unsigned Bits>
void TimerFilter::write(const Fingerprint& fp) {
  std::uint32_t filled = 0;
  if (write_once<Bits>(view_, fp, 0, filled) == Probe::kNeedSeal) {
    seal_and_grow();
    TickView v = view_;
    v.room = ~std::uint64_t{0};  // at the cap of sub-filters: into the same one anyway
    write_once<Bits>(v, fp, 0, filled);
  }
  commit_inserts(1, filled);
}

void TimerFilter::insert(const Fingerprint& fp, Tick now) {
  if (now > clock_) move_clock(now);
  switch (config_.timer_bits) {
    case 4:
      return write<4>(fp);
    case 8:
      return write<8>(fp);
    default:
      return write<16>(fp);
  }
}

template <unsigned Bits, class Prober>
[[gnu::always_inline]] inline void TimerFilter::run_batch(std::span<const Fingerprint> fps,
                                                          std::span<const Tick> ticks,
                                                          std::span<Decision> out) {
  // Prefetch the line each live sub-filter will read kPrefetchDistance
  // elements ahead; decisions are made strictly in order, so they equal the
  // one-by-one results (a sub-filter added mid-batch only misses a hint).
  // The work is split into runs of elements at one clock value (the common
  // case: many records per tick): the clock moves, the sub-filters change and
  // the insertion counters are booked only between runs, so inside a run
  // every constant lives in a local view and each element costs its probe
  // positions, k reads, and k writes when it is new.
  const std::size_t n = fps.size();
  for (std::size_t i = 0; i < std::min(n, kPrefetchDistance); ++i) {
    for (std::uint32_t s = 0; s < view_.count; ++s) {
      __builtin_prefetch(line_of(fps[i].hi, view_, s), 1, 3);
    }
  }
  const std::size_t prefetch_end = n > kPrefetchDistance ? n - kPrefetchDistance : 0;
  std::size_t i = 0;
  while (i < n) {
    if (ticks[i] > clock_) move_clock(ticks[i]);
    std::size_t end = i;
    while (end < n && ticks[end] <= clock_) ++end;
    const std::size_t from = i;
    i = view_.shrunk ? run_tick<Bits, Prober, TickView>(fps, out, i, end, prefetch_end)
                     : run_tick<Bits, Prober, UnshrunkView>(fps, out, i, end, prefetch_end);
    if (i < end) {
      // Stopped for a seal: this element goes through the one-by-one path,
      // which seals and inserts; the next run picks up the new view.
      out[i] = decide<Bits>(fps[i]);
      ++i;
    }
    // Queries at the tick they were made at (domain_bound()).
    arrivals_ += i - from;
    queries_->add(i - from);
  }
}

template <unsigned Bits, class Prober, class View>
[[gnu::always_inline]] inline std::size_t TimerFilter::run_tick(std::span<const Fingerprint> fps,
                                                                std::span<Decision> out,
                                                                std::size_t i, std::size_t end,
                                                                std::size_t prefetch_end) {
  View view;
  static_cast<TickView&>(view) = view_;
  std::uint64_t inserted = 0, filled = 0;
  // False when the active sub-filter must be sealed first (nothing done).
  auto decide_one = [&](std::size_t j) __attribute__((always_inline)) {
    std::uint32_t empty = 0;
    const Probe p = Prober::run(view, fps[j], inserted, empty);
    if (p == Probe::kNeedSeal) return false;
    out[j] = p == Probe::kDuplicate ? Decision::kDuplicate : Decision::kDistinct;
    inserted += p == Probe::kInserted;
    filled += empty;
    return true;
  };
  const std::size_t split = std::min(end, prefetch_end);
  bool stopped = false;
  for (; i < split; ++i) {
    const std::uint64_t hi = fps[i + kPrefetchDistance].hi;
    __builtin_prefetch(line_of(hi, view, 0), 1, 3);
    for (std::uint32_t s = 1; s < view.count; ++s) __builtin_prefetch(line_of(hi, view, s), 1, 3);
    if (!decide_one(i)) {
      stopped = true;
      break;
    }
  }
  if (!stopped) {
    for (; i < end; ++i) {
      if (!decide_one(i)) break;
    }
  }
  commit_inserts(inserted, filled);
  return i;
}

template <unsigned Bits, unsigned K>
void TimerFilter::decide_batch(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                               std::span<Decision> out) {
#if KDEDUP_TIMER_X86
  if constexpr (Bits == 8) {
    if (config_.equal_timers == 0) {
      switch (simd_in_use()) {
        case Simd::kAvx512:
          return decide_batch_avx512<K>(fps, ticks, out);
        case Simd::kAvx2:
          return decide_batch_avx2<K>(fps, ticks, out);
        case Simd::kPortable:
          break;
      }
    }
  }
#endif
  run_batch<Bits, PortableProbe<Bits, K>>(fps, ticks, out);
}

#if KDEDUP_TIMER_X86
template <unsigned K>
KDEDUP_AVX2_TARGET [[gnu::flatten]] void TimerFilter::decide_batch_avx2(
    std::span<const Fingerprint> fps, std::span<const Tick> ticks, std::span<Decision> out) {
  run_batch<8, Avx2Probe<K>>(fps, ticks, out);
}

template <unsigned K>
KDEDUP_AVX512_TARGET [[gnu::flatten]] void TimerFilter::decide_batch_avx512(
    std::span<const Fingerprint> fps, std::span<const Tick> ticks, std::span<Decision> out) {
  run_batch<8, Avx512Probe<K>>(fps, ticks, out);
}
#endif

template <unsigned Bits>
void TimerFilter::decide_batch_k(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                                 std::span<Decision> out) {
  // The k of the usual targets (fpp 1% .. 0.1%) get a loop unrolled for them.
  switch (k_) {
    case 5:
      return decide_batch<Bits, 5>(fps, ticks, out);
    case 6:
      return decide_batch<Bits, 6>(fps, ticks, out);
    case 7:
      return decide_batch<Bits, 7>(fps, ticks, out);
    case 8:
      return decide_batch<Bits, 8>(fps, ticks, out);
    default:
      return decide_batch<Bits, 0>(fps, ticks, out);
  }
}

void TimerFilter::test_and_insert_batch(std::span<const Fingerprint> fps,
                                        std::span<const Tick> ticks, std::span<Decision> out) {
  switch (config_.timer_bits) {
    case 4:
      return decide_batch_k<4>(fps, ticks, out);
    case 8:
      return decide_batch_k<8>(fps, ticks, out);
    default:
      return decide_batch_k<16>(fps, ticks, out);
  }
}

template <unsigned Bits>
double TimerFilter::cells_fpp(const SubFilter& s) const {
  // Evenly spaced hash lines (all of a small sub-filter; a shrunk one's
  // doubled lines are drawn as often as queries find them): for each, the
  // probability that k distinct cells drawn from its line are all alive.
  constexpr std::uint64_t kSampleLines = 256;
  const std::uint32_t cells = Cells<Bits>::kPerLine;
  const std::uint32_t now_code = static_cast<std::uint32_t>(clock_ % modulus_) + 1;
  const LiveInterval live = live_interval(now_code, config_.ticks_per_window, modulus_);
  const std::uint64_t sampled = std::min(s.span, kSampleLines);
  double sum = 0;
  for (std::uint64_t i = 0; i < sampled; ++i) {
    const std::uint8_t* line = s.line(s.held(i * s.span / sampled));
    std::uint32_t alive = 0;
    for (std::uint32_t c = 0; c < cells; ++c) {
      const std::uint32_t v = Cells<Bits>::get(line, c);
      alive += v != 0 && ((v - live.lo) & modulus_) <= live.span;
    }
    double p = 1.0;
    for (std::uint32_t j = 0; j < k_ && p > 0; ++j) {
      p *= alive > j ? static_cast<double>(alive - j) / static_cast<double>(cells - j) : 0.0;
    }
    sum += p;
  }
  return sampled != 0 ? sum / static_cast<double>(sampled) : 0.0;
}

double TimerFilter::reported_fpp(const SubFilter& s) const {
  // The model counts insertions as if they were independent of the cells.
  // Near saturation they are not: an identity is inserted only when one of
  // its cells was empty, so insertions fill the gaps and the cells fill
  // faster than the count says (family_bench's memory budget table, 4x
  // short: 0.97 of new identities judged duplicates where the model said
  // 0.79). From a model estimate of 5% on, the estimate is also read from
  // the cells, and the larger is reported (a few hundred lines: cheap, and
  // never on the record path).
  constexpr double kReadCellsFrom = 0.05;
  const double model = subfilter_fpp(s);
  if (model < kReadCellsFrom) return model;
  switch (config_.timer_bits) {
    case 4:
      return std::max(model, cells_fpp<4>(s));
    case 8:
      return std::max(model, cells_fpp<8>(s));
    default:
      return std::max(model, cells_fpp<16>(s));
  }
}

std::uint64_t TimerFilter::state_bytes() const {
  std::uint64_t bytes = 0;
  for (const auto& s : subs_) bytes += s->bytes() + s->alive.ring.size() * sizeof(std::uint32_t);
  return bytes;
}

FilterStats TimerFilter::stats() const {
  FilterStats st;
  st.bytes = state_bytes();
  st.bytes_peak = peak_with(st.bytes);
  double none = 1.0;
  for (const auto& s : subs_) {
    st.cells += s->lines * cells_per_line_;
    st.live_cells += s->nonempty;
    none *= 1.0 - reported_fpp(*s);
  }
  // New identities rejected for want of room are false positives too.
  const double rejected = arrival_rate_ > 0 ? std::min(1.0, rejected_rate_ / arrival_rate_) : 0.0;
  none *= 1.0 - rejected;
  st.subfilters = static_cast<std::uint32_t>(subs_.size());
  st.insertions = insertions_;
  st.fpp_estimate = 1.0 - none;
  return st;
}

std::vector<std::uint64_t> TimerFilter::subfilter_bytes() const {
  std::vector<std::uint64_t> out;
  for (const auto& s : subs_) out.push_back(s->bytes());
  return out;
}

}  // namespace kdedup::filter
