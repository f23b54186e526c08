// Compact filter: how many tables of which size and shape, and the memory
// budget ("Memory follows load" and "Memory budget" in compact_filter.h).

#include <algorithm>
#include <cmath>
#include <optional>

#include "compact_table.h"
#include "kdedup/filter/compact_filter.h"

namespace kdedup::filter {

using compact::Layout;
using compact::Shape;

// --- sizing ------------------------------------------------------------------------

namespace {

/// `lines` as a multiple of kLineGrain, at most `most`.
std::uint64_t grained(std::uint64_t lines, std::uint64_t most) noexcept {
  constexpr std::uint64_t kLineGrain = CompactFilter::kLineGrain;
  // A fold by f needs f to divide the line count (fold()): a table of an
  // odd count cannot fold at all, and at a burst's end it was replaced
  // instead, two tables held for a window where a fold keeps one (whether
  // a count was odd was a coin toss of the rate it was sized for). Counts
  // that are multiples of kLineGrain fold by 2, 4, 8 and 16, for at most
  // kLineGrain - 1 lines more. Rounded down when rounding up would pass
  // `most`, and left as they are below one grain.
  if (lines < kLineGrain) return lines;
  const std::uint64_t up = (lines + kLineGrain - 1) / kLineGrain * kLineGrain;
  return up <= most ? up : lines / kLineGrain * kLineGrain;
}

}  // namespace

std::uint64_t CompactFilter::floor_lines() const noexcept {
  return std::max<std::uint64_t>(2, config_.min_bytes / compact::kLineBytes);
}

double CompactFilter::target_load(const Shape& s) const noexcept {
  // kTargetLoad, less for lines of few slots or long windows (safe_load()):
  // two choices then miss often enough to fill the overflow list.
  return std::min(kTargetLoad, compact::safe_load(s.S, config_.ticks_per_window));
}

std::uint64_t CompactFilter::lines_for(double entries, const Shape& s,
                                       bool bounded) const noexcept {
  // Lines for `entries` at target_load() (within min_bytes / max_bytes when
  // `bounded`), rounded up to a multiple of kLineGrain.
  const double want = std::ceil(std::max(1.0, entries) / (target_load(s) * s.S));
  const double most = std::max(2.0, std::floor(static_cast<double>(config_.max_bytes) /
                                               static_cast<double>(compact::kLineBytes)));
  if (bounded && want <= static_cast<double>(floor_lines())) return floor_lines();
  return grained(static_cast<std::uint64_t>(std::clamp(want, 2.0, most)),
                 static_cast<std::uint64_t>(most));
}

std::uint64_t CompactFilter::initial_lines() const noexcept {
  // The floor, whatever the hint: a first table smaller than the floor
  // fills within its first tick and holds most of the fpp budget while the
  // rate-sized table that follows it fills, which then needs wider
  // remainders and is replaced once alone (two tables held for a window:
  // 2.15x the pre-sized bits per identity with the hint 10x too small).
  return floor_lines();
}

std::uint64_t CompactFilter::initial_bytes() const noexcept {
  return initial_lines() * compact::kLineBytes;
}

std::uint64_t CompactFilter::new_table_bytes(double entries) const noexcept {
  return lines_for(entries, base_, true) * compact::kLineBytes;
}

std::unique_ptr<CompactFilter::Table> CompactFilter::charged_table(std::uint64_t lines,
                                                                   const Shape& s) {
  auto t = make_table(lines, s, clock_);
  if (t && budget_) {
    budget_->charge(t->bytes());
    t->charge = MemoryCharge(budget_, t->bytes());
  }
  return t;
}

double CompactFilter::table_fpp(const Table& t) const {
  return compact::fpp_at(static_cast<double>(t.alive.sum) / static_cast<double>(t.slots()),
                         t.layout.shape);
}

double CompactFilter::fpp_budget_used() const {
  double sum = 0;
  for (const auto& t : tables_) sum += table_fpp(*t);
  return sum;
}

Shape CompactFilter::shape_for(double budget) const {
  // The coarsest shape whose p at kTargetLoad fits `budget`, but never
  // coarser than the base shape at the effective target (which lets a lone
  // table fill to kMaxLoad).
  const Shape s = compact::best_shape(budget, kTargetLoad, t_);
  return s.S > coarsest_.S ? coarsest_ : s;
}

std::vector<double> CompactFilter::sealed_fpp_ahead(std::size_t count, std::uint32_t ticks) const {
  // s[k]: the summed p of the first `count` tables at tick clock_ + k
  // (k <= W + 1) if they take no more insertions: at tick x the entries
  // inserted before x - W have left the window.
  const std::uint32_t window = config_.ticks_per_window;
  std::vector<double> s(ticks + 1, 0.0);
  for (std::size_t i = 0; i < count; ++i) {
    const Table& t = *tables_[i];
    const auto slots = static_cast<double>(t.slots());
    std::uint64_t live = t.alive.sum;
    for (std::uint32_t k = 0; k <= ticks; ++k) {
      if (k > 0 && k <= window + 1 && clock_ + k >= window + 1) {
        live -= std::min<std::uint64_t>(live, t.alive.at(clock_ + k - 1 - window));
      }
      s[k] += compact::fpp_at(static_cast<double>(live) / slots, t.layout.shape);
    }
  }
  return s;
}

bool CompactFilter::pressed() const {
  // A memory budget decides the tables' sizes: it is short of the total
  // demand, or its level raised the target. Tables then get less than they
  // ask for and fill sooner than a window: no plan over one holds.
  if (!budget_ || budget_->max_bytes() == 0) return false;
  return target_ > config_.fpp ||
         budget_->expected_demand(demand_.at_target()) > budget_->max_bytes();
}

bool CompactFilter::sealed_before(Tick start) const {
  // True when no table but the active took an entry at or after `start`.
  for (std::size_t i = 0; i + 1 < tables_.size(); ++i) {
    if (tables_[i]->inserts > 0 && tables_[i]->last_insert >= start) return false;
  }
  return true;
}

void CompactFilter::refresh_limit() {
  // The active may use kBudgetShare of what the sealed tables leave; the
  // rest is kept for a table added within the tick. When they all stopped
  // taking entries before it started (it took over at a tick's start), the
  // share applies to what they will leave at the next tick, capped by what
  // they leave now: the sum of the tables' p stays within the target at
  // every tick, and a table whose predecessors are about to drain (the
  // first window, when the floor's entries leave) is not sealed for a budget
  // they free a tick later.
  const std::vector<double> sealed = sealed_fpp_ahead(tables_.size() - 1, 1);
  const Table& a = *tables_.back();
  const double budget = sealed_before(a.created)
                            ? std::min(target_ - sealed[0], kBudgetShare * (target_ - sealed[1]))
                            : kBudgetShare * (target_ - sealed[0]);
  // Overfull (no table could be added this tick): whatever the table takes
  // up to kMaxLoad; saturated: whatever its lines have room for.
  const double load =
      saturated_ ? 1.0
      : overfull_
          ? kMaxLoad
          : std::min(kMaxLoad, budget > 0 ? compact::load_for(budget, a.layout.shape) : 0.0);
  active_limit_ = static_cast<std::uint64_t>(load * static_cast<double>(a.slots()));
  refresh_view();
}

// --- rates ---------------------------------------------------------------------------

bool CompactFilter::rate_known() const {
  // At least one whole tick of insertions behind the clock.
  return insertions_ > 0 && clock_ > first_tick_;
}

double CompactFilter::arrivals(Tick x) const {
  // Deliveries count the new identities the filter did not mistake for
  // duplicates: divided by 1 - (the estimate at that tick), they give the
  // new identities that arrived, whatever the filter's fpp was then (a
  // ramp-up's fuller tables, a table under budget pressure).
  std::uint64_t n = 0;
  for (const auto& t : tables_) n += t->alive.at(x);
  return static_cast<double>(n) / (1.0 - std::min(0.5, tick_fpp_[x % tick_fpp_.size()]));
}

double CompactFilter::window_arrivals() const {
  const Tick from = clock_ - std::min<Tick>(clock_, config_.ticks_per_window);
  double sum = 0;
  for (Tick x = from; x <= clock_; ++x) sum += arrivals(x);
  return sum;
}

Tick CompactFilter::recent_span() const noexcept {
  // R: the ticks the recent rate is measured over, a quarter of the window
  // (at least 2).
  return std::max<Tick>(2, (config_.ticks_per_window + 1) / 4);
}

double CompactFilter::recent_rate(Tick horizon, bool rising) const {
  // New identities per tick: the mean of the last `horizon` whole ticks
  // (since the first insertion if later); with `rising`, the current tick's
  // so far when that is more.
  const Tick history = insertions_ == 0 ? 0 : clock_ - std::min(clock_, first_tick_);
  const Tick span = std::min(horizon, history);
  double whole = 0;
  for (Tick x = clock_ - span; x < clock_; ++x) whole += arrivals(x);
  const double mean = span > 0 ? whole / static_cast<double>(span) : 0.0;
  return rising ? std::max(mean, arrivals(clock_)) : mean;
}

bool CompactFilter::surging() const {
  // The tick in progress has brought more new identities than the mean of
  // the last R whole ticks: a burst or a step may be starting.
  return arrivals(clock_) > recent_rate(recent_span(), false);
}

std::optional<double> CompactFilter::step_peak(Tick horizon) const {
  // The last `horizon` whole ticks straddle a step of the rate when one of
  // them brought kFallFactor times the new identities of another: then the
  // most one of them brought.
  const Tick span = std::min<Tick>(horizon, clock_);
  if (span == 0) return std::nullopt;
  double least = arrivals(clock_ - span), most = least;
  for (Tick x = clock_ - span + 1; x < clock_; ++x) {
    least = std::min(least, arrivals(x));
    most = std::max(most, arrivals(x));
  }
  if (most > kFallFactor * least) return most;
  return std::nullopt;
}

bool CompactFilter::climbing(Tick span) const {
  // The last whole tick brought kClimbFactor times the new identities of
  // the tick `span` before it, by more than three standard deviations of a
  // Poisson count (noise on a steady rate does not count).
  if (clock_ < span + 1) return false;
  const double last = arrivals(clock_ - 1), before = arrivals(clock_ - 1 - span);
  return last > kClimbFactor * before && last - before > 3.0 * std::sqrt(last + before);
}

double CompactFilter::growth_rate() const {
  // Over a quarter of the window (at least 2 ticks), and never less than
  // the current tick so far: a rising rate is seen at once.
  return recent_rate(std::min<Tick>(config_.ticks_per_window, recent_span()), true);
}

double CompactFilter::delivered_share() const {
  // A right-sized table at kTargetLoad delivers this share of the new
  // identities (at fpp 10% a few % fewer than arrive).
  return 1.0 - compact::fpp_at(kTargetLoad, coarsest_);
}

double CompactFilter::growth_target() const {
  // The recent rate over a whole window once one whole tick has been seen
  // (a burst inside the current tick is never extrapolated to a window);
  // before that, geometric growth (scalable Bloom filters).
  const Table& a = *tables_.back();
  const double geometric =
      kMaxGrowthStep * static_cast<double>(std::max<std::uint64_t>(1, a.alive.sum));
  if (!rate_known()) return geometric;
  const double rated = growth_rate() * (config_.ticks_per_window + 1) * delivered_share();
  // A surge within the tick: the active was added in this tick (its
  // predecessor filled) and has filled too, while the tick brought more
  // than the recent ticks' mean. The tick so far over a whole window is
  // what a step needs if it lasts; a burst within the tick leaves the
  // window a window later, and its table (sized for 1M identities where
  // the window held 196k, 42k lines at 12-bit remainders, beside the two it
  // filled: 8.6x the pre-sized figure) is folded two ticks later. So, as
  // before the first whole tick, at most the geometric step: a step that
  // lasts fills that one within a tick or two, and its successor is sized
  // from the whole ticks seen by then.
  if (tables_.size() > 1 && a.created == clock_ && surging()) return std::min(rated, geometric);
  return rated;
}

// --- tables --------------------------------------------------------------------------

bool CompactFilter::grow_for_insert() {
  // The active has no room left for the next identity: its fpp share ran
  // out, or, overfull, it is at kMaxLoad.
  return seal_and_grow(overfull_ ? Seal::kFull : Seal::kBudget);
}

bool CompactFilter::seal_and_grow(Seal why, double want) {
  // The new table holds `want` entries at kTargetLoad with the coarsest
  // shape the budget left by the tables sealed now allows: after a full
  // table that is a few bits finer, and once alone it is replaced by a
  // right-sized table at the base shape (maybe_replace). A replacement
  // takes the coarsest shape that fits the target by itself: the table it
  // replaces drains while it fills, and the room rule keeps the sum within
  // the target at every tick meanwhile.
  if (want <= 0) want = growth_target();
  const double left = why == Seal::kReplace ? target_ : target_ - fpp_budget_used();
  // A growth table at a known rate fills over a window while the tables
  // sealed now drain: its budget is what they leave at each tick of it
  // (planned_budget()), at least what they leave now.
  const bool planned = why != Seal::kReplace && rate_known() && !pressed();
  const double budget =
      planned && left > 0 ? std::max(kBudgetShare * left, planned_budget()) : kBudgetShare * left;
  // A full table with no fpp left (the level rose after the tables were
  // added): the most room per byte, not the finest shape.
  const Shape shape = left > 0 ? shape_for(budget) : coarsest_;
  // A table that could not take a single identity within the fpp left (the
  // table cap; the sealed tables' share after the level fell) is no use
  // unless the active is full.
  const bool useless = tables_.size() >= kMaxTables || compact::fpp_at(kTargetLoad, shape) > budget;
  std::unique_ptr<Table> t;
  if (tables_.size() < compact::kHardMaxTables && (why == Seal::kFull || !useless)) {
    t = reserve_table(why, want, shape);
  }
  if (!t && why == Seal::kFull) {
    // Refused while the active cannot take more: trade accuracy for room
    // without asking for memory. An older table with room takes the new
    // identities, else the active is narrowed in place, else it takes what
    // its lines still hold and rejects the rest (judged duplicates).
    if (reopen_sealed() || narrow_active()) return true;
    saturated_ = true;
    refresh_limit();
    return false;
  }
  if (!t) {
    // Refused, out of memory or of no use: the active takes new identities
    // up to kMaxLoad until the next tick, when growth is asked for again (a
    // probe or a table to be replaced keeps its own limit).
    if (why == Seal::kBudget) {
      overfull_ = true;
      refresh_limit();
    }
    return false;
  }
  tables_.push_back(std::move(t));
  refitted_ = why == Seal::kReplace;
  refresh_limit();
  return true;
}

std::unique_ptr<CompactFilter::Table> CompactFilter::reserve_table(Seal why, double want,
                                                                   const Shape& shape) {
  std::uint64_t lines = lines_for(want, shape, true);
  const std::uint64_t floor = floor_lines();
  if (!budget_) return make_table(lines, shape, clock_);
  const std::uint64_t least = floor * compact::kLineBytes;
  const std::uint64_t total = budget_->expected_demand(demand_.at_target());
  if (budget_->max_bytes() != 0 && total > budget_->max_bytes() && demand_.at_target() > 0) {
    // Over budget, each filter holds at most its share of it, in proportion
    // to what it needs at the target (so every partition's fpp rises alike);
    // the filters that have not published yet count as needing what this
    // one does: a compact table, once taken, is not given back until it
    // drains, so the first to ask must not take the others' share.
    const double part = static_cast<double>(budget_->max_bytes()) *
                        static_cast<double>(demand_.at_target()) / static_cast<double>(total);
    const auto held = static_cast<double>(held_bytes());
    const auto room = static_cast<std::uint64_t>(std::max(0.0, part - held));
    lines = std::min(lines, std::max(floor, room / compact::kLineBytes));
  }
  const std::uint64_t bytes = lines * compact::kLineBytes;
  // A growth table may get part of what it asks for (no less than a
  // quarter, or the floor: much smaller tables fill at once); a replacement
  // must be right-sized. Every new table is reserved: only a filter's
  // starting floor is charged past the limit.
  const std::uint64_t ask =
      why == Seal::kReplace ? bytes : std::min(bytes, std::max(least, bytes / 4));
  const std::uint64_t granted = budget_->reserve_up_to(ask, bytes);
  if (granted == 0) return nullptr;  // refused
  // A table granted all it asked for has the lines lines_for() gave it; one
  // granted less takes all of that (rounded down to kLineGrain, it filled
  // sooner, and under a budget a tenth short the worst partition's false
  // positives rose from 0.011 to 0.060 at an effective target of 0.016).
  auto t = make_table(std::max<std::uint64_t>(2, granted / compact::kLineBytes), shape, clock_);
  const std::uint64_t used = t ? t->bytes() : 0;
  if (granted > used) budget_->release(granted - used);
  if (t) t->charge = MemoryCharge(budget_, used);
  return t;
}

double CompactFilter::planned_budget() const {
  // The p at kTargetLoad a table added now may have: it fills over W + 1
  // ticks at the rate (k ticks' entries: load kTargetLoad k / (W + 1); the
  // tick in progress up to kMaxGrowthStep ticks' worth when it already
  // brought more than the recent mean: a burst may be starting) while the
  // tables held now drain, and at each tick it must stay within the room
  // rule of refresh_limit(). p(load) = 1 - q^load, so p(load) <= L holds
  // iff p(kTargetLoad) <= 1 - (1 - L)^(kTargetLoad / load). A table that
  // fills faster is sealed sooner, at a lower load.
  const std::uint32_t window = config_.ticks_per_window;
  const std::vector<double> sealed = sealed_fpp_ahead(tables_.size(), window + 1);
  // Every table held now becomes sealed: the room rule is the relaxed one
  // when none took an entry in this tick.
  const Table& a = *tables_.back();
  const bool relaxed = sealed_before(clock_) && (a.inserts == 0 || a.last_insert < clock_);
  const double surge = surging() ? kMaxGrowthStep : 1.0;
  double plan = 1.0;
  for (std::uint32_t k = 1; k <= window + 1; ++k) {
    const double limit =
        relaxed ? std::min(target_ - sealed[k - 1], kBudgetShare * (target_ - sealed[k]))
                : kBudgetShare * (target_ - sealed[k - 1]);
    if (!(limit > 0)) return 0.0;
    const double filled = k == 1 ? std::min<double>(surge, window + 1) : k;
    const double ticks = static_cast<double>(window + 1) / filled;
    plan = std::min(plan, -std::expm1(std::log1p(-limit) * ticks));
  }
  return plan;
}

void CompactFilter::end_probe() {
  // The active table was added before the rate was known (the floor, or a
  // probe while the first tick filled). Once a whole tick has been seen, if
  // a window at that rate needs more than it may hold, it is sealed now and
  // the rate-sized table added: the probe then holds one tick's entries and
  // a small share of the budget while its successor fills, which can take
  // the base shape instead of the wider remainders the budget left by a
  // full probe allows (and the replacement of those, a window with both).
  const Table& a = *tables_.back();
  if (!rate_known() || a.created > first_tick_ || a.inserts == 0 || pressed()) return;
  if (growth_target() <= static_cast<double>(active_limit_)) return;
  (void)seal_and_grow(Seal::kProbe);
}

bool CompactFilter::reopen_sealed() {
  // The sealed table with the most room below kMaxLoad, if that is at least
  // an eighth of its slots (less would be sealed again at once), becomes the
  // active one again: it moves to the back, and the overflow entries follow
  // their tables.
  std::size_t best = tables_.size();
  double most = 0;
  for (std::size_t i = 0; i + 1 < tables_.size(); ++i) {
    const auto slots = static_cast<double>(tables_[i]->slots());
    const double room = kMaxLoad * slots - static_cast<double>(tables_[i]->alive.sum);
    if (room >= slots / 8 && room > most) {
      best = i;
      most = room;
    }
  }
  if (best == tables_.size()) return false;
  const auto last = static_cast<std::uint32_t>(tables_.size() - 1);
  auto moved = [&](std::uint32_t i) { return i < best ? i : i == best ? last : i - 1; };
  for (Overflow& o : overflow_) o.table = moved(o.table);
  std::rotate(tables_.begin() + static_cast<std::ptrdiff_t>(best),
              tables_.begin() + static_cast<std::ptrdiff_t>(best) + 1, tables_.end());
  refitted_ = false;
  overfull_ = true;  // it takes identities up to kMaxLoad until the next tick
  refresh_limit();
  return true;
}

bool CompactFilter::narrow_active() {
  // The active table's remainders lose their top bits, the fewest that give
  // its lines an eighth more slots (or the most there are): its fpp rises,
  // its memory does not. Every line is rewritten once.
  Table& a = *tables_.back();
  const Shape from = a.layout.shape;
  Shape to = from;
  for (unsigned bits = 1; from.r > bits && from.r - bits >= kMinRemainderBits; ++bits) {
    to = compact::narrowed(from, t_, bits);
    if (to.S * 8 >= from.S * 9) break;
  }
  if (to == from) return false;
  const Layout layout = Layout::of(to, t_);
  for (std::uint64_t i = 0; i < a.lines; ++i) compact::relayout(a.line(i), a.layout, layout);
  a.layout = layout;
  const auto active = static_cast<std::uint32_t>(tables_.size() - 1);
  for (Overflow& o : overflow_) {
    if (o.table == active) o.rem &= layout.rmask;
  }
  overfull_ = true;
  refresh_limit();
  return true;
}

bool CompactFilter::fold(std::uint64_t factor, const compact::Age& a) {
  // Line x of the active table goes to line x / factor of one with lines /
  // factor lines. An entry sits in one of its two lines, mulhi(h, lines)
  // for its hash h of that choice, and mulhi(h, lines / f) =
  // floor(mulhi(h, lines) / f) whenever f divides the line count: it lands
  // in the same choice's line of the folded table. Its bucket and remainder
  // do not depend on the line count. Entries dead at `a` (the clock's age)
  // are dropped; every line of the result is compacted at the clock. The
  // caller checked that the lines fit. False (the table as it was) when the
  // smaller table cannot be allocated.
  Table& t = *tables_.back();
  const Layout& l = t.layout;
  const std::uint64_t to = t.lines / factor;
  std::unique_ptr<compact::Line[], compact::FreeLines> out(compact::allocate_lines(to));
  if (!out) return false;
  std::uint64_t held = 0;
  for (std::uint64_t j = 0; j < to; ++j) {
    compact::Line& N = out[j];
    for (std::uint64_t g = 0; g < factor; ++g) {
      const compact::Line& L = t.line(j * factor + g);
      const std::uint64_t lo = compact::code_lo(L, l), hi = compact::code_hi(L, l);
      const unsigned n = compact::count(L, l);
      for (unsigned e = 0; e < n; ++e) {
        const std::uint64_t value = compact::entry(L, l, e);
        const auto tag = static_cast<std::uint32_t>(value) & l.tmask;
        if (!compact::alive(tag, l, a)) continue;
        const std::uint32_t q = compact::select128(lo, hi, e) - e;
        compact::insert(N, l, q, static_cast<std::uint32_t>(value >> l.t) & l.rmask, tag);
        ++held;
      }
    }
    compact::set_stamp(N, l, a.now);
  }
  const auto active = static_cast<std::uint32_t>(tables_.size() - 1);
  for (Overflow& o : overflow_) {
    if (o.table == active) o.line /= factor;
  }
  t.data = std::move(out);
  t.lines = to;
  // Every line is compacted now: the sweep may stand where the schedule
  // requires it at this clock, and it reaches every line again within one
  // period. `created` stays (the window counts before it are 0).
  t.swept = t.required(clock_, period_);
  t.nonempty = held;
  if (budget_) t.charge.resize(t.bytes());
  ++folds_;
  refitted_ = true;
  return true;
}

bool CompactFilter::fold_active(double need) {
  // The active table folded by the largest factor f dividing its line count
  // that leaves it kFoldHeadroom times what it needs at its target load
  // (`need`, or its live count if more), no smaller than the floor, and
  // whose lines fit (no line of the result gets more live entries than it
  // has slots); among the kFoldTries largest such f. False when none does.
  Table& a = *tables_.back();
  const double holds = kFoldHeadroom * std::max(need, static_cast<double>(a.alive.sum));
  const std::uint64_t least = std::max(floor_lines(), lines_for(holds, a.layout.shape, false));
  if (a.lines / least < 2) return false;
  const Layout& l = a.layout;
  const compact::Age age{static_cast<std::uint32_t>(clock_) & l.tmask, config_.ticks_per_window};
  std::vector<std::uint8_t> live(a.lines);
  for (std::uint64_t x = 0; x < a.lines; ++x) {
    const unsigned n = compact::count(a.line(x), l);
    live[x] = static_cast<std::uint8_t>(
        n - compact::popcount64(compact::dead_entries(a.line(x), l, n, age)));
  }
  int tries = 0;
  for (std::uint64_t f = a.lines / least; f >= 2 && tries < kFoldTries; --f) {
    if (a.lines % f != 0) continue;
    ++tries;
    bool fits = true;
    for (std::uint64_t j = 0; fits && j < a.lines / f; ++j) {
      unsigned sum = 0;
      for (std::uint64_t g = 0; g < f; ++g) sum += live[j * f + g];
      fits = sum <= l.shape.S;
    }
    if (!fits || !fold(f, age)) continue;
    refresh_limit();
    return true;
  }
  return false;
}

void CompactFilter::maybe_replace() {
  // Two rules. After a fall of the rate (a burst's end), the active table
  // is folded in place (fold_active()) or else replaced as soon as it is
  // kFallFactor times too big for the recent rate of new identities (the
  // mean of the last R whole ticks, R = a quarter of the window, at least
  // 2), alone or not; a table that cannot fold yet and still holds half of
  // what it may is kept until that changes. And a lone table that
  // has seen a whole window is right-sized when it is more than
  // kShrinkFactor times too big for the window's exact live count, or finer
  // than the target requires (after a growth phase's tightening): the live
  // count is steady where the rate is not (on a stream with repeats, the
  // rate of new identities dips after a burst and climbs back over a
  // window, and a small threshold on it would replace table after table).
  // The new table only takes what arrives from then on; the old one keeps
  // its entries and drains within a window. A table younger than R ticks is
  // left alone: its rate is still being measured.
  const Table& active = *tables_.back();
  const std::uint32_t window = config_.ticks_per_window;
  const Tick young = recent_span();
  if (clock_ - active.created <= young) return;
  const double share = delivered_share();
  const Shape& shape = active.layout.shape;
  const double rate_need = recent_rate(young, false) * (window + 1) * share;
  // Coarser than the effective target allows (narrowed, or added, under a
  // pressure that has eased): replaced as soon as the budget grants it.
  const bool too_coarse = shape.S > coarsest_.S;
  // The active holds more than `factor` times a table of shape `s` sized
  // for `entries`.
  auto bigger = [&](double factor, double entries, const Shape& s) {
    return static_cast<double>(active.bytes()) >
           factor * static_cast<double>(lines_for(entries, s, true) * compact::kLineBytes);
  };
  auto too_big_for = [&](double entries) { return bigger(kFallFactor, entries, shape); };
  if (too_coarse) {
    (void)seal_and_grow(Seal::kReplace, std::max(rate_need, 1.0));
    return;
  }
  if (too_big_for(rate_need) && !climbing()) {
    // Not while the rate climbs (after a burst of repeats it climbs back
    // over a window as the burst's identities leave it: a table folded or
    // sized for the mean of its last ticks filled, and a table was added).
    // Folded in place when it can be: no second table for a window. A
    // table that still holds half of what it may (a burst's identities,
    // in the window for up to W more ticks) is not replaced: it is held
    // until they leave anyway, and it folds, or is replaced, once enough
    // have (on a stream with repeats the rate of new identities dips after
    // a burst and climbs back: a table sized for the dip filled, and a
    // second table was added).
    if (fold_active(rate_need)) return;
    if (too_big_for(static_cast<double>(active.alive.sum))) {
      // Measured across the burst's end, the rate is a mean of two regimes,
      // and on a stream with repeats the lower one climbs back over a
      // window (the burst's identities leave it), up to about the higher
      // one: a replacement sized for the mean filled just as its
      // predecessor drained, and a second table was added. It holds the
      // fold's headroom over the mean, and the busiest of those ticks'
      // window, then.
      double want = rate_need;
      if (const std::optional<double> peak = step_peak(young)) {
        want = std::max(kFoldHeadroom * rate_need, *peak * (window + 1) * share);
      }
      (void)seal_and_grow(Seal::kReplace, std::max(want, 1.0));
    }
    return;
  }
  if (tables_.size() != 1 || clock_ - active.created <= window) return;
  // Called as the clock moves: the new tick holds no insertions yet, so the
  // live count covers W ticks, and a table must hold W + 1 at the tick's end.
  const double want = window_arrivals() * (window + 1) / window * share;
  // The live count lags a falling rate (a burst leaving the window): a
  // table right-sized for it would be too big again within a window, and
  // the rule above replaces the active once the rate has fallen far enough.
  if (rate_need * kSteadyRate < want) return;
  // A table already sized for a measured rate (a replacement, a fold) is
  // replaced for its size only when that saves more (kRefitShrinkFactor):
  // a replacement holds two tables for a window.
  const double misfit = refitted_ ? kRefitShrinkFactor : kShrinkFactor;
  // Replaced for its shape alone (finer than the target needs): a table
  // the growth added, sized for a rate measured then, only when the
  // coarser replacement saves kShrinkFactor too. One remainder bit finer
  // (a slot a line fewer at fpp 1%) is not worth a window with two: a 6x
  // step's rate-sized table at 8-bit remainders was replaced by one 2.7%
  // smaller, 2.03x the pre-sized figure for that window; kept, 1.50x. A
  // table sized after a fall (refitted_) is replaced for its shape as it
  // was: its successor keeps the fold's headroom over the live count, and
  // waiting for the count to fall under it moved such a replacement past
  // the stream's end (a seed of the uniform 5x burst at fpp 10%).
  const Shape coarse = shape_for(kBudgetShare * target_);
  const bool coarser = coarse.S > shape.S && (refitted_ || bigger(kShrinkFactor, want, coarse));
  const bool smaller = bigger(misfit, want, shape);
  if (smaller) {
    // The live count lags a rate climbing back after a burst of repeats (its
    // identities leave the window and come back new): a table sized for it
    // filled, and a second table was added. The rate's window then. A table
    // sized after a fall (refitted_) that is replaced while the rate still
    // climbs over the last R ticks gets the fold's headroom over both: the
    // climb slows as it nears the rate before the burst, so a tick-to-tick
    // check passes it while the rate has a tenth or more to go (sized for
    // either, the replacement filled as its predecessor drained).
    const double need = rate_need > kClimbFactor * want ? rate_need : want;
    const bool still_climbing = refitted_ && climbing(young);
    (void)seal_and_grow(Seal::kReplace,
                        still_climbing ? kFoldHeadroom * std::max(rate_need, want) : need);
  } else if (coarser) {
    // Replaced for its shape alone (finer than the target needs, its size
    // right): a folded or replaced table's successor keeps the headroom a
    // fold keeps over the live count, which lags a rate climbing back after
    // a burst (its identities come back as duplicates for a window).
    (void)seal_and_grow(Seal::kReplace, refitted_ ? kFoldHeadroom * want : want);
  }
}

// --- the memory budget -------------------------------------------------------------

void CompactFilter::set_memory_budget(std::shared_ptr<MemoryBudget> budget) {
  budget_ = std::move(budget);
  demand_ = MemoryDemand(budget_);
  level_shapes_.clear();
  for (std::uint32_t l = 0; l < demand_.levels(); ++l) {
    const double fpp = filter::effective_fpp(config_.fpp, std::ldexp(1.0, static_cast<int>(l)));
    level_shapes_.push_back(compact::best_shape(kBudgetShare * fpp, kFingerprintLoad, t_));
  }
  for (auto& t : tables_) {
    t->charge = MemoryCharge();
    if (budget_) {
      budget_->charge(t->bytes());
      t->charge = MemoryCharge(budget_, t->bytes());
    }
  }
  budget_level_.reset(budget_ ? budget_->level() : 0, clock_);
  set_target(budget_level_.raise(config_.fpp));
  refresh_limit();
}

void CompactFilter::quiet() { demand_.cap(held_bytes()); }

std::uint64_t CompactFilter::held_bytes() const noexcept {
  std::uint64_t held = 0;
  for (const auto& t : tables_) held += t->bytes();
  return held;
}

void CompactFilter::set_target(double fpp) {
  target_ = fpp;
  const Shape s = compact::best_shape(kBudgetShare * fpp, kFingerprintLoad, t_);
  coarsest_ = s.S >= base_.S ? s : base_;
}

void CompactFilter::observe_budget() {
  if (!budget_ || !budget_level_.follow(*budget_, clock_, config_.ticks_per_window)) return;
  set_target(budget_level_.raise(config_.fpp));
}

void CompactFilter::publish_demand() {
  if (level_shapes_.empty()) return;
  // The new identities that arrived in the window (arrivals(): a saturated
  // filter inserts only those it does not mistake for duplicates), or what
  // the current rate brings in one if more, in a right-sized table at each
  // level's base shape.
  const double rate = rate_known() ? growth_rate() : 0.0;
  double holds = std::max(window_arrivals(), rate * (config_.ticks_per_window + 1));
  holds += static_cast<double>(rejected_in_window());  // turned away for want of room
  std::vector<std::uint64_t> bytes(level_shapes_.size());
  for (std::size_t l = 0; l < level_shapes_.size(); ++l) {
    bytes[l] = lines_for(holds, level_shapes_[l], true) * compact::kLineBytes;
  }
  demand_.publish(bytes);
}

}  // namespace kdedup::filter
