// Timer filter: sub-filter sizes, the memory budget, growth by sealing and
// shrink by folding (seed 000 §5; "Dynamic size" in timer_filter.h).

#include <limits>

#include "timer_cells.h"

namespace kdedup::filter {

std::uint64_t TimerFilter::lines_for(double elements, double lambda) const {
  const double min_lines = static_cast<double>(floor_lines());
  const double max_lines = std::max(min_lines, static_cast<double>(config_.max_bytes / kLineBytes));
  double lines = lambda > 0 ? std::ceil(elements / lambda) : max_lines;
  lines = std::clamp(lines, min_lines, max_lines);
  if (lines > static_cast<double>(kFoldGrain)) {
    // kFoldGrain x a 5-smooth number: divisors at every scale.
    const double smooth = static_cast<double>(
        kFoldGrain * smooth_ceil(static_cast<std::uint64_t>(std::ceil(lines / kFoldGrain))));
    if (smooth <= max_lines) lines = smooth;
  }
  return static_cast<std::uint64_t>(lines);
}

std::unique_ptr<TimerFilter::SubFilter> TimerFilter::new_subfilter(std::uint64_t lines,
                                                                   bool required,
                                                                   std::uint64_t least) {
  std::uint64_t bytes = lines * kLineBytes;
  MemoryCharge charge;
  if (budget_) {
    if (required) {
      budget_->charge(bytes);
    } else {
      // What is left of the budget, if less than asked for (a smaller
      // sub-filter fills sooner and asks again), before any fpp is raised.
      least = std::min(least == 0 ? lines : least, lines);
      const std::uint64_t granted = budget_->reserve_up_to(least * kLineBytes, bytes);
      if (granted == 0) return nullptr;
      std::uint64_t fit = granted / kLineBytes;
      if (fit > kFoldGrain) fit = fit / kFoldGrain * kFoldGrain;  // can still fold by 2, 4, 8
      fit = std::max(fit, least);
      if (fit * kLineBytes < granted) budget_->release(granted - fit * kLineBytes);
      lines = fit;
      bytes = fit * kLineBytes;
    }
    charge = MemoryCharge(budget_, bytes);
  }
  auto s = SubFilter::make(lines, clock_, config_.ticks_per_window);
  if (s) s->charge = std::move(charge);
  return s;  // null: out of memory (the charge went with it)
}

void TimerFilter::set_memory_budget(std::shared_ptr<MemoryBudget> budget) {
  budget_ = std::move(budget);
  demand_ = MemoryDemand(budget_);
  // Load per line at kBudgetShare of each level's target (publish_demand).
  level_lambda_.clear();
  for (std::uint32_t l = 0; l < demand_.levels(); ++l) {
    level_lambda_.push_back(model_->lambda_for(
        kBudgetShare * filter::effective_fpp(config_.fpp, std::ldexp(1.0, static_cast<int>(l)))));
  }
  for (auto& s : subs_) {
    s->charge = MemoryCharge();
    if (budget_) {
      budget_->charge(s->bytes());
      s->charge = MemoryCharge(budget_, s->bytes());
    }
  }
  budget_level_.reset(budget_ ? budget_->level() : 0, clock_);
  set_target(budget_level_.raise(config_.fpp));
  refresh_threshold();
}

void TimerFilter::observe_budget() {
  if (!budget_ || !budget_level_.follow(*budget_, clock_, config_.ticks_per_window)) return;
  set_target(budget_level_.raise(config_.fpp));
}

void TimerFilter::publish_demand() {
  if (level_lambda_.empty()) return;
  // What the window holds, or brings at the current rate if more, with the
  // headroom a new sub-filter gets, at each level's load per line.
  const std::uint32_t window = config_.ticks_per_window;
  const Tick horizon = fold_horizon();
  const double rate = std::max(0.0, recent_rate(horizon));
  // A saturated filter inserts only the share of new identities it does not
  // mistake for duplicates: what arrives is what it inserted / (1 - fpp).
  const double used = fpp_budget_used();
  const double missed = 1.0 - std::min(0.5, used);
  double holds =
      kGrowthHeadroom *
      std::max(static_cast<double>(alive_total()), rate * static_cast<double>(window + 1)) / missed;
  // Past its target (overfull: refused by the budget or at its cap) or
  // rejecting, it may be dropping most of what arrives, and what it inserts
  // says little of what it needs: it counts every query instead (true
  // duplicates included: an upper bound, where the insertions are a lower
  // one).
  if (used > target_ || rejected_rate_ > kRejectedShare * arrival_rate_) {
    holds = std::max(holds, kGrowthHeadroom * arrival_rate_ * static_cast<double>(window + 1));
  }
  demand_bytes_.resize(level_lambda_.size());
  for (std::size_t l = 0; l < level_lambda_.size(); ++l) {
    const auto lines = static_cast<std::uint64_t>(std::ceil(holds / level_lambda_[l]));
    demand_bytes_[l] = std::max(lines, floor_lines()) * kLineBytes;
  }
  demand_.publish(demand_bytes_);
}

void TimerFilter::set_target(double fpp) {
  if (fpp == target_) return;
  target_ = fpp;
  lambda_full_ = model_->lambda_for(kBudgetShare * fpp);
}

double TimerFilter::counted(const SubFilter& s) const {
  if (s.splits.empty()) return static_cast<double>(s.alive.sum);
  return s.copies_before(clock_ / s.alive.width + 1);
}

double TimerFilter::subfilter_fpp(const SubFilter& s) const {
  return fpp_of(s.span, s.lines, counted(s));
}

double TimerFilter::fpp_of(std::uint64_t span, std::uint64_t lines, double elements) const {
  if (lines >= span) return model_->fpp(elements / static_cast<double>(lines));
  // Shrunk: span - lines held lines carry two hash lines each, twice the
  // load of the others, and take that share of the queries.
  const double per_hash_line = elements / static_cast<double>(span);
  const double doubled = 2.0 * static_cast<double>(span - lines) / static_cast<double>(span);
  return doubled * model_->fpp(2 * per_hash_line) + (1 - doubled) * model_->fpp(per_hash_line);
}

double TimerFilter::capacity(const SubFilter& s, double lambda) const {
  double counted_limit = lambda * static_cast<double>(s.lines);
  if (s.shrunk()) {
    // Between the load at which its doubled lines reach lambda and the load
    // at which every hash line does: fpp_of is monotone in between.
    const double target = model_->fpp(lambda);
    double lo = lambda * static_cast<double>(s.span) / 2, hi = lambda * static_cast<double>(s.span);
    for (int i = 0; i < 40; ++i) {
      const double mid = (lo + hi) / 2;
      (fpp_of(s.span, s.lines, mid) <= target ? lo : hi) = mid;
    }
    counted_limit = lo;
  }
  if (s.splits.empty()) return counted_limit;
  // Entries copied by an expansion take room once per copy (counted()).
  return std::max(0.0, counted_limit - counted(s) + static_cast<double>(s.alive.sum));
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

double TimerFilter::active_lambda() const {
  const SubFilter& active = *subs_.back();
  // The common case (one sub-filter at its full share) needs no solve: this
  // runs every tick.
  if (subs_.size() == 1 && active.share >= 1.0) return lambda_full_;
  return lambda_for_sealed(sealed_fpp());
}

double TimerFilter::sealed_fpp() const {
  double sum = 0;
  for (std::size_t i = 0; i + 1 < subs_.size(); ++i) sum += subfilter_fpp(*subs_[i]);
  return sum;
}

double TimerFilter::lambda_for_sealed(double sealed) const {
  const double budget = kBudgetShare * std::min(target_ - sealed, subs_.back()->share * target_);
  return budget > 0 ? model_->lambda_for(budget) : 0.0;
}

void TimerFilter::refresh_threshold() {
  active_limit_ = static_cast<std::uint64_t>(capacity(*subs_.back(), active_lambda()));
  refresh_view();
}

TimerFilter::Recent TimerFilter::recent(Tick horizon) const {
  if (insertions_ == 0) return {};
  const Tick from = std::max({first_tick_, history_from_, clock_ > horizon ? clock_ - horizon : 0});
  const std::uint64_t width = subs_.back()->alive.width;
  // Whole buckets strictly before the clock's (the current one is partial).
  const std::uint64_t b_from = (from + width - 1) / width, b_to = clock_ / width;
  if (b_to <= b_from) return {};
  std::uint64_t n = 0;
  for (const auto& s : subs_) n += s->alive.sum_buckets(b_from, b_to);
  return {static_cast<double>(n), static_cast<double>(queries_->sum_buckets(b_from, b_to)),
          static_cast<double>((b_to - b_from) * width)};
}

double TimerFilter::recent_rate(Tick horizon) const {
  const Recent r = recent(horizon);
  return r.ticks > 0 ? r.inserted / r.ticks : -1;
}

double TimerFilter::domain_bound() const {
  // Identities drawn from a domain of D, n of them in the window: a query
  // is new with probability 1 - n / D (uniform draws), so D = n / (the
  // share of repeats). On a skewed stream the share of repeats is larger
  // than that (the popular identities recur), and the bound is below what
  // the window may reach: an expansion sized by it may be followed by
  // another.
  const Recent r = recent(growth_horizon());
  if (!(r.queried > r.inserted)) return std::numeric_limits<double>::infinity();
  return static_cast<double>(alive_total()) * r.queried / (r.queried - r.inserted);
}

TimerFilter::GrowthTarget TimerFilter::growth_target(double step) const {
  // Rate extrapolation (see "Dynamic size" in the header): the larger of the
  // rates over the last W / 8 and W / 32 complete ticks, so that a rising
  // load is seen within a few ticks, and never less than this tick so far.
  // What the window holds bounds it: `step` times the window's
  // content, projected over a whole window while the history is shorter
  // (at most kMaxProjection times). Beyond that bound, or with no complete
  // tick yet, growth is geometric; a young filter's geometric steps are
  // probes.
  constexpr double kMaxProjection = 8.0;
  const SubFilter& active = *subs_.back();
  const std::uint32_t window = config_.ticks_per_window;
  const double held = static_cast<double>(std::max<std::uint64_t>(
      1, config_.growth == Growth::kCardinality ? active.inserts : active.alive.sum));
  const double holds = std::max(held, static_cast<double>(alive_total()));
  const Tick horizon = growth_horizon();
  const double rate = growth_rate();
  if (rate < 0) return {step * holds, true};
  const Tick lived = history();
  const double projection =
      std::min(kMaxProjection, std::max(1.0, static_cast<double>(window + 1) /
                                                 static_cast<double>(std::max<Tick>(1, lived))));
  const double bound = step * holds * projection;
  const double want = kGrowthHeadroom * std::max(rate, static_cast<double>(tick_inserts_)) *
                      static_cast<double>(window + 1);
  if (want <= bound) return {std::max(1.0, want), false};
  // A young filter's probe holds a few times what the window holds now (no
  // projection): it lives a window, and the next one will know the rate.
  if (lived < horizon) return {step * holds, true};
  return {bound, false};
}

TimerFilter::GrowthTarget TimerFilter::seal_target() const {
  // Whether the step that fills the active lasts a tick or a window cannot
  // be told at the seal. Once the stream has lived a window, the successor
  // holds at most kSealStep x what the window holds: a burst within a tick
  // was sealed beside one 4x the window and held 3.6x the memory its
  // window needed (docs/performance.md, "A seal's successor: small, then
  // sized from the rate"). If the step lasts, that one fills within the
  // growth horizon of being added, over at least one complete tick: the
  // rate that filled it has lasted its whole life, and its successor is
  // sized from that rate, uncapped (a 40x step was sealed three times, 4x
  // the window each, and held 2.1x, "A step to several times the load").
  // Neither applies in the stream's first window, over a memory budget
  // (there each filter's share bounds what it adds), or where the horizon
  // is one tick (4-bit timers: a successor added in the step's first tick
  // has no complete tick to be sized from, and small ones sealed one
  // beside the other within the tick held 5.25x). The rate not after a
  // probe, nor for one added in this tick (a burst within a tick takes the
  // capped steps).
  const Tick life = clock_ - subs_.back()->created;
  const Tick horizon = growth_horizon();
  if (history() <= config_.ticks_per_window || horizon < 2 || budget_part() >= 0) {
    return growth_target();
  }
  GrowthTarget want = growth_target(kSealStep);
  if (want.probe || subs_.back()->share < 1.0 || life < 1 || life >= horizon) return want;
  want.elements = std::max(want.elements, kGrowthHeadroom * recent_rate(life) *
                                              static_cast<double>(config_.ticks_per_window + 1));
  return want;
}

bool TimerFilter::reactivate_roomiest() {
  if (config_.growth != Growth::kDensity || subs_.size() < 2) return false;
  const double used = fpp_budget_used();
  std::size_t best = subs_.size();
  double best_room = 0;
  for (std::size_t i = 0; i + 1 < subs_.size(); ++i) {
    const SubFilter& s = *subs_[i];
    // The load this one may reach with every other one's share counted, as
    // active_lambda() will give it.
    const double others = used - subfilter_fpp(s);
    const double budget = kBudgetShare * (target_ - others);
    if (!(budget > 0)) continue;
    const double limit = capacity(s, model_->lambda_for(budget));
    const double room = limit - static_cast<double>(s.alive.sum);
    // Worth a switch: an eighth of its limit, so that a batch does not
    // bounce between nearly full sub-filters.
    if (room > best_room && room >= limit / 8) {
      best = i;
      best_room = room;
    }
  }
  if (best == subs_.size()) return false;
  std::rotate(subs_.begin() + static_cast<std::ptrdiff_t>(best),
              subs_.begin() + static_cast<std::ptrdiff_t>(best) + 1, subs_.end());
  subs_.back()->share = 1.0;
  refresh_threshold();
  return true;
}

void TimerFilter::enter_overfull() {
  overfull_ = true;
  const SubFilter& a = *subs_.back();
  if (!budget_ || budget_->max_bytes() == 0) {
    // No memory budget (the cap of sub-filters, or memory exhausted): the
    // active takes every insert, as the filter's own limits say.
    overfull_limit_ = ~std::uint64_t{0};
    refresh_view();
    return;
  }
  // Under a budget, up to the load at which the active alone reaches the
  // effective target; past it, new identities are rejected until the next
  // tick. An overfilled sub-filter makes every query of its window a false
  // positive (the filters saturate, and stay so for a window); a rejected
  // identity is one false positive, and the next tick asks again.
  overfull_limit_ =
      std::max(a.alive.sum, static_cast<std::uint64_t>(capacity(a, model_->lambda_for(target_))));
  refresh_view();
}

void TimerFilter::seal_and_grow() {
  if (overfull_) return;  // refused this tick already: rejecting until the next
  if (subs_.size() >= kMaxSubfilters && reactivate_roomiest()) return;
  if (subs_.size() >= kMaxSubfilters) {
    if (budget_) budget_->refuse();  // it would have asked for more
    enter_overfull();                // until the next tick
    return;
  }
  const GrowthTarget want = seal_target();
  std::uint64_t lines = growth_lines(want);
  // Take no less than a quarter of what it asks for: sub-filters much
  // smaller than the rate needs fill at once, and each sealed one takes a
  // share of the fpp budget; overfilling the active until the next tick
  // costs less.
  const std::uint64_t least = std::max(floor_lines(), lines / 4);
  if (const double part = budget_part(); part >= 0) {
    // Over budget, each filter holds at most its share of it (so every
    // partition's fpp rises alike): the room freed as sub-filters expire goes
    // to the partitions that need it, not to the first to ask.
    const double held = static_cast<double>(held_bytes());
    const auto room = static_cast<std::uint64_t>(std::max(0.0, part - held) / kLineBytes);
    lines = std::min(lines, room);
  }
  // Over its share by more than that: refused without asking (a sub-filter
  // smaller than a quarter of what the rate needs fills at once, and the
  // filter would reach its cap of sub-filters within a burst).
  auto sub = lines >= least ? new_subfilter(lines, false, least) : nullptr;
  if (lines < least) budget_->refuse();
  if (!sub) {
    // The budget refused (or memory ran out): a sealed sub-filter with room
    // takes over, else the active keeps inserting until the next tick, when
    // growth is asked for again.
    if (reactivate_roomiest()) return;
    enter_overfull();
    return;
  }
  if (want.probe) sub->share = kProbeShare;
  subs_.push_back(std::move(sub));
  refresh_threshold();
}

std::uint64_t TimerFilter::growth_lines(const GrowthTarget& want) const {
  const double free = target_ - fpp_budget_used();  // the active is about to be sealed
  // A probe is sized for its own small share; a rate-sized sub-filter for
  // the share it will have once the sealed ones' entries expire (header).
  const double share =
      want.probe ? std::min(free, kProbeShare * target_) : std::max(free, kPlanShare * target_);
  const double lambda = model_->lambda_for(kBudgetShare * (share > 0 ? share : 1e-3 * target_));
  return lines_for(want.elements, lambda);
}

void TimerFilter::maybe_fold() {
  // Runs at every tick: the usual answer (a sub-filter sized for what it
  // holds) comes from a few compares, before any rate is computed.
  SubFilter& a = *subs_.back();
  const std::uint64_t floor = floor_lines();
  if (a.lines <= floor) return;
  // One shrunk before (by shrink_young() for a projected load with a new
  // sub-filter's headroom, or by a shrink below) shrinks again from
  // kShrinkFrom x what a shrink keeps: the doubled lines' extra load already
  // costs it part of its lines.
  const double headroom = a.shrunk() ? 1.0 : kGrowthHeadroom;
  if (config_.growth == Growth::kDensity &&
      capacity(a, lambda_full_) < kShrinkFrom * headroom * static_cast<double>(a.alive.sum)) {
    return;  // it holds most of what it can: neither a fold nor a shrink is possible
  }
  const std::uint32_t window = config_.ticks_per_window;
  const Tick horizon = fold_horizon();
  // A young sub-filter's rate is still being learned (and it was just sized).
  if (clock_ - a.created < horizon) return;
  if (a.alive.sum == 0 && config_.growth == Growth::kDensity) {
    // Nothing in it is alive (a quiet partition, a restored snapshot whose
    // entries have expired): back to the floor, whatever its line count.
    if (auto sub = new_subfilter(floor, true)) {
      sub->share = kProbeShare;
      subs_.back() = std::move(sub);
    }
    return;
  }
  if (a.lines < 2 * floor) return;
  // Copies of an expansion count once per line until they expire (counted());
  // a fold would merge them back into one: it waits until they have.
  if (!a.splits.empty()) return;
  const double rate = recent_rate(horizon);
  if (rate < 0) return;
  if (config_.growth == Growth::kCardinality) {
    // Cardinality growth never forgets an insertion (seed 000 §5), so its
    // active cannot fold (its count would pass the limit at once): a lone
    // active twice what the rate needs is sealed and replaced by a
    // rate-sized one instead, and leaves a window later.
    const double want = kGrowthHeadroom * rate * static_cast<double>(window + 1);
    if (subs_.size() != 1 || a.lines < 2 * lines_for(want, lambda_full_)) return;
    const double share = std::max(target_ - fpp_budget_used(), kPlanShare * target_);
    auto sub = new_subfilter(lines_for(want, model_->lambda_for(kBudgetShare * share)), false);
    if (sub) subs_.push_back(std::move(sub));
    return;
  }
  const double lambda = active_lambda();
  if (!(lambda > 0)) return;
  const double content = static_cast<double>(a.alive.sum);
  const double turnover = rate * static_cast<double>(window + 1);
  const auto need = std::max(
      floor,
      static_cast<std::uint64_t>(std::ceil(kFoldHeadroom * std::max(content, turnover) / lambda)));
  const bool young = clock_ - a.created <= window;
  // Fold once the window has turned over at the current rate: what it holds
  // is what the rate brings, so the need is final and one fold lands close
  // to it (an earlier fold could land on a line count without a divisor
  // near the final need). A young one holding more than that is the case
  // shrink_young() is for (its rate fell since it was sized), and it
  // shrinks in the tick the stream has lived a window, not a few hundred
  // ticks later beside the first window's probes (docs/performance.md,
  // "The first window of a skewed stream").
  if (content > kSettled * turnover) {
    if (young) shrink_young(a, rate, lambda);
    return;
  }
  if (const std::uint64_t folded = fold_lines(a, need); folded != 0) {
    remap_by(a, folded, folded);
    return;
  }
  // Younger than a window: see shrink_young().
  if (young) {
    shrink_young(a, rate, lambda);
    return;
  }
  // Too little to fold by an integer factor (less than 2x, or no divisor):
  // an active that could hold more than kShrinkFrom x what a new sub-filter
  // would get merges line pairs down to what a fold keeps (linear hashing,
  // header). Only a lone one (no sealed one takes a share of the target)
  // that has lived a whole window (a younger one returned above), on a load
  // that fell and has settled: what
  // it will hold at this tick's end at the current rate (the window's past
  // ticks and this one; a tick is a ninth of a 4-bit timer's window) is at
  // least what the rate brings in a window and at most kSettled x that. A
  // rate that is not falling may be climbing back (after a burst of
  // repeats, the rate of new identities dips and then rises for a window),
  // and what it needs is not known yet.
  // Nor within a window of an expansion's copies expiring: what it made
  // room for (the first ticks of a burst) leaves together from then on,
  // and on a stream that recurs comes straight back (the echo).
  const double keep = content + rate;
  if (subs_.size() != 1 || keep < turnover || keep > kSettled * turnover) return;
  if (clock_ < a.echo_until) return;
  if (capacity(a, lambda) < kShrinkFrom * headroom * keep) return;
  const std::uint64_t lines = shrink_size(a, kFoldHeadroom * keep, lambda);
  if (lines < a.lines) remap_by(a, a.span, lines);
}

void TimerFilter::shrink_young(SubFilter& a, double rate, double lambda) {
  // A sub-filter sized from a rate that has fallen since (the stream's
  // first ticks bring only new identities, and their rate falls through its
  // first window as the identities start to recur; the first ticks of a
  // burst of repeats): once the stream has lived a window, the rate over a
  // whole one is known. The active keeps everything it holds until its own
  // first entries leave, at created + W + 1; by then it holds `grown` at the
  // current rate, and from then on about what the rate brings in a window.
  // It merges line pairs (linear hashing, header) down to what a new
  // sub-filter would get for `grown` at the share of the target it will
  // have then, since the sealed ones, sealed before it was created, leave
  // before that; and no further than what holds, with kFoldHeadroom, its
  // content when the last of them leaves at the share they leave it now
  // (which only grows). Not on a rate that climbs (grown below a window's
  // worth at it): what it needs is not known. Once only: a rate that keeps
  // falling (the end of a burst of repeats) may climb back within the
  // window, and the shrink that follows the load from then on waits until
  // it has settled (maybe_fold()); shrinking young tick after tick on it
  // overfilled the active at a high target (fpp 0.2: estimates of 0.21).
  const std::uint32_t window = config_.ticks_per_window;
  if (a.shrunk() || history() <= window) return;
  const double content = static_cast<double>(a.alive.sum);
  const double grown = content + rate * static_cast<double>(a.created + window + 1 - clock_);
  if (grown < rate * static_cast<double>(window + 1)) return;
  if (capacity(a, lambda_full_) < kShrinkFrom * kGrowthHeadroom * grown) return;
  Tick drained = clock_;  // when the last sealed one leaves
  for (std::size_t i = 0; i + 1 < subs_.size(); ++i) {
    drained = std::max(drained, subs_[i]->last_insert + window + 1);
  }
  const double until = content + rate * static_cast<double>(drained - clock_);
  const std::uint64_t lines = std::max(shrink_size(a, kGrowthHeadroom * grown, lambda_full_),
                                       shrink_size(a, kFoldHeadroom * until, lambda));
  if (lines < a.lines) remap_by(a, a.span, lines);
}

std::uint64_t TimerFilter::shrink_size(const SubFilter& s, double holds, double lambda) const {
  // The fewest lines, from half the hash range (every line doubled) up,
  // whose fpp holding `holds` stays within lambda's: fpp_of falls as lines
  // grow, so a bisection over the line count.
  const double target = model_->fpp(lambda);
  std::uint64_t lo = std::max(floor_lines(), (s.span + 1) / 2), hi = s.lines;
  if (lo >= hi || fpp_of(s.span, hi, holds) > target) return s.lines;
  while (lo < hi) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    if (fpp_of(s.span, mid, holds) <= target) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

std::uint64_t TimerFilter::fold_lines(const SubFilter& s, std::uint64_t need) {
  // The smallest proper divisor L' of the hash range with L' >= need: fold
  // by span / L', if that holds fewer lines than s does now.
  const std::uint64_t span = s.span;
  std::uint64_t best = span;
  if (span >= 2 * need) {
    for (std::uint64_t d = 1; d * d <= span; ++d) {
      if (span % d != 0) continue;
      for (const std::uint64_t c : {d, span / d}) {
        if (c >= need && c < best) best = c;
      }
    }
  }
  return best < span && best < s.lines ? best : 0;
}

void TimerFilter::remap_by(SubFilter& s, std::uint64_t span, std::uint64_t lines) {
  switch (config_.timer_bits) {
    case 4:
      remap<4>(s, span, lines);
      break;
    case 8:
      remap<8>(s, span, lines);
      break;
    default:
      remap<16>(s, span, lines);
      break;
  }
}

double TimerFilter::budget_part() const {
  if (demand_bytes_.empty()) return -1;  // no limited budget
  const std::uint64_t total = budget_->demand(0);
  if (total <= budget_->max_bytes()) return -1;
  // The limit in proportion to what this filter needs at the target.
  return static_cast<double>(budget_->max_bytes()) * static_cast<double>(demand_bytes_.front()) /
         static_cast<double>(total);
}

void TimerFilter::quiet() { demand_.cap(held_bytes()); }

std::uint64_t TimerFilter::held_bytes() const {
  std::uint64_t held = 0;
  for (const auto& s : subs_) held += s->bytes();
  return held;
}

Tick TimerFilter::growth_horizon() const {
  return static_cast<Tick>(std::max(
      1.0, std::ceil(kGrowthHorizonShare * static_cast<double>(config_.ticks_per_window))));
}

double TimerFilter::growth_rate(Tick least) const {
  const Tick horizon = std::max(least, growth_horizon());
  return std::max(recent_rate(horizon), recent_rate(std::max(least, (horizon + 3) / 4)));
}

Tick TimerFilter::fold_horizon() const {
  return static_cast<Tick>(
      std::max(1.0, std::ceil(kFoldHorizonShare * static_cast<double>(config_.ticks_per_window))));
}

std::uint64_t TimerFilter::fold_sealed(SubFilter& s, double alive, const DrainGuard* guard) {
  if (s.alive.sum == 0 || s.lines < 2 * floor_lines() || !s.splits.empty()) return 0;
  // Its share of the effective target in proportion to its live entries:
  // the sealed ones together take what they hold of the window, the active
  // the rest (active_lambda()).
  const double content = static_cast<double>(s.alive.sum);
  const double lambda = model_->lambda_for(kBudgetShare * target_ * content / alive);
  if (!(lambda > 0)) return 0;
  const auto need = std::max(
      floor_lines(), static_cast<std::uint64_t>(std::ceil(kFoldHeadroom * content / lambda)));
  std::uint64_t span = fold_lines(s, need), lines = span;
  if (span == 0) {
    // No fold by an integer factor fits: merge line pairs (linear hashing,
    // header), once that frees at least kDrainStep of its lines.
    if (guard == nullptr) return 0;
    span = s.span;
    lines = shrink_size(s, kFoldHeadroom * content, lambda);
    if (static_cast<double>(lines) > (1.0 - kDrainStep) * static_cast<double>(s.lines)) return 0;
  }
  if (guard != nullptr) {
    // The active's share falls by what this one's rises: only from room the
    // active will not need, at the current rate, before this one has
    // drained (sealing or expanding it would cost more than this frees).
    const Tick drained = s.last_insert + config_.ticks_per_window + 1;
    const double until =
        kFoldHeadroom * guard->rate * static_cast<double>(drained > clock_ ? drained - clock_ : 0);
    const double sealed = guard->sealed_fpp - subfilter_fpp(s) + fpp_of(span, lines, counted(s));
    // Nor past the share a rate-sized successor is planned to leave them
    // (growth_lines()), where the active now is a probe with a small one.
    if (sealed > (1.0 - kPlanShare) * target_) return 0;
    const SubFilter& a = *subs_.back();
    const double room = capacity(a, lambda_for_sealed(sealed)) - static_cast<double>(a.alive.sum);
    if (room < std::min(guard->room, until)) return 0;
  }
  const std::uint64_t lines_before = s.lines;
  remap_by(s, span, lines);
  return lines_before - s.lines;
}

void TimerFilter::fold_drained() {
  // Runs at every tick: with one sub-filter (the usual case) it returns at
  // once. A sealed sub-filter takes no insertions and drains over a window;
  // while it does, the filter holds it beside the active, which is the
  // peak of a climb (docs/performance.md, "Peaks on streams with
  // repeats"). Each one folds, or shrinks in place, to what its live
  // entries need at their share of the target, as give_back() folds them
  // over a budget: the active's share grows by what theirs loses
  // (active_lambda()), and no live entry is dropped. Not over a budget's
  // limit, where give_back() folds them to its share and the active may
  // take inserts up to the effective target alone (enter_overfull()):
  // their fpp would come on top of it.
  if (config_.growth != Growth::kDensity || subs_.size() < 2 || budget_part() >= 0) return;
  const double alive = static_cast<double>(alive_total());
  if (!(alive > 0)) return;
  DrainGuard guard;
  guard.rate = growth_rate();
  if (!(guard.rate > 0)) return;  // no rate to keep room for yet
  const SubFilter& a = *subs_.back();
  auto measure = [&] {
    guard.sealed_fpp = sealed_fpp();
    guard.room =
        capacity(a, lambda_for_sealed(guard.sealed_fpp)) - static_cast<double>(a.alive.sum);
  };
  measure();
  bool changed = false;
  for (std::size_t i = 0; i + 1 < subs_.size(); ++i) {
    if (fold_sealed(*subs_[i], alive, &guard) == 0) continue;
    changed = true;
    measure();
  }
  if (changed) refresh_threshold();
}

void TimerFilter::give_back() {
  // Runs at every tick under a limited budget: the usual answer (within the
  // limit, or within this filter's share of it) costs a few loads.
  const double part = budget_part();
  if (part < 0) return;
  double held = static_cast<double>(held_bytes());
  const double alive = static_cast<double>(alive_total());
  if (held <= part || !(alive > 0)) return;
  const std::uint64_t floor = floor_lines();
  bool folded = false;
  for (std::size_t i = 0; i + 1 < subs_.size() && held > part; ++i) {
    const std::uint64_t freed = fold_sealed(*subs_[i], alive, nullptr);
    held -= static_cast<double>(freed * kLineBytes);
    folded = folded || freed != 0;
  }
  if (folded) refresh_threshold();
  // Then the active, sized while the target was lower (before the budget's
  // level rose) or before the others' demand was known: down to what is
  // left of the share, never below what the window brings it at the current
  // rate at the load it may reach (a fold that left it full would make it
  // ask the budget again at once).
  SubFilter& a = *subs_.back();
  const double lambda = active_lambda();
  if (held <= part || a.lines < 2 * floor || !(lambda > 0) || !a.splits.empty()) return;
  const double turnover = std::max(0.0, recent_rate(fold_horizon())) *
                          static_cast<double>(config_.ticks_per_window + 1);
  const double left = part - (held - static_cast<double>(a.bytes()));
  const auto need = std::max(
      {floor, static_cast<std::uint64_t>(std::max(0.0, left) / kLineBytes),
       static_cast<std::uint64_t>(std::ceil(
           kFoldHeadroom * std::max(static_cast<double>(a.alive.sum), turnover) / lambda))});
  const std::uint64_t size = fold_lines(a, need);
  if (size == 0) return;
  remap_by(a, size, size);
  refresh_threshold();
}

template <unsigned Bits>
void TimerFilter::remap(SubFilter& s, std::uint64_t span, std::uint64_t lines) {
  // Hash line v of the old range is hash line v / d of the new one (d =
  // s.span / span; multiply-high range reduction: floor(floor(x) / d) ==
  // floor(x / d)), and each is held where SubFilter::held() puts it. Every
  // old hash line's cells merge into its new held line, per cell the
  // youngest live code (dead codes read as empty). Live codes are ordered by
  // age as (v - lo) mod 2^b over the live interval (see "Age test"), so the
  // youngest is the largest key. A fold (span = lines = s.span / d) merges
  // old lines j * d .. j * d + d - 1 into line j; a shrink (d = 1) merges
  // the old held line of each hash line past `lines` into the line half the
  // range back.
  std::unique_ptr<std::uint8_t[], SubFilter::Free> data(allocate_cells(lines * kLineBytes));
  if (!data) return;  // no memory for the smaller copy: stay as is
  const std::uint64_t factor = s.span / span;
  const std::uint32_t now_code = static_cast<std::uint32_t>(clock_ % modulus_) + 1;
  const LiveInterval live = live_interval(now_code, config_.ticks_per_window, modulus_);
  const std::uint32_t mask = modulus_;  // 2^b - 1
  auto key = [&](std::uint32_t v) -> std::uint32_t {
    if (v == 0) return 0;
    const std::uint32_t offset = (v - live.lo) & mask;
    return offset <= live.span ? offset + 1 : 0;
  };
  for (std::uint64_t v = 0; v < s.span; ++v) {
    const std::uint8_t* in = s.line(s.held(v));
    std::uint8_t* out = data.get() + held_line(v / factor, lines, span / 2) * kLineBytes;
    for (std::uint32_t c = 0; c < Cells<Bits>::kPerLine; ++c) {
      const std::uint32_t v_in = Cells<Bits>::get(in, c);
      const std::uint32_t k_in = key(v_in);
      if (k_in > key(Cells<Bits>::get(out, c))) Cells<Bits>::set(out, c, v_in);
    }
  }
  s.take_cells(std::move(data), span, lines, clock_, period_, Bits);  // every cell live or empty
  s.charge.resize(lines * kLineBytes);
}

}  // namespace kdedup::filter
