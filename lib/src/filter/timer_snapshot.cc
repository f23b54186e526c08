// Timer filter: serialized state (envelope kind FilterType::kTimer, versions 1 to 4)
// and its validation on restore.

#include <cmath>

#include "kdedup/common/bytes.h"
#include "kdedup/filter/config_codec.h"
#include "timer_cells.h"

namespace kdedup::filter {

namespace {

// The expansion record of a sub-filter in format 3 (count, then tick and
// factor of each) into `out` (SubFilter::splits); what is wrong with it,
// or "".
template <class Split>
std::string read_expansions(ByteReader& r, Tick clock, std::size_t most, std::vector<Split>& out) {
  auto n = r.get<std::uint32_t>("expansion count");
  if (!n) return "truncated sub-filter header";
  if (*n > most) return "expansion count " + std::to_string(*n) + " out of range";
  for (std::uint32_t j = 0; j < *n; ++j) {
    auto tick = r.get<Tick>("expansion tick");
    auto factor = r.get<std::uint32_t>("expansion factor");
    if (!tick || !factor) return "truncated expansion";
    if (*tick > clock || (!out.empty() && *tick < out.back().tick)) {
      return "expansion ticks out of order or after the clock";
    }
    if (*factor < 2) return "expansion factor " + std::to_string(*factor) + " below 2";
    out.push_back({*tick, *factor});
  }
  return "";
}

// Each expansion multiplied the line count and the hash range by its
// factor, and a shrunk sub-filter's range before its first expansion was
// even (expand() keeps its shape): what is wrong with that, or "".
template <class Split>
std::string expansions_error(const std::vector<Split>& splits, std::uint64_t lines,
                             std::uint64_t span) {
  std::uint64_t product = 1;
  for (const auto& x : splits) {
    if (x.factor > lines / product || lines % (product * x.factor) != 0 ||
        span % (product * x.factor) != 0) {
      return "expansion factors do not divide lines " + std::to_string(lines) + " and hash range " +
             std::to_string(span);
    }
    product *= x.factor;
  }
  if (!splits.empty() && span != lines && (span / product) % 2 != 0) {
    return "an expanded shrunk sub-filter whose hash range was odd";
  }
  return "";
}

// Reads the counts of `count`'s ring (sized by init()) and places it at
// `clock`, counting over `span` ticks: its oldest bucket, read before the
// ring as `first`, must be where advance() keeps it. `what` names the ring
// in the error; "" when the ring is read and placed.
std::string read_window_count(ByteReader& r, std::uint64_t first, Tick clock, std::uint64_t span,
                              const std::string& what, WindowCount& count) {
  if (count.ring.size() > r.remaining() / 4) return what + " exceeds input";
  count.sum = 0;
  for (auto& c : count.ring) {
    c = *r.get<std::uint32_t>("window counts");
    count.sum += c;
  }
  if (first != count.first_at(clock, span)) return what + " position does not match the clock";
  count.first = first;
  count.current = count.slot_at(clock);
  return "";
}

}  // namespace

// Format 4's growth state, after the sub-filters: what the growth rules
// remember beyond the cells and the window counts. Without it a filter
// restored at a burst's start expanded for the first ticks' rate (the query
// counts that bound it to the domain were empty: 2.89x the pre-sized bytes
// where the filter never restarted held 1.45x), and one restored in an
// echo shrank and expanded again (2.36x).
class TimerFilter::GrowthState {
 public:
  // A filter that never took a record holds the state make_empty() gives.
  static bool needed(const TimerFilter& f) {
    return f.insertions_ != 0 || f.arrivals_ != 0 || f.queries_->sum != 0;
  }

  static void write(const TimerFilter& f, ByteWriter& w) {
    for (const auto& s : f.subs_) {
      w.put<Tick>(s->echo_until);
      w.put<double>(s->share);
    }
    w.put<Tick>(f.history_from_);
    w.put<std::uint64_t>(f.tick_inserts_);
    w.put<std::uint64_t>(f.arrivals_ - f.arrivals_booked_);
    w.put<double>(f.arrival_rate_);
    w.put<std::uint64_t>(f.rejected_ - f.rejected_booked_);
    w.put<double>(f.rejected_rate_);
    w.put<std::uint8_t>(f.overfull_ ? 1 : 0);
    w.put<std::uint64_t>(f.overfull_limit_);
    w.put<std::uint64_t>(f.queries_->first);
    w.put<std::uint32_t>(static_cast<std::uint32_t>(f.queries_->ring.size()));
    for (std::uint32_t c : f.queries_->ring) w.put<std::uint32_t>(c);
  }

