// Timer filter: the clock and the scrub that clears dead cells before the
// wrapping timers could alias them ("Scrub" in timer_filter.h).

#include "timer_cells.h"

namespace kdedup::filter {

template <unsigned Bits>
void TimerFilter::scrub_lines(SubFilter& s, std::uint64_t count, Tick ref,
                              std::uint64_t extra_age) {
  // A cell's true age is ((code(ref) - code) mod M) + extra_age: exact as long
  // as no cell had aliased at `ref` (the scrub invariant).
  const std::uint32_t m = modulus_;
  const std::uint32_t ref_code = static_cast<std::uint32_t>(ref % m) + 1;
  const std::uint64_t window = config_.ticks_per_window;
  std::uint64_t i = s.cursor;
  if (extra_age > window) {
    // Everything visited is dead (move_clock clears the whole filter instead,
    // but the scrub stays correct on its own).
    for (std::uint64_t n = 0; n < count; ++n, i = i + 1 == s.lines ? 0 : i + 1) {
      s.nonempty -= count_nonempty(s.line(i), kLineBytes, Bits);
      std::memset(s.line(i), 0, kLineBytes);
    }
  } else {
    // Kept: the empty cells and those of ages 0 .. W - extra_age at `ref`.
    const LiveInterval live =
        live_interval(ref_code, static_cast<std::uint32_t>(window - extra_age), m);
    std::uint64_t cleared = 0;
    // In contiguous segments (the sweep wraps at the end of the array).
    for (std::uint64_t left = count; left > 0;) {
      const std::uint64_t run = std::min(left, s.lines - i);
      cleared += scrub_run<Bits>(s.line(i), run, live);
      left -= run;
      i = i + run == s.lines ? 0 : i + run;
    }
    s.nonempty -= cleared;
  }
  s.swept += count;
  s.cursor = i;
}

void TimerFilter::catch_up(SubFilter& s, Tick old_clock, Tick now) {
  // The whole scrub runs here, when the clock moves: by clock `now` the
  // schedule requires required(now) lines, and visiting them in one sweep per
  // tick costs fewer instructions than one line per insert (the insert path
  // carries no scrub state at all).
  const std::uint64_t need = s.required(now, period_);
  if (need <= s.swept) return;
  const std::uint64_t todo = std::min(need - s.swept, s.lines);
  switch (config_.timer_bits) {
    case 4:
      scrub_lines<4>(s, todo, old_clock, now - old_clock);
      break;
    case 8:
      scrub_lines<8>(s, todo, old_clock, now - old_clock);
      break;
    default:
      scrub_lines<16>(s, todo, old_clock, now - old_clock);
      break;
  }
  if (need > s.swept) {  // a jump longer than one sweep: every line was visited once
    s.swept = need;
    s.cursor = need % s.lines;
  }
}

void TimerFilter::clear_all(Tick now) {
  // Every entry was inserted at or before the old clock, more than W ago:
  // nothing is alive, so the filter returns to its floor (a pause longer
  // than the window frees what the last load needed).
  history_from_ = now;
  SubFilter& active = *subs_.back();
  if (active.lines > floor_lines()) {
    clock_ = now;  // the new sub-filter's creation tick
    if (auto sub = new_subfilter(floor_lines(), true)) {
      sub->share = kProbeShare;
      subs_.clear();
      subs_.push_back(std::move(sub));
      return;
    }
    // Out of memory even for the floor: empty the active in place.
  }
  std::memset(active.data.get(), 0, active.bytes());
  active.nonempty = 0;
  active.swept = 0;
  active.cursor = 0;
  active.created = now;
  active.inserts = 0;
  active.splits.clear();
  active.alive.init(config_.ticks_per_window);
  active.alive.advance(now, config_.ticks_per_window);
  std::unique_ptr<SubFilter> keep = std::move(subs_.back());
  subs_.clear();
  subs_.push_back(std::move(keep));
}

// noinline: kept out of the flattened vector batch loops (vector_probe).
[[gnu::noinline]] void TimerFilter::move_clock(Tick now) {
  close_tick(state_bytes());
  const Tick old = clock_;
  const std::uint32_t window = config_.ticks_per_window;
  if (now - old > window) {
    clear_all(now);
    clock_ = now;
  } else {
    for (auto& s : subs_) catch_up(*s, old, now);
    clock_ = now;
    for (auto& s : subs_) {
      s->alive.advance(now, window);
      // An expansion's copies have expired once nothing inserted before it
      // is left in the window; what it made room for leaves from now on,
      // and may come back (maybe_fold()).
      const auto expired = std::erase_if(s->splits, [&](const SubFilter::Split& x) {
        return s->alive.sum_buckets(0, x.tick / s->alive.width) == 0;
      });
      if (expired != 0) s->echo_until = now + window + 1;
    }
    // Free sealed sub-filters whose newest insertion left the window.
    const SubFilter* active = subs_.back().get();
    std::erase_if(subs_, [&](const std::unique_ptr<SubFilter>& s) {
      return s.get() != active && (s->inserts == 0 || now - s->last_insert > window);
    });
  }
  queries_->advance(now, queries_span_);
  // The arrival rate: the queries since the last clock move, spread over
  // the ticks it moved, into a moving average of about W / 4 ticks.
  const double horizon =
      std::max(1.0, kFoldHorizonShare * static_cast<double>(config_.ticks_per_window));
  const auto moved = static_cast<double>(clock_ - old);
  const double weight = 1.0 - std::pow(1.0 - 1.0 / horizon, moved);
  const auto average = [&](double& rate, std::uint64_t count, std::uint64_t& booked) {
    rate += weight * (static_cast<double>(count - booked) / moved - rate);
    booked = count;
  };
  average(arrival_rate_, arrivals_, arrivals_booked_);
  average(rejected_rate_, rejected_, rejected_booked_);
  tick_inserts_ = 0;
  overfull_ = false;
  observe_budget();
  give_back();
  fold_drained();
  maybe_fold();
  // An expansion gives the active the room a sealed sub-filter's fold was
  // held back for (its guard): the sealed ones fold in the same tick, not
  // a tick later beside the expanded active (the peak of a climb).
  if (maybe_expand()) fold_drained();
  publish_demand();
  refresh_threshold();  // and the view
}

void TimerFilter::advance(Tick now) {
  if (now > clock_) move_clock(now);
}

}  // namespace kdedup::filter
