// Timer filter: growth in place. An active about to fill is copied into m
// times its lines (expand()), when and by how much maybe_expand() decides,
// on the window's schedule (schedule_factor()); seed 000 §5, "Growth in
// place" in timer_filter.h.

#include <limits>

#include "timer_cells.h"

namespace kdedup::filter {

bool TimerFilter::maybe_expand() {
  // Runs at every tick: the usual answer (room for more than a few ticks)
  // comes from a few compares.
  SubFilter& a = *subs_.back();
  // A shrunk one keeps its shape (expand()), which needs an even hash range.
  if (config_.growth != Growth::kDensity || overfull_ || (a.shrunk() && a.span % 2 != 0) ||
      a.share < 1.0 || a.splits.size() >= kMaxSplits) {
    return false;
  }
  const std::uint32_t window = config_.ticks_per_window;
  // Copies make room only as the entries they copy expire: not before the
  // stream's first window has turned over (nothing expires in it).
  if (history() <= window) return false;
  // At the start of a bucket of the window counts (every tick but with the
  // longest windows), before this tick's first insertion: the entries it
  // copies are those of the earlier buckets (SubFilter::copies_before).
  if (clock_ % a.alive.width != 0 || tick_inserts_ != 0) return false;
  const Tick horizon = growth_horizon();
  // Over at least two ticks: with the shortest windows (a 4-bit filter's
  // tick is a ninth of its window) one tick can insert a quarter more than
  // the rest (the stream's first tick, all new, leaves a window later and
  // its popular identities come straight back, every window), and a
  // steady filter shrunk to 10% over what it holds doubled on it.
  const double rate = growth_rate(2);
  if (!(rate > 0)) return false;
  const double lambda = active_lambda();
  if (!(lambda > 0)) return false;
  const double room = capacity(a, lambda) - static_cast<double>(a.alive.sum);
  // Past its limit already (the target fell): the first insertion seals it.
  // Ahead by part of the growth horizon: the earlier, the more room is left
  // that each line copied multiplies, and the smaller the factor. On a
  // steep climb (a rate that would more than double what the window
  // holds) by all of it; else by kGentleAheadShare of it (at 16 bits, 128
  // ticks): a climb to twice the rate over a window, expanded with the room
  // of kExpandAhead ticks left, needed the copies alone to keep up and took
  // 3 for just over 2 (2.01x, docs/performance.md, "A gentle climb:
  // expand while room is left"). (Not the whole horizon: on the ripples
  // of a steady stream the identities of its first ticks leave together
  // and come back, every window.) Only on a climb: a rate that would bring
  // more than kGrowthHeadroom x what the window holds (a steady filter at
  // its limit, a few ticks of room left at each tick, would otherwise run
  // the tests below at every tick: 6% of filter_bench's batch rate at 1 MiB,
  // whose ticks bring 420 identities each).
  const double soon = static_cast<double>(horizon);
  const double brings = rate * static_cast<double>(window + 1);
  const double holds = static_cast<double>(alive_total());
  const bool steep = brings > kSteepClimb * holds;
  const double lead = steep ? 1.0 : brings > kGrowthHeadroom * holds ? kGentleAheadShare : 0.0;
  const double ahead = std::max(kExpandAhead, lead * soon);
  if (room >= ahead * rate || !(room > 0)) return false;
  // The window test reads a steep climb's own rate too: the last two
  // buckets' (the horizon's still holds the ticks before the climb).
  const double climb_rate = steep ? std::max(rate, recent_rate(2 * a.alive.width)) : rate;
  const std::uint64_t width = a.alive.width;
  const std::uint64_t b_now = clock_ / width + 1;
  // After an expansion by m every entry held now counts m times (copies),
  // and so does the room it frees when it expires. The room must keep up
  // with the insertions at the current rate: over the next `horizon` ticks,
  // in which the oldest entries leave, and, with kFoldHeadroom over it,
  // over a window, in which all of them do, up to what the window can hold
  // (domain_bound(): a burst of repeats brings new identities fast at first,
  // and fewer as the domain fills). m is 5-smooth, so that a later fold
  // finds divisors.
  const std::uint64_t b_leave = std::min(b_now, (clock_ + horizon - window) / width);
  const double near = rate * soon / (room + a.copies_before(b_leave));
  const double bound = domain_bound();
  const double far =
      std::min(climb_rate * static_cast<double>(window + 1), bound) / (room + counted(a));
  // The entries that leave keep up with the rate, over the next ticks and
  // over a window, and this tick fits (with kGrowthHeadroom to spare): a
  // steady stream at its limit, which frees a tick's worth at every tick.
  if (near <= 1.0 && far <= 1.0 && room >= kGrowthHeadroom * rate) return false;
  // Both assume the worst of a burst of repeats: near that the rate holds
  // for W / 8 ticks, far that the window reaches the domain while every
  // copy is still held. Followed tick by tick, new identities come fewer
  // as the domain fills, and the copies leave meanwhile: when that fits the
  // room (within the growth headroom, schedule_factor()), the active
  // waits, as long as the room lasts kExpandAhead ticks at the climb's
  // rate, so that a later tick expands it if the room does run short. (A
  // second expansion by 2 a few ticks after a first one held twice the
  // memory the burst needed: docs/performance.md, "A burst of repeats at
  // every scale".) Not beside a sealed sub-filter, on a steep climb: the
  // expansion also gives it the room its fold waits for (fold_drained()).
  // Short of one, beside a sealed sub-filter too: the lead of
  // kGentleAheadShare is for a climb the room cannot follow (a Zipf
  // stream's first window, whose sealed sub-filters still drained, read a
  // far of 1.01 with room for six ticks, and doubled to 2.20x).
  const double schedule = schedule_factor(a, room, climb_rate, bound);
  if ((subs_.size() == 1 || !steep) && room >= kExpandAhead * climb_rate &&
      schedule <= kGrowthHeadroom) {
    return false;
  }
  // The factor keeps up with both; where the domain does not cap the
  // window (new identities, not repeats), with the schedule too: near reads
  // the rate over W / 8 ticks, and on a step that a 4-bit filter's tick
  // takes whole, its successor expanded by 2 twice within a window (a 10x
  // step, docs/performance.md). (Capped where no expansion could be worth
  // it: the check below.)
  double need = std::max(near, kFoldHeadroom * far);
  if (climb_rate * static_cast<double>(window + 1) <= bound) need = std::max(need, schedule);
  const auto factor =
      smooth_ceil(static_cast<std::uint64_t>(std::clamp(std::ceil(need), 2.0, 1024.0)));
  // Worth it only when it holds less than the seal path would for the next
  // window: the active (sealed) and a new sub-filter sized from the rate,
  // the rate not capped at kMaxGrowthStep x the window (header, "Growth in
  // place").
  const GrowthTarget want = growth_target(std::numeric_limits<double>::infinity());
  if (want.probe) return false;
  const std::uint64_t max_lines = std::max(floor_lines(), config_.max_bytes / kLineBytes);
  if ((factor - 1) * a.lines > growth_lines(want) || factor * a.lines > max_lines) return false;
  return expand_charged(a, factor);
}

bool TimerFilter::expand_charged(SubFilter& a, std::uint64_t factor) {
  const std::uint64_t extra = (factor - 1) * a.lines * kLineBytes;
  if (budget_) {
    if (const double part = budget_part();
        part >= 0 && static_cast<double>(held_bytes() + extra) > part) {
      return false;  // over budget, this filter holds its share of it already
    }
    if (!budget_->try_reserve(extra)) return false;
  }
  bool done = false;
  switch (config_.timer_bits) {
    case 4:
      done = expand<4>(a, factor);
      break;
    case 8:
      done = expand<8>(a, factor);
      break;
    default:
      done = expand<16>(a, factor);
      break;
  }
  if (budget_) {
    if (done) {
      a.charge.add_reserved(extra);
    } else {
      budget_->release(extra);
    }
  }
  return done;
}

double TimerFilter::schedule_factor(const SubFilter& a, double room, double rate,
                                    double bound) const {
  // After an expansion by m every entry held now counts m times until it
  // leaves, and what arrives counts once: the active keeps up at every
  // tick t of the next window when m (room + the copies that have left by
  // t) >= what has arrived by t. On draws from a domain of D = `bound`
  // (domain_bound()), q queries a tick bring q (1 - N / D) new identities,
  // N the window's content: the rate now gives q, and N follows what
  // arrives and what leaves (each bucket a window after it). Without
  // repeats the rate holds. Bucket by bucket (every sub-filter's buckets
  // have the same width).
  const Tick window = config_.ticks_per_window;
  const std::uint64_t width = a.alive.width;
  const double held = static_cast<double>(alive_total());
  const bool domain = std::isfinite(bound) && bound > held;
  const double queries = domain ? rate / (1.0 - held / bound) : rate;
  // Buckets before `kept` have left by tick t.
  std::uint64_t kept = a.alive.first_at(clock_ + 1, window);
  double left = 0;
  for (const auto& s : subs_) left += static_cast<double>(s->alive.sum_buckets(0, kept));
  double copies_left = a.copies_before(kept), arrived = 0, most = 0;
  for (Tick t = 1; t <= window + 1;) {
    // The tick at which bucket `kept` leaves too.
    const Tick next = std::min<Tick>(window + 2, (kept + 1) * width + window - clock_);
    const double in_window = held - left + arrived;
    arrived += static_cast<double>(next - t) *
               (domain ? queries * std::max(0.0, 1.0 - in_window / bound) : rate);
    most = std::max(most, arrived / (room + copies_left));
    for (const auto& s : subs_) left += static_cast<double>(s->alive.sum_buckets(kept, kept + 1));
    copies_left += a.copies_in(kept);
    ++kept;
    t = next;
  }
  return most;
}

template <unsigned Bits>
bool TimerFilter::expand(SubFilter& s, std::uint64_t factor) {
  // Line j of L lines is the multiply-high reduction of a fingerprint's high
  // half, so in factor x L lines that fingerprint's line is one of
  // j * factor .. j * factor + factor - 1, and its probe cells do not depend
  // on the line count: a copy of line j in each of them keeps every live
  // entry where a query looks (no false negative). The copies are cleared
  // of dead codes (as the scrub would), and each line counts as just
  // visited by the sweep, as after a fold.
  // A shrunk sub-filter (L lines over an even hash range S) keeps its shape:
  // factor x L lines over factor x S. Hash line h of the new range is the
  // child of v = h / factor, and h >= factor x L exactly when v >= L, so the
  // line h is held in, h - factor x S / 2, is a child of v - S / 2, the line
  // v is held in: the same copies serve, and the doubled lines are the
  // copies of the doubled ones, with their two hash lines' load (fpp_of).
  const std::uint64_t lines = s.lines * factor;
  std::unique_ptr<std::uint8_t[], SubFilter::Free> data(allocate_cells(lines * kLineBytes));
  if (!data) return false;
  const std::uint32_t now_code = static_cast<std::uint32_t>(clock_ % modulus_) + 1;
  const LiveInterval live = live_interval(now_code, config_.ticks_per_window, modulus_);
  for (std::uint64_t j = 0; j < s.lines; ++j) {
    std::uint8_t* out = data.get() + j * factor * kLineBytes;
    std::memcpy(out, s.line(j), kLineBytes);
    scrub_line<Bits>(out, live);
    for (std::uint64_t c = 1; c < factor; ++c) std::memcpy(out + c * kLineBytes, out, kLineBytes);
  }
  s.take_cells(std::move(data), s.span * factor, lines, clock_, period_, Bits);
  s.splits.push_back({clock_, static_cast<std::uint32_t>(factor)});
  return true;
}

}  // namespace kdedup::filter
