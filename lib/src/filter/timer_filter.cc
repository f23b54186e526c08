// Timer filter: wrapping insertion-tick timers in cache-line blocks, scrubbed
// in the background, grown and shrunk by sub-filters (seed 000 §4–5). The
// reasoning behind every constant is in timer_filter.h.

#include "kdedup/filter/timer_filter.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "kdedup/common/bytes.h"
#include "kdedup/filter/config_codec.h"

namespace kdedup::filter {
namespace {

constexpr std::uint16_t kVersion = 1;
constexpr std::uint64_t kLineBytes = 64;
constexpr std::uint64_t kScrubPrefetchLines = 8;

__extension__ typedef unsigned __int128 u128;

std::uint64_t mulhi(std::uint64_t a, std::uint64_t b) {
  return static_cast<std::uint64_t>((static_cast<u128>(a) * b) >> 64);
}

constexpr unsigned log2_of(std::uint32_t v) {
  unsigned r = 0;
  while ((1U << r) < v) ++r;
  return r;
}

// Zeroed, line-aligned cell memory. Large arrays are 2 MiB aligned and asked
// to use transparent huge pages: every operation touches a random line, and
// with 4 KiB pages nearly every one would also miss the TLB.
std::uint8_t* allocate_cells(std::uint64_t bytes) {
  constexpr std::uint64_t kHuge = 2ULL << 20;
  const bool huge = bytes >= kHuge;
  const std::uint64_t align = huge ? kHuge : kLineBytes;
  const std::uint64_t rounded = (bytes + align - 1) / align * align;
  auto* p = static_cast<std::uint8_t*>(std::aligned_alloc(align, rounded));
  if (p == nullptr) return nullptr;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (huge) (void)madvise(p, rounded, MADV_HUGEPAGE);  // a hint; failure is harmless
#endif
  std::memset(p, 0, bytes);
  return p;
}

// Non-empty cells in `bytes` of cell memory (straight loops that vectorise).
std::uint64_t count_nonempty(const std::uint8_t* data, std::uint64_t bytes, unsigned bits) {
  std::uint64_t n = 0;
  if (bits == 4) {
    for (std::uint64_t i = 0; i < bytes; ++i) n += ((data[i] & 0xF) != 0) + ((data[i] >> 4) != 0);
  } else if (bits == 8) {
    for (std::uint64_t i = 0; i < bytes; ++i) n += data[i] != 0;
  } else {
    const auto* cells = reinterpret_cast<const std::uint16_t*>(data);
    for (std::uint64_t i = 0; i < bytes / 2; ++i) n += cells[i] != 0;
  }
  return n;
}

// Cell access inside one 64-byte line for b-bit timers.
template <unsigned Bits>
struct Cells;

template <>
struct Cells<4> {
  static constexpr std::uint32_t kPerLine = 128;
  static std::uint32_t get(const std::uint8_t* line, std::uint32_t j) {
    return (line[j >> 1] >> ((j & 1) * 4)) & 0xF;
  }
  static void set(std::uint8_t* line, std::uint32_t j, std::uint32_t v) {
    const unsigned shift = (j & 1) * 4;
    line[j >> 1] = static_cast<std::uint8_t>((line[j >> 1] & ~(0xF << shift)) | (v << shift));
  }
};

template <>
struct Cells<8> {
  static constexpr std::uint32_t kPerLine = 64;
  static std::uint32_t get(const std::uint8_t* line, std::uint32_t j) { return line[j]; }
  static void set(std::uint8_t* line, std::uint32_t j, std::uint32_t v) {
    line[j] = static_cast<std::uint8_t>(v);
  }
};

template <>
struct Cells<16> {
  static constexpr std::uint32_t kPerLine = 32;
  static std::uint32_t get(const std::uint8_t* line, std::uint32_t j) {
    return reinterpret_cast<const std::uint16_t*>(line)[j];
  }
  static void set(std::uint8_t* line, std::uint32_t j, std::uint32_t v) {
    reinterpret_cast<std::uint16_t*>(line)[j] = static_cast<std::uint16_t>(v);
  }
};

// k distinct positions in a line of `cells` cells from the low fingerprint
// half: log2(cells) bits each, a taken position moves to the next free cell.
template <std::uint32_t kCells>
void probe_positions(std::uint64_t h, std::uint32_t k, std::uint32_t* out) {
  constexpr unsigned kBits = log2_of(kCells);
  constexpr unsigned kWords = kCells > 64 ? 2 : 1;
  std::uint64_t used[kWords] = {};
  for (std::uint32_t i = 0; i < k; ++i) {
    std::uint32_t p = static_cast<std::uint32_t>(h & (kCells - 1));
    h >>= kBits;
    while ((used[p >> 6] >> (p & 63)) & 1) p = (p + 1) & (kCells - 1);
    used[p >> 6] |= 1ULL << (p & 63);
    out[i] = p;
  }
}

// Clears the cells of one line whose code is outside the live interval
// [lo, hi] (cyclic when `wrap`); empty cells stay empty. Written branch-free
// over a fixed count so the compiler vectorises it. Returns cells cleared.
template <class T, int N>
std::uint32_t scrub_cells(T* cells, std::uint32_t lo, std::uint32_t hi, bool wrap) {
  const T l = static_cast<T>(lo), h = static_cast<T>(hi);
  // Decide first, write only if something expired: most visits find nothing
  // to clear, and an unconditional store would dirty (and later write back)
  // every line the scrub passes.
  T keep[N];
  std::uint32_t cleared = 0;
  if (wrap) {
    for (int j = 0; j < N; ++j) {
      const T v = cells[j];
      const bool k = (v >= l) | (v <= h);  // 0 <= h: empty cells are kept
      keep[j] = k ? T(~T{0}) : T{0};
      cleared += !k;
    }
  } else {
    for (int j = 0; j < N; ++j) {
      const T v = cells[j];
      const bool k = (v == 0) | ((v >= l) & (v <= h));
      keep[j] = k ? T(~T{0}) : T{0};
      cleared += !k;
    }
  }
  if (cleared != 0) {
    for (int j = 0; j < N; ++j) cells[j] = static_cast<T>(cells[j] & keep[j]);
  }
  return cleared;
}

// Clears the expired cells of one 64-byte line of b-bit cells (live codes:
// [lo, hi], cyclic when `wrap`). Returns cells cleared.
template <unsigned Bits>
std::uint32_t scrub_line(std::uint8_t* line, std::uint32_t lo, std::uint32_t hi, bool wrap) {
  if constexpr (Bits == 4) {
    std::uint8_t low[64], high[64];
    for (int j = 0; j < 64; ++j) {
      low[j] = line[j] & 0xF;
      high[j] = static_cast<std::uint8_t>(line[j] >> 4);
    }
    const std::uint32_t cleared = scrub_cells<std::uint8_t, 64>(low, lo, hi, wrap) +
                                  scrub_cells<std::uint8_t, 64>(high, lo, hi, wrap);
    if (cleared != 0) {
      for (int j = 0; j < 64; ++j) line[j] = static_cast<std::uint8_t>(low[j] | (high[j] << 4));
    }
    return cleared;
  } else if constexpr (Bits == 8) {
    return scrub_cells<std::uint8_t, 64>(line, lo, hi, wrap);
  } else {
    return scrub_cells<std::uint16_t, 32>(reinterpret_cast<std::uint16_t*>(line), lo, hi, wrap);
  }
}

}  // namespace

// Insertions per tick over the last W + 1 ticks, in buckets of `width` ticks
// (width > 1 only for very long windows; the partly expired oldest bucket is
// still counted, which only overestimates the load).
struct WindowCount {
  std::uint64_t width = 1;
  std::vector<std::uint32_t> ring;
  std::uint64_t first = 0;  // absolute bucket index of ring's oldest bucket
  std::uint64_t sum = 0;
  std::size_t current = 0;  // ring slot of the clock's bucket