  // Reads it into `f`, whose sub-filters and clock are restored; what is
  // wrong with it, or "".
  static std::string read(TimerFilter& f, ByteReader& r) {
    const Tick window = f.config_.ticks_per_window;
    for (auto& s : f.subs_) {
      auto echo = r.get<Tick>("echo hold");
      auto share = r.get<double>("share of the target");
      if (!echo || !share) return "truncated growth state";
      if (*echo > f.clock_ + window + 1) return "echo hold beyond a window after the clock";
      if (!(*share > 0 && *share <= 1)) return "share of the target outside (0, 1]";
      s->echo_until = *echo;
      s->share = *share;
    }
    auto history_from = r.get<Tick>("history start");
    auto tick_inserts = r.get<std::uint64_t>("tick insertions");
    auto arrivals = r.get<std::uint64_t>("tick arrivals");
    auto arrival_rate = r.get<double>("arrival rate");
    auto rejected = r.get<std::uint64_t>("tick rejections");
    auto rejected_rate = r.get<double>("rejection rate");
    auto overfull = r.get<std::uint8_t>("overfull flag");
    auto overfull_limit = r.get<std::uint64_t>("overfull limit");
    auto first = r.get<std::uint64_t>("query counts first bucket");
    auto ring_size = r.get<std::uint32_t>("query counts ring size");
    if (!history_from || !tick_inserts || !arrivals || !arrival_rate || !rejected ||
        !rejected_rate || !overfull || !overfull_limit || !first || !ring_size) {
      return "truncated growth state";
    }
    if (*history_from > f.clock_) return "history start after the clock";
    if (*tick_inserts > f.insertions_) return "the tick's insertions exceed all insertions";
    const auto rate_ok = [](double v) { return std::isfinite(v) && v >= 0; };
    if (!rate_ok(*arrival_rate) || !rate_ok(*rejected_rate)) return "rate not finite or negative";
    if (*overfull > 1) return "overfull flag not 0 or 1";
    if (*ring_size != f.queries_->ring.size()) {
      return "query counts ring size does not match the config";
    }
    const std::string why =
        read_window_count(r, *first, f.clock_, f.queries_span_, "query counts ring", *f.queries_);
    if (!why.empty()) return why;
    f.history_from_ = *history_from;
    f.tick_inserts_ = *tick_inserts;
    f.arrivals_ = *arrivals;
    f.arrival_rate_ = *arrival_rate;
    f.rejected_ = *rejected;
    f.rejected_rate_ = *rejected_rate;
    f.overfull_ = *overfull == 1;
    f.overfull_limit_ = *overfull_limit;
    return "";
  }
};

std::string TimerFilter::serialize() const {
  // The payload is written once, after room for the envelope header, into a
  // buffer reserved at its final size: the cell arrays (nearly all the bytes,
  // up to max_bytes per sub-filter) are copied exactly once and never moved.
  std::uint64_t tail = 0;
  bool shrunk = false, split = false;
  for (const auto& s : subs_) {
    shrunk = shrunk || s->shrunk();
    split = split || !s->splits.empty();
    tail += 8 * sizeof(std::uint64_t) + 2 * sizeof(std::uint32_t) +
            s->splits.size() * (sizeof(Tick) + sizeof(std::uint32_t)) +
            s->alive.ring.size() * sizeof(std::uint32_t) + s->bytes();
  }
  // The growth state (at most a few KiB) is written first, to size the
  // buffer.
  const bool growth = GrowthState::needed(*this);
  std::string growth_state;
  if (growth) {
    ByteWriter g(growth_state);
    GrowthState::write(*this, g);
  }
  tail += growth_state.size();
  const std::uint16_t version = growth   ? kVersion
                                : split  ? kVersionSplit
                                : shrunk ? kVersionShrunk
                                         : std::uint16_t{1};
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
    if (version >= kVersionShrunk) w.put<std::uint64_t>(s->span);
    if (version >= kVersionSplit) {
      w.put<std::uint32_t>(static_cast<std::uint32_t>(s->splits.size()));
      for (const auto& x : s->splits) {
        w.put<Tick>(x.tick);
        w.put<std::uint32_t>(x.factor);
      }
    }
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
  w.put_bytes(growth_state);
  return seal_envelope_in_place(static_cast<std::uint16_t>(FilterType::kTimer), version,
                                std::move(out));
}

Result<std::unique_ptr<SlidingFilter>> TimerFilter::restore(std::string_view payload,
                                                            std::uint16_t version) {
  auto bad = [](const std::string& what) { return fail("timer filter state: " + what); };
  if (version < 1 || version > kVersion) {
    return bad("unsupported format version " + std::to_string(version));
  }
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
  auto made = make_empty(*config);  // the real sub-filters come from the input
  if (!made) return bad(made.error().message);
  std::unique_ptr<TimerFilter> f = std::move(*made);
  if (*k != f->k_) return bad("k " + std::to_string(*k) + " does not match the config");
  f->clock_ = *clock;
  f->first_tick_ = *first_tick;
  f->insertions_ = *insertions;
  const std::uint32_t window = config->ticks_per_window;
  for (std::uint32_t i = 0; i < *count; ++i) {
    auto lines = r.get<std::uint64_t>("lines");
    auto span = version >= kVersionShrunk ? r.get<std::uint64_t>("hash range") : lines;
    std::vector<SubFilter::Split> splits;
    if (version >= kVersionSplit) {
      if (const std::string why = read_expansions(r, *clock, kMaxSplits, splits); !why.empty()) {
        return bad(why);
      }
    }
    auto created = r.get<Tick>("created");
    auto swept = r.get<std::uint64_t>("swept");
    auto last_insert = r.get<Tick>("last insert");
    auto inserts = r.get<std::uint64_t>("inserts");
    auto nonempty = r.get<std::uint64_t>("nonempty");
    auto first = r.get<std::uint64_t>("window first bucket");
    auto ring_size = r.get<std::uint32_t>("window ring size");
    if (!lines || !span || !created || !swept || !last_insert || !inserts || !nonempty || !first ||
        !ring_size) {
      return bad("truncated sub-filter header");
    }
    if (*lines == 0 || *lines > r.remaining() / kLineBytes) {
      return bad("sub-filter size exceeds input");
    }
    if (*span < *lines || *span - *lines > *lines) {
      return bad("hash range " + std::to_string(*span) + " outside lines " +
                 std::to_string(*lines) + " .. twice that");
    }
    if (*created > *clock || *last_insert > *clock || *last_insert < *created) {
      return bad("sub-filter ticks inconsistent with the clock");
    }
    if (*nonempty > *lines * f->cells_per_line_) return bad("live cell count exceeds cells");
    if (const std::string why = expansions_error(splits, *lines, *span); !why.empty()) {
      return bad(why);
    }
    auto s = std::make_unique<SubFilter>();
    s->alive.init(window);
    if (*ring_size != s->alive.ring.size()) return bad("window ring size does not match config");
    for (const auto& x : splits) {
      if (x.tick % s->alive.width != 0) return bad("expansion tick not at a window bucket");
    }
    s->splits = std::move(splits);
    if (const std::string why =
            read_window_count(r, *first, *clock, window, "window ring", s->alive);
        !why.empty()) {
      return bad(why);
    }
    if (s->alive.sum > *inserts) return bad("window count exceeds insertions");
    auto cells = r.get_bytes(*lines * kLineBytes, "cells");
    if (!cells) return bad("truncated cells");
    s->data.reset(allocate_cells(*lines * kLineBytes));
    if (!s->data) return bad("cannot allocate " + std::to_string(*lines * kLineBytes) + " bytes");
    std::memcpy(s->data.get(), cells->data(), cells->size());
    s->lines = *lines;
    s->span = *span;
    s->created = *created;
    s->swept = *swept;
    s->cursor = *swept % *lines;
    s->last_insert = *last_insert;
    s->inserts = *inserts;
    s->nonempty = *nonempty;
    // The live-cell count must match the cells (a cheap full consistency check).
    const std::uint64_t counted = count_nonempty(s->data.get(), s->bytes(), config->timer_bits);
    if (counted != s->nonempty) return bad("live cell count does not match the cells");
    if (s->swept < s->required(*clock, f->period_) ||
        s->swept > s->required(*clock + 1, f->period_)) {
      return bad("scrub position inconsistent with the clock");
    }
    f->subs_.push_back(std::move(s));
  }
  f->history_from_ = f->first_tick_;
  f->queries_->advance(f->clock_, f->queries_span_);
  if (version >= kVersion) {
    if (const std::string why = GrowthState::read(*f, r); !why.empty()) return bad(why);
  }
  if (auto end = r.expect_end("timer filter state"); !end) return tl::unexpected(end.error());
  // A snapshot of an older format may be oversized (capacity-sized, or
  // taken at the peak of a burst before its growth state was kept): it
  // folds to what its content and rate need now. One of format 4 carries
  // what the growth rules read, and folds at its next tick as the filter it
  // was taken from would have (a fold now, with the tick's queries already
  // counted, would differ from the one at the tick's start).
  if (version < kVersion) f->maybe_fold();
  f->refresh_threshold();
  return std::unique_ptr<SlidingFilter>(std::move(f));
}

}  // namespace kdedup::filter
