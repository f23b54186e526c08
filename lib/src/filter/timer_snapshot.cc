// Timer filter: serialized state (envelope kind FilterType::kTimer, versions 1 and 2)
// and its validation on restore.

#include "kdedup/common/bytes.h"
#include "kdedup/filter/config_codec.h"
#include "timer_cells.h"

namespace kdedup::filter {

std::string TimerFilter::serialize() const {
  // The payload is written once, after room for the envelope header, into a
  // buffer reserved at its final size: the cell arrays (nearly all the bytes,
  // up to max_bytes per sub-filter) are copied exactly once and never moved.
  std::uint64_t tail = 0;
  bool shrunk = false;
  for (const auto& s : subs_) {
    shrunk = shrunk || s->shrunk();
    tail += 8 * sizeof(std::uint64_t) + sizeof(std::uint32_t) +
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
    if (shrunk) w.put<std::uint64_t>(s->span);
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
  return seal_envelope_in_place(static_cast<std::uint16_t>(FilterType::kTimer),
                                shrunk ? kVersion : std::uint16_t{1}, std::move(out));
}

Result<std::unique_ptr<SlidingFilter>> TimerFilter::restore(std::string_view payload,
                                                            std::uint16_t version) {
  auto bad = [](const std::string& what) { return fail("timer filter state: " + what); };
  if (version != 1 && version != kVersion) {
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
    auto span = version >= 2 ? r.get<std::uint64_t>("hash range") : lines;
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
  if (auto end = r.expect_end("timer filter state"); !end) return tl::unexpected(end.error());
  f->history_from_ = f->first_tick_;
  // A snapshot of an oversized filter (an old capacity-sized one, or one
  // taken at the peak of a burst) folds to what its content and rate need,
  // as it would at its next tick.
  f->maybe_fold();
  f->refresh_threshold();
  return std::unique_ptr<SlidingFilter>(std::move(f));
}

}  // namespace kdedup::filter