  void init(std::uint32_t window) {
    width = std::max<std::uint64_t>(1, (std::uint64_t{window} + 1 + 1023) / 1024);
    ring.assign(window / width + 2, 0);
    first = 0;
    sum = 0;
  }
  void advance(Tick now, std::uint32_t window) {
    current = (now / width) % ring.size();
    const std::uint64_t next = now >= window ? (now - window) / width : 0;
    if (next <= first) return;
    if (next - first >= ring.size()) {
      std::fill(ring.begin(), ring.end(), 0);
      sum = 0;
    } else {
      for (std::uint64_t b = first; b < next; ++b) {
        sum -= ring[b % ring.size()];
        ring[b % ring.size()] = 0;
      }
    }
    first = next;
  }
  /// Counts one insertion at the tick of the last advance().
  void add() {
    ++ring[current];
    ++sum;
  }
};

struct TimerFilter::SubFilter {
  struct Free {
    void operator()(std::uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<std::uint8_t[], Free> data;
  std::uint64_t lines = 0;
  Tick created = 0;            // start of the scrub schedule
  std::uint64_t swept = 0;     // lines visited since `created`
  std::uint64_t cursor = 0;    // swept % lines: the next line to visit
  std::uint64_t ahead = 0;     // required(clock + 1): cap for per-insert scrub
  Tick last_insert = 0;        // newest insertion (== created before any)
  std::uint64_t inserts = 0;   // since creation (Growth::kCardinality)
  std::uint64_t nonempty = 0;  // cells != 0
  WindowCount alive;           // insertions in the window

  std::uint8_t* line(std::uint64_t i) const { return data.get() + i * kLineBytes; }
  std::uint64_t bytes() const { return lines * kLineBytes; }

  static std::unique_ptr<SubFilter> make(std::uint64_t lines, Tick now, std::uint32_t window) {
    auto s = std::make_unique<SubFilter>();
    s->data.reset(allocate_cells(lines * kLineBytes));
    if (!s->data) return nullptr;
    s->lines = lines;
    s->created = now;
    s->last_insert = now;
    s->alive.init(window);
    s->alive.advance(now, window);
    return s;
  }

  // Lines the schedule requires by clock c: floor((c - created) * lines / P).
  std::uint64_t required(Tick c, std::uint32_t period) const {
    if (c <= created) return 0;
    const u128 r = static_cast<u128>(c - created) * lines / period;
    return r > ~std::uint64_t{0} ? ~std::uint64_t{0} : static_cast<std::uint64_t>(r);
  }
};

TimerFilter::TimerFilter(const FilterConfig& config) : config_(config) {}
TimerFilter::~TimerFilter() = default;

Result<std::unique_ptr<TimerFilter>> TimerFilter::create(const FilterConfig& config) {
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
  f->refresh_codes();
  const std::uint32_t max_k = 64 / log2_of(f->cells_per_line_);
  const auto layout = sizing::choose_layout(f->cells_per_line_, kBudgetShare * config.fpp, max_k);
  if (layout.k == 0 || !(layout.elements_per_block > 0)) {
    return fail("timer filter: no layout reaches fpp " + std::to_string(config.fpp));
  }
  f->k_ = layout.k;
  f->lambda_full_ = layout.elements_per_block;
  f->model_ = sizing::BlockedModel::get(f->cells_per_line_, f->k_);
  if (config.equal_timers > f->k_) {
    return fail("equal_timers (" + std::to_string(config.equal_timers) +
                ") must not exceed the number of probes k = " + std::to_string(f->k_) +
                " chosen for fpp " + std::to_string(config.fpp));
  }
  const std::uint64_t lines = f->initial_bytes() / kLineBytes;
  auto sub = SubFilter::make(lines, 0, config.ticks_per_window);
  if (!sub) return fail("timer filter: cannot allocate " + std::to_string(lines * 64) + " bytes");
  sub->ahead = sub->required(1, f->period_);
  f->subs_.push_back(std::move(sub));
  f->refresh_threshold();
  return f;
}

std::uint64_t TimerFilter::initial_bytes() const noexcept {
  const double lines = std::ceil(static_cast<double>(config_.capacity) / lambda_full_);
  const double max_lines = static_cast<double>(std::max<std::uint64_t>(1, config_.max_bytes / 64));
  return static_cast<std::uint64_t>(std::clamp(lines, 1.0, max_lines)) * kLineBytes;
}

std::uint64_t TimerFilter::lines_for(double elements, double lambda) const {
  const double min_lines = std::max(1.0, static_cast<double>(config_.min_bytes / kLineBytes));
  const double max_lines = std::max(min_lines, static_cast<double>(config_.max_bytes / kLineBytes));
  const double lines = lambda > 0 ? std::ceil(elements / lambda) : max_lines;
  return static_cast<std::uint64_t>(std::clamp(lines, min_lines, max_lines));
}

double TimerFilter::subfilter_fpp(const SubFilter& s) const {
  return model_->fpp(static_cast<double>(s.alive.sum) / static_cast<double>(s.lines));
}

std::uint64_t TimerFilter::alive_total() const {
  std::uint64_t n = 0;
  for (const auto& s : subs_) n += s->alive.sum;
  return n;
}

double TimerFilter::fpp_budget_used() const {
  double sum = 0;
  for (const auto& s : subs_) sum += subfilter_fpp(*s);
  return sum;
}

void TimerFilter::refresh_threshold() {
  const SubFilter& active = *subs_.back();
  double lambda = lambda_full_;
  if (subs_.size() > 1) {
    double sealed = 0;
    for (std::size_t i = 0; i + 1 < subs_.size(); ++i) sealed += subfilter_fpp(*subs_[i]);
    const double budget = kBudgetShare * (config_.fpp - sealed);
    lambda = budget > 0 ? model_->lambda_for(budget) : 0.0;
  }
  active_limit_ = static_cast<std::uint64_t>(lambda * static_cast<double>(active.lines));
}

void TimerFilter::scrub_lines(SubFilter& s, std::uint64_t count, Tick ref,
                              std::uint64_t extra_age) {
  // A cell's true age is ((code(ref) - code) mod M) + extra_age: exact as long
  // as no cell had aliased at `ref` (the scrub invariant).
  const std::uint32_t m = modulus_;
  const std::uint32_t ref_code = static_cast<std::uint32_t>(ref % m) + 1;
  const std::uint64_t window = config_.ticks_per_window;
  if (extra_age > window) {
    // Everything visited is dead (move_clock clears the whole filter instead,
    // but the scrub stays correct on its own).
    std::uint64_t i = s.cursor;
    for (std::uint64_t n = 0; n < count; ++n, i = i + 1 == s.lines ? 0 : i + 1) {
      s.nonempty -= count_nonempty(s.line(i), kLineBytes, config_.timer_bits);
      std::memset(s.line(i), 0, kLineBytes);
    }
    s.swept += count;
    s.cursor = i;
    return;
  }
  // Cells kept are the empty ones and those whose code lies in the cyclic
  // interval of ages 0 .. W - extra_age ending at code(ref): [lo, ref_code],
  // wrapping past M back to 1 when lo would be below 1.
  const std::uint32_t max_diff = static_cast<std::uint32_t>(window - extra_age);
  std::int64_t lo = static_cast<std::int64_t>(ref_code) - max_diff;
  const bool wrap = lo < 1;
  if (wrap) lo += m;
  std::uint64_t i = s.cursor;
  for (std::uint64_t n = 0; n < count; ++n, i = i + 1 == s.lines ? 0 : i + 1) {
    std::uint8_t* line = s.line(i);
    const auto l = static_cast<std::uint32_t>(lo);
    switch (config_.timer_bits) {
      case 4:
        s.nonempty -= scrub_line<4>(line, l, ref_code, wrap);
        break;
      case 8:
        s.nonempty -= scrub_line<8>(line, l, ref_code, wrap);
        break;
      default:
        s.nonempty -= scrub_line<16>(line, l, ref_code, wrap);
        break;
    }
  }
  s.swept += count;
  s.cursor = i;
}

void TimerFilter::catch_up(SubFilter& s, Tick old_clock, Tick now) {
  const std::uint64_t need = s.required(now, period_);
  if (need > s.swept) {
    const std::uint64_t todo = need - s.swept;
    if (todo >= s.lines) {
      scrub_lines(s, s.lines, old_clock, now - old_clock);
      s.swept = need;
      s.cursor = need % s.lines;
    } else {
      scrub_lines(s, todo, old_clock, now - old_clock);
    }
  }
  s.ahead = s.required(now + 1, period_);
}

void TimerFilter::clear_all(Tick now) {
  // Every entry was inserted at or before the old clock, more than W ago.
  SubFilter& active = *subs_.back();
  std::memset(active.data.get(), 0, active.bytes());
  active.nonempty = 0;
  active.swept = 0;
  active.cursor = 0;
  active.created = now;
  active.ahead = active.required(now + 1, period_);
  active.inserts = 0;
  active.alive.init(config_.ticks_per_window);
  active.alive.advance(now, config_.ticks_per_window);
  std::unique_ptr<SubFilter> keep = std::move(subs_.back());
  subs_.clear();
  subs_.push_back(std::move(keep));
}

void TimerFilter::move_clock(Tick now) {
  const Tick old = clock_;
  const std::uint32_t window = config_.ticks_per_window;
  if (now - old > window) {
    clear_all(now);
    clock_ = now;
    refresh_codes();
  } else {
    for (auto& s : subs_) catch_up(*s, old, now);
    clock_ = now;
    refresh_codes();
    for (auto& s : subs_) s->alive.advance(now, window);
    // Free sealed sub-filters whose newest insertion left the window.
    const SubFilter* active = subs_.back().get();
    std::erase_if(subs_, [&](const std::unique_ptr<SubFilter>& s) {
      return s.get() != active && (s->inserts == 0 || now - s->last_insert > window);
    });
  }
  maybe_shrink();
  refresh_threshold();
}

void TimerFilter::refresh_codes() {
  // The insert path needs these for every operation; a division per op (the
  // modulus is a runtime value) cost more than the rest of the age test.
  now_code_ = static_cast<std::uint32_t>(clock_ % modulus_) + 1;
  const std::int64_t lo = static_cast<std::int64_t>(now_code_) - config_.ticks_per_window;
  live_wrap_ = lo < 1;
  live_lo_ = static_cast<std::uint32_t>(live_wrap_ ? lo + modulus_ : lo);
}

void TimerFilter::advance(Tick now) {
  if (now > clock_) move_clock(now);
}

void TimerFilter::maybe_shrink() {
  if (subs_.size() != 1) return;
  const SubFilter& active = *subs_.back();
  if (clock_ - active.created <= config_.ticks_per_window) return;
  const double want = kGrowthHeadroom * static_cast<double>(alive_total());
  const std::uint64_t lines = lines_for(want, lambda_full_);  // runs every tick: no solve
  if (static_cast<double>(active.lines) > kShrinkFactor * static_cast<double>(lines)) {
    seal_and_grow(want);
  }
}

double TimerFilter::growth_target() const {
  // Rate extrapolation: the insertions of the last span, scaled to a window.
  // Over a short span it can be wildly off (a burst inside the first tick of
  // a long window would be multiplied by W + 1), so it is trusted only once
  // the span covers kRateSpanShare of the window; before that, and as a cap
  // at all times, growth is geometric as in scalable Bloom filters: at most
  // kMaxGrowthStep times what the sealed active sub-filter holds.
  const SubFilter& active = *subs_.back();
  const std::uint32_t window = config_.ticks_per_window;
  const std::uint64_t held =
      config_.growth == Growth::kCardinality ? active.inserts : active.alive.sum;
  const double geometric = kMaxGrowthStep * static_cast<double>(std::max<std::uint64_t>(1, held));
  const Tick span_ticks = std::min<Tick>(window + 1, clock_ - first_tick_ + 1);
  if (insertions_ == 0 ||
      static_cast<double>(span_ticks) < kRateSpanShare * static_cast<double>(window + 1)) {
    return geometric;
  }
  const double rate = static_cast<double>(alive_total()) / static_cast<double>(span_ticks);
  return std::min(geometric, kGrowthHeadroom * rate * (window + 1));
}

void TimerFilter::seal_and_grow(double want) {
  if (subs_.size() >= kMaxSubfilters) return;
  const std::uint32_t window = config_.ticks_per_window;
  if (want <= 0) want = growth_target();
  want = std::max(1.0, want);
  const double budget = kBudgetShare * (config_.fpp - fpp_budget_used());
  const std::uint64_t lines =
      lines_for(want, model_->lambda_for(budget > 0 ? budget : kBudgetShare * config_.fpp * 1e-3));
  auto sub = SubFilter::make(lines, clock_, window);
  if (!sub) return;  // out of memory: keep using the active one
  sub->ahead = sub->required(clock_ + 1, period_);
  subs_.push_back(std::move(sub));
  refresh_threshold();
}

template <unsigned Bits>
Decision TimerFilter::decide(const Fingerprint& fp) {
  using C = Cells<Bits>;
  std::uint32_t pos[16];
  probe_positions<C::kPerLine>(fp.lo, k_, pos);
  const std::uint32_t m = modulus_;
  const std::uint32_t now_code = now_code_;
  const std::uint32_t window = config_.ticks_per_window;
  const std::uint32_t equal = config_.equal_timers;
  for (auto it = subs_.rbegin(); it != subs_.rend(); ++it) {
    const SubFilter& s = **it;
    const std::uint8_t* line = s.line(mulhi(fp.hi, s.lines));
    std::uint32_t codes[16];
    bool all_alive = true;
    for (std::uint32_t i = 0; i < k_; ++i) {
      const std::uint32_t v = C::get(line, pos[i]);
      std::int32_t diff = static_cast<std::int32_t>(now_code) - static_cast<std::int32_t>(v);
      if (diff < 0) diff += static_cast<std::int32_t>(m);
      all_alive &= (v != 0) & (static_cast<std::uint32_t>(diff) <= window);
      codes[i] = v;
    }
    if (!all_alive) continue;
    if (equal == 0) return Decision::kDuplicate;
    // Equal-timers heuristic (seed 000 §4): at least k' timers set together.
    std::uint32_t best = 0;
    for (std::uint32_t i = 0; i < k_ && best < equal; ++i) {
      std::uint32_t same = 0;
      for (std::uint32_t j = 0; j < k_; ++j) same += codes[j] == codes[i];
      best = std::max(best, same);
    }
    if (best >= equal) return Decision::kDuplicate;
  }
  // Distinct: insert into the active sub-filter (first-test-then-set).
  if (subs_.back()->alive.sum + 1 > active_limit_ ||
      (config_.growth == Growth::kCardinality && subs_.back()->inserts + 1 > active_limit_)) {
    seal_and_grow();
  }
  SubFilter& a = *subs_.back();
  std::uint8_t* line = a.line(mulhi(fp.hi, a.lines));
  for (std::uint32_t i = 0; i < k_; ++i) {
    a.nonempty += C::get(line, pos[i]) == 0;
    C::set(line, pos[i], now_code);
  }
  a.alive.add();
  ++a.inserts;
  a.last_insert = clock_;
  if (insertions_++ == 0) first_tick_ = clock_;
  // Background scrub, one line ahead of schedule per insert.
  if (a.swept < a.ahead) {
    // The scrub walks lines in order, one per insert: fetch a few ahead so
    // its reads overlap with the random ones instead of waiting on memory.
    std::uint64_t ahead = a.cursor + kScrubPrefetchLines;
    if (ahead >= a.lines) ahead %= a.lines;
    __builtin_prefetch(a.line(ahead), 1, 0);
    a.nonempty -= scrub_line<Bits>(a.line(a.cursor), live_lo_, now_code_, live_wrap_);
    ++a.swept;
    a.cursor = a.cursor + 1 == a.lines ? 0 : a.cursor + 1;
  }
  return Decision::kDistinct;
}

Decision TimerFilter::test_and_insert(const Fingerprint& fp, Tick now) {
  if (now > clock_) move_clock(now);
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
void TimerFilter::decide_batch(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                               std::span<Decision> out) {
  // Prefetch the line each live sub-filter will read kPrefetchDistance
  // elements ahead; decisions are made strictly in order, so they equal the
  // one-by-one results (a sub-filter added mid-batch only misses a hint).
  const std::size_t n = fps.size();
  const std::size_t head = std::min(n, kPrefetchDistance);
  for (std::size_t i = 0; i < head; ++i) {
    for (const auto& s : subs_) __builtin_prefetch(s->line(mulhi(fps[i].hi, s->lines)), 1, 3);
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (i + kPrefetchDistance < n) {
      const std::uint64_t hi = fps[i + kPrefetchDistance].hi;
      for (const auto& s : subs_) __builtin_prefetch(s->line(mulhi(hi, s->lines)), 1, 3);
    }
    if (ticks[i] > clock_) move_clock(ticks[i]);
    out[i] = decide<Bits>(fps[i]);
  }
}

void TimerFilter::test_and_insert_batch(std::span<const Fingerprint> fps,
                                        std::span<const Tick> ticks, std::span<Decision> out) {
  switch (config_.timer_bits) {
    case 4:
      return decide_batch<4>(fps, ticks, out);
    case 8:
      return decide_batch<8>(fps, ticks, out);
    default:
      return decide_batch<16>(fps, ticks, out);
  }
}

FilterStats TimerFilter::stats() const {
  FilterStats st;
  double none = 1.0;
  for (const auto& s : subs_) {
    st.bytes += s->bytes() + s->alive.ring.size() * sizeof(std::uint32_t);
    st.cells += s->lines * cells_per_line_;
    st.live_cells += s->nonempty;
    none *= 1.0 - subfilter_fpp(*s);
  }
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

std::string TimerFilter::serialize() const {
  // The payload is written once, after room for the envelope header, into a
  // buffer reserved at its final size: the cell arrays (nearly all the bytes,
  // up to max_bytes per sub-filter) are copied exactly once and never moved.
  std::uint64_t tail = 0;
  for (const auto& s : subs_) {
    tail += 7 * sizeof(std::uint64_t) + sizeof(std::uint32_t) +
            s->alive.ring.size() * sizeof(std::uint32_t) + s->bytes();
  }
  std::string out(kEnvelopeHeaderBytes, '\0');
  ByteWriter w(out);
  write_config(w, config_);
  w.put<std::uint32_t>(k_);
  w.put<Tick>(clock_);
  w.put<Tick>(first_tick_);
  w.put<std::uint64_t>(insertions_);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(subs_.size()));
  out.reserve(out.size() + tail + kEnvelopeTrailerBytes);
  for (const auto& s : subs_) {
    w.put<std::uint64_t>(s->lines);
    w.put<Tick>(s->created);
    w.put<std::uint64_t>(s->swept);
    w.put<Tick>(s->last_insert);
    w.put<std::uint64_t>(s->inserts);
    w.put<std::uint64_t>(s->nonempty);
    w.put<std::uint64_t>(s->alive.first);
    w.put<std::uint32_t>(static_cast<std::uint32_t>(s->alive.ring.size()));
    for (std::uint32_t c : s->alive.ring) w.put<std::uint32_t>(c);
    w.put_bytes(std::string_view(reinterpret_cast<const char*>(s->data.get()), s->bytes()));
  }
  return seal_envelope_in_place(static_cast<std::uint16_t>(FilterType::kTimer), kVersion,
                                std::move(out));
}

Result<std::unique_ptr<SlidingFilter>> TimerFilter::restore(std::string_view payload,
                                                            std::uint16_t version) {
  auto bad = [](const std::string& what) { return fail("timer filter state: " + what); };
  if (version != kVersion) return bad("unsupported format version " + std::to_string(version));
  ByteReader r(payload);
  auto config = read_config(r);
  if (!config) return tl::unexpected(config.error());
  if (config->type != FilterType::kTimer) return bad("wrong filter type in config");
  auto k = r.get<std::uint32_t>("k");
  auto clock = r.get<Tick>("clock");
  auto first_tick = r.get<Tick>("first tick");
  auto insertions = r.get<std::uint64_t>("insertions");
  auto count = r.get<std::uint32_t>("sub-filter count");
  if (!k || !clock || !first_tick || !insertions || !count) return bad("truncated header");
  if (*count == 0 || *count > kMaxSubfilters) {
    return bad("sub-filter count " + std::to_string(*count) + " out of range");
  }
  if (*first_tick > *clock) return bad("first tick after clock");
  // Rebuild the empty shell from the config, then check the derived fields.
  FilterConfig small = *config;
  small.capacity = 1;  // the real sub-filters come from the input
  auto made = create(small);
  if (!made) return bad(made.error().message);
  std::unique_ptr<TimerFilter> f = std::move(*made);
  f->config_ = *config;
  if (*k != f->k_) return bad("k " + std::to_string(*k) + " does not match the config");
  f->subs_.clear();
  f->clock_ = *clock;
  f->refresh_codes();
  f->first_tick_ = *first_tick;
  f->insertions_ = *insertions;
  const std::uint32_t window = config->ticks_per_window;
  for (std::uint32_t i = 0; i < *count; ++i) {
    auto lines = r.get<std::uint64_t>("lines");
    auto created = r.get<Tick>("created");
    auto swept = r.get<std::uint64_t>("swept");
    auto last_insert = r.get<Tick>("last insert");
    auto inserts = r.get<std::uint64_t>("inserts");
    auto nonempty = r.get<std::uint64_t>("nonempty");
    auto first = r.get<std::uint64_t>("window first bucket");
    auto ring_size = r.get<std::uint32_t>("window ring size");
    if (!lines || !created || !swept || !last_insert || !inserts || !nonempty || !first ||
        !ring_size) {
      return bad("truncated sub-filter header");
    }
    if (*lines == 0 || *lines > r.remaining() / kLineBytes) {
      return bad("sub-filter size exceeds input");
    }
    if (*created > *clock || *last_insert > *clock || *last_insert < *created) {
      return bad("sub-filter ticks inconsistent with the clock");
    }
    if (*nonempty > *lines * f->cells_per_line_) return bad("live cell count exceeds cells");
    auto s = std::make_unique<SubFilter>();
    s->alive.init(window);
    if (*ring_size != s->alive.ring.size()) return bad("window ring size does not match config");
    if (*ring_size > r.remaining() / 4) return bad("window ring exceeds input");
    std::uint64_t sum = 0;
    for (auto& c : s->alive.ring) {
      c = *r.get<std::uint32_t>("window ring");
      sum += c;
    }
    if (sum > *inserts) return bad("window count exceeds insertions");
    const std::uint64_t expect_first = *clock >= window ? (*clock - window) / s->alive.width : 0;
    if (*first != expect_first) return bad("window ring position does not match the clock");
    s->alive.first = *first;
    s->alive.sum = sum;
    s->alive.current = (*clock / s->alive.width) % s->alive.ring.size();
    auto cells = r.get_bytes(*lines * kLineBytes, "cells");
    if (!cells) return bad("truncated cells");
    s->data.reset(allocate_cells(*lines * kLineBytes));
    if (!s->data) return bad("cannot allocate " + std::to_string(*lines * kLineBytes) + " bytes");
    std::memcpy(s->data.get(), cells->data(), cells->size());
    s->lines = *lines;
    s->created = *created;
    s->swept = *swept;
    s->cursor = *swept % *lines;
    s->last_insert = *last_insert;
    s->inserts = *inserts;
    s->nonempty = *nonempty;
    s->ahead = s->required(*clock + 1, f->period_);
    // The live-cell count must match the cells (a cheap full consistency check).
    const std::uint64_t counted = count_nonempty(s->data.get(), s->bytes(), config->timer_bits);
    if (counted != s->nonempty) return bad("live cell count does not match the cells");
    if (s->swept < s->required(*clock, f->period_) ||
        s->swept > s->required(*clock + 1, f->period_)) {
      return bad("scrub position inconsistent with the clock");
    }
    f->subs_.push_back(std::move(s));
  }
  if (auto end = r.expect_end("timer filter state"); !end) return tl::unexpected(end.error());
  f->refresh_threshold();
  return std::unique_ptr<SlidingFilter>(std::move(f));
}

}  // namespace kdedup::filter
