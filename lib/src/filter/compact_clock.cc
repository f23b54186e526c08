// Compact filter: the clock, the scrub that compacts lines before a wrapping
// tag could alias ("Scrub" in compact_filter.h), expiry of sealed tables and
// overflow entries, and the hot path's view of the tables.

#include <algorithm>
#include <cstring>

#include "compact_kernels.h"
#include "kdedup/filter/compact_filter.h"

namespace kdedup::filter {

// --- the clock ---------------------------------------------------------------------

template <class Lines>
void CompactFilter::scrub_lines(Table& t, std::uint64_t count, Tick ref, std::uint64_t extra_age) {
  // Compacts `count` lines from the sweep position on, at clock ref +
  // extra_age. A tag's true age is its age at `ref` plus extra_age: exact as
  // long as no tag had wrapped at `ref` (the scrub invariant).
  const Layout& l = t.layout;
  const std::uint32_t window = config_.ticks_per_window;
  const bool all_dead = extra_age > window;
  Age a;
  a.now = static_cast<std::uint32_t>(ref) & l.tmask;
  a.window = all_dead ? 0 : static_cast<std::uint32_t>(window - extra_age);
  const auto stamp = static_cast<std::uint32_t>(ref + extra_age) & l.tmask;
  std::uint64_t i = t.swept % t.lines;
  std::uint64_t removed = 0;
  for (std::uint64_t left = count; left > 0;) {
    // In runs of consecutive lines: up to the table's end, then from its start.
    const std::uint64_t run = std::min(left, t.lines - i);
    removed += Lines::sweep_run(&t.line(i), run, l, a, all_dead, stamp);
    left -= run;
    i = (i + run) % t.lines;
  }
  t.nonempty -= removed;
  t.swept += count;
}

#if KDEDUP_COMPACT_X86
KDEDUP_COMPACT_AVX512 [[gnu::flatten]] void CompactFilter::scrub_vector(Table& t,
                                                                        std::uint64_t count,
                                                                        Tick ref,
                                                                        std::uint64_t extra_age) {
  scrub_lines<VectorLines<ScanKind::kAny>>(t, count, ref, extra_age);
}
#endif

void CompactFilter::scrub(Table& t, std::uint64_t count, Tick ref, std::uint64_t extra_age) {
#if KDEDUP_COMPACT_X86
  if (vector_path()) return scrub_vector(t, count, ref, extra_age);
#endif
  scrub_lines<PortableLines>(t, count, ref, extra_age);
}

void CompactFilter::clear_all(Tick now) {
  // Every entry was inserted at or before the old clock, more than W ago:
  // nothing is alive, so the filter returns to its floor (a pause longer
  // than the window frees what the last load needed).
  overflow_.clear();
  overflow_bins_ = {};
  std::fill(tick_fpp_.begin(), tick_fpp_.end(), 0.0);
  std::fill(rejected_.begin(), rejected_.end(), 0);
  refitted_ = false;
  if (tables_.back()->lines > floor_lines() || !(tables_.back()->layout.shape == coarsest_)) {
    clock_ = now;  // the new table's creation tick
    if (auto t = charged_table(floor_lines(), coarsest_)) {
      tables_.clear();
      tables_.push_back(std::move(t));
      return;
    }
    // Out of memory even for the floor: empty the active in place.
  }
  Table& active = *tables_.back();
  std::memset(static_cast<void*>(active.data.get()), 0, active.bytes());
  active.nonempty = 0;
  active.swept = 0;
  active.created = now;
  active.last_insert = now;
  active.inserts = 0;
  active.alive.init(config_.ticks_per_window);
  std::unique_ptr<Table> keep = std::move(tables_.back());
  tables_.clear();
  tables_.push_back(std::move(keep));
}

void CompactFilter::drop_expired() {
  // Overflow entries whose tag left the window, then sealed tables whose
  // newest insertion did (their overflow entries are older still).
  const std::uint32_t window = config_.ticks_per_window;
  const std::uint32_t mask = (1U << t_) - 1;
  const auto now_tag = static_cast<std::uint32_t>(clock_) & mask;
  std::erase_if(overflow_, [&](const Overflow& o) { return ((now_tag - o.tag) & mask) > window; });
  std::vector<std::uint32_t> index(tables_.size(), 0);
  std::vector<bool> kept_table(tables_.size(), false);
  std::vector<std::unique_ptr<Table>> kept;
  for (std::size_t i = 0; i < tables_.size(); ++i) {
    const bool active = i + 1 == tables_.size();
    if (!active && (tables_[i]->inserts == 0 || clock_ - tables_[i]->last_insert > window)) {
      continue;
    }
    index[i] = static_cast<std::uint32_t>(kept.size());
    kept_table[i] = true;
    kept.push_back(std::move(tables_[i]));
  }
  std::erase_if(overflow_, [&](const Overflow& o) { return !kept_table[o.table]; });
  for (Overflow& o : overflow_) o.table = index[o.table];
  tables_ = std::move(kept);
  overflow_bins_ = {};
  for (const Overflow& o : overflow_) ++overflow_bins_[o.bin];
}

[[gnu::noinline]] void CompactFilter::move_clock(Tick now) {
  close_tick(state_bytes());
  if (seal_due_) {
    seal_due_ = false;
    (void)seal_and_grow(Seal::kFull);
  }
  const Tick old = clock_;
  const std::uint32_t window = config_.ticks_per_window;
  // The estimate during the tick that ends: the mean of its start and end;
  // 0 for ticks without insertions (arrivals() never reads them), so that
  // the state does not depend on which clock values were visited.
  const std::size_t ring = tick_fpp_.size();
  std::uint64_t inserted = 0;
  for (const auto& t : tables_) inserted += t->alive.at(old);
  double& during = tick_fpp_[old % ring];
  during = inserted > 0 ? 0.5 * (during + fpp_budget_used()) : 0.0;
  for (Tick x = old + 1; x < now && x - old < ring; ++x) {
    tick_fpp_[x % ring] = 0.0;
    rejected_[x % ring] = 0;
  }
  if (now - old >= ring) std::fill(rejected_.begin(), rejected_.end(), 0);
  rejected_[now % ring] = 0;
  if (now - old > window) {
    clear_all(now);
    clock_ = now;
  } else {
    for (auto& t : tables_) {
      // By clock `now` the schedule requires required(now) lines; a jump
      // longer than one sweep visits every line once.
      const std::uint64_t need = t->required(now, period_);
      if (t == tables_.back() && t->alive.at(old) >= t->lines) {
        // A busy active table (an insertion per line in the tick that
        // ended: each probes two lines, so at most e^-2 of them would go
        // untouched) is compacted whole now, in memory order, rather than
        // line by line on first touch, where whether a line is stale is a
        // branch the hot path mispredicts (docs/performance.md, "Compact
        // filter throughput").
        // The schedule's cursor stays where it was (a whole sweep ends
        // where it began): only the lines it required count as swept.
        const std::uint64_t cursor = t->swept;
        scrub(*t, t->lines, old, now - old);
        t->swept = std::max(cursor, need);
        continue;
      }
      if (need <= t->swept) continue;
      scrub(*t, std::min(need - t->swept, t->lines), old, now - old);
      t->swept = std::max(t->swept, need);
    }
    for (auto& t : tables_) t->alive.advance(old, now, window);
    clock_ = now;
    drop_expired();
  }
  tick_fpp_[clock_ % tick_fpp_.size()] = fpp_budget_used();  // at the new tick's start
  overfull_ = false;
  saturated_ = overflow_.size() >= compact::kMaxOverflow;
  observe_budget();
  publish_demand();
  refresh_view();
  maybe_replace();
  refresh_limit();  // and the view
  end_probe();
}

void CompactFilter::advance(Tick now) {
  if (now > clock_) move_clock(now);
}

void CompactFilter::refresh_view() {
  View& v = *view_;
  v.count = static_cast<std::uint32_t>(tables_.size());
  for (std::size_t i = 0; i < tables_.size(); ++i) {
    const Table& t = *tables_[tables_.size() - 1 - i];
    v.tables[i] = {t.data.get(), t.lines, &t.layout};
  }
  v.age.now = static_cast<std::uint32_t>(clock_) & ((1U << t_) - 1);
  v.age.window = config_.ticks_per_window;
  v.tick_slot = static_cast<std::uint32_t>(clock_ % (config_.ticks_per_window + 2));
  const std::uint64_t held = tables_.back()->alive.sum;
  v.room = active_limit_ > held ? active_limit_ - held : 0;
}

}  // namespace kdedup::filter
