// Compact filter: serialized state (format version 2: lines of quotient-coded
// buckets) and its validation on restore. Version 1 (the cuckoo buckets) is
// refused; compact_filter.h says why that is safe.

#include <algorithm>
#include <cstring>

#include "compact_table.h"
#include "kdedup/common/bytes.h"
#include "kdedup/filter/compact_filter.h"
#include "kdedup/filter/config_codec.h"

namespace kdedup::filter {
namespace {

constexpr std::size_t kOverflowBytes = 4 + 8 + 4 + 4 + 4 + 1;
constexpr std::uint8_t kOverfull = 1, kSaturated = 2, kRefitted = 4;

}  // namespace

std::string CompactFilter::serialize() const {
  // The payload is written once, after room for the envelope header, into a
  // buffer reserved at its final size (the tables are nearly all the bytes).
  std::uint64_t tail = 8 + overflow_.size() * kOverflowBytes + tick_fpp_.size() * 12;
  for (const auto& t : tables_) tail += 51 + t->alive.ring.size() * 4 + t->bytes();
  std::string out(kEnvelopeHeaderBytes, '\0');
  ByteWriter w(out);
  write_config(w, config_);
  w.put<std::uint8_t>(static_cast<std::uint8_t>(base_.r));
  w.put<std::uint8_t>(static_cast<std::uint8_t>(t_));
  w.put<Tick>(clock_);
  w.put<Tick>(first_tick_);
  w.put<std::uint64_t>(insertions_);
  w.put<std::uint8_t>(static_cast<std::uint8_t>(
      (overfull_ ? kOverfull : 0) | (saturated_ ? kSaturated : 0) | (refitted_ ? kRefitted : 0)));
  for (double p : tick_fpp_) w.put<double>(p);
  for (std::uint32_t r : rejected_) w.put<std::uint32_t>(r);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(tables_.size()));
  out.reserve(out.size() + tail + kEnvelopeTrailerBytes);
  for (const auto& t : tables_) {
    const compact::Shape& s = t->layout.shape;
    w.put<std::uint8_t>(static_cast<std::uint8_t>(s.r));
    w.put<std::uint8_t>(static_cast<std::uint8_t>(s.S));
    w.put<std::uint8_t>(static_cast<std::uint8_t>(s.B));
    w.put<std::uint64_t>(t->lines);
    w.put<Tick>(t->created);
    w.put<std::uint64_t>(t->swept);
    w.put<Tick>(t->last_insert);
    w.put<std::uint64_t>(t->inserts);
    w.put<std::uint64_t>(t->nonempty);
    for (std::uint32_t c : t->alive.ring) w.put<std::uint32_t>(c);
    w.put_bytes(std::string_view(reinterpret_cast<const char*>(t->data.get()), t->bytes()));
  }
  w.put<std::uint32_t>(static_cast<std::uint32_t>(overflow_.size()));
  for (const Overflow& o : overflow_) {
    w.put<std::uint32_t>(o.table);
    w.put<std::uint64_t>(o.line);
    w.put<std::uint32_t>(o.q);
    w.put<std::uint32_t>(o.rem);
    w.put<std::uint32_t>(o.tag);
    w.put<std::uint8_t>(static_cast<std::uint8_t>(o.bin));
  }
  return seal_envelope_in_place(static_cast<std::uint16_t>(FilterType::kCompact),
                                kCompactStateVersion, std::move(out));
}

namespace {

Error bad(const std::string& what) { return Error{"compact filter state: " + what}; }

}  // namespace

Result<std::unique_ptr<SlidingFilter>> CompactFilter::restore(std::string_view payload,
                                                              std::uint16_t version) {
  if (version != kCompactStateVersion) {
    return tl::unexpected(bad("format version " + std::to_string(version) +
                              " is not read by this version (" +
                              std::to_string(kCompactStateVersion) +
                              "; version 1 held cuckoo buckets): the partition is rebuilt "
                              "from its input"));
  }
  ByteReader r(payload);
  auto made = restore_header(r);
  if (!made) return tl::unexpected(made.error());
  std::unique_ptr<CompactFilter> f = std::move(*made);
  auto count = r.get<std::uint32_t>("table count");
  if (!count) return tl::unexpected(bad("truncated header"));
  if (*count == 0 || *count > compact::kHardMaxTables) {
    return tl::unexpected(bad("table count " + std::to_string(*count) + " out of range"));
  }
  for (std::uint32_t i = 0; i < *count; ++i) {
    auto t = f->restore_table(r, i);
    if (!t) return tl::unexpected(t.error());
    f->tables_.push_back(std::move(*t));
  }
  if (auto o = f->restore_overflow(r); !o) return tl::unexpected(o.error());
  if (auto end = r.expect_end("compact filter state"); !end) return tl::unexpected(end.error());
  f->refresh_limit();
  return std::unique_ptr<SlidingFilter>(std::move(f));
}

Result<std::unique_ptr<CompactFilter>> CompactFilter::restore_header(ByteReader& r) {
  // The config, then the filter-wide fields; the empty shell is rebuilt from
  // the config and the derived fields checked against it.
  auto config = read_config(r);
  if (!config) return tl::unexpected(config.error());
  if (config->type != FilterType::kCompact) return tl::unexpected(bad("wrong filter type"));
  auto base_bits = r.get<std::uint8_t>("remainder bits");
  auto t_bits = r.get<std::uint8_t>("tag bits");
  auto clock = r.get<Tick>("clock");
  auto first_tick = r.get<Tick>("first tick");
  auto insertions = r.get<std::uint64_t>("insertions");
  auto flags = r.get<std::uint8_t>("flags");
  if (!base_bits || !t_bits || !clock || !first_tick || !insertions || !flags) {
    return tl::unexpected(bad("truncated header"));
  }
  if (config->ticks_per_window > kMaxCompactTicksPerWindow) {
    return tl::unexpected(bad("ticks_per_window"));
  }
  if ((*flags & ~(kOverfull | kSaturated | kRefitted)) != 0) {
    return tl::unexpected(bad("unknown flags"));
  }
  if (*first_tick > *clock) return tl::unexpected(bad("first tick after clock"));
  const std::uint32_t window = config->ticks_per_window;
  std::vector<double> tick_fpp(std::uint64_t{window} + 2);
  for (double& p : tick_fpp) {
    auto v = r.get<double>("tick estimates");
    if (!v) return tl::unexpected(bad("truncated tick estimates"));
    if (!(*v >= 0.0 && *v <= 1.0)) return tl::unexpected(bad("tick estimate out of range"));
    p = *v;
  }
  std::vector<std::uint32_t> rejected(std::uint64_t{window} + 2);
  for (std::uint32_t& x : rejected) {
    auto v = r.get<std::uint32_t>("rejections");
    if (!v) return tl::unexpected(bad("truncated rejections"));
    x = *v;
  }
  auto made = make_empty(*config);
  if (!made) return tl::unexpected(bad(made.error().message));
  std::unique_ptr<CompactFilter> f = std::move(*made);
  if (*base_bits != f->base_.r || *t_bits != f->t_) {
    return tl::unexpected(bad("bit widths do not match the config"));
  }
  f->clock_ = *clock;
  f->first_tick_ = *first_tick;
  f->insertions_ = *insertions;
  f->overfull_ = (*flags & kOverfull) != 0;
  f->saturated_ = (*flags & kSaturated) != 0;
  f->refitted_ = (*flags & kRefitted) != 0;
  f->tick_fpp_ = std::move(tick_fpp);
  f->rejected_ = std::move(rejected);
  return f;
}

Result<std::unique_ptr<CompactFilter::Table>> CompactFilter::restore_table(ByteReader& r,
                                                                           std::uint32_t i) const {
  // One table: its header, its window counts and its lines, each line one
  // the codec writes and their entries adding up to the recorded count.
  auto rb = r.get<std::uint8_t>("table remainder bits");
  auto slots = r.get<std::uint8_t>("slots per line");
  auto buckets = r.get<std::uint8_t>("buckets per line");
  auto lines = r.get<std::uint64_t>("lines");
  auto created = r.get<Tick>("created");
  auto swept = r.get<std::uint64_t>("swept");
  auto last_insert = r.get<Tick>("last insert");
  auto inserts = r.get<std::uint64_t>("inserts");
  auto nonempty = r.get<std::uint64_t>("nonempty");
  if (!rb || !slots || !buckets || !lines || !created || !swept || !last_insert || !inserts ||
      !nonempty) {
    return tl::unexpected(bad("truncated table header"));
  }
  const compact::Shape shape{*rb, *slots, *buckets};
  if (!compact::fits(shape, t_) || shape.r < kMinRemainderBits) {
    return tl::unexpected(bad("table shape out of range"));
  }
  if (*lines < 2 || *lines > r.remaining() / compact::kLineBytes) {
    return tl::unexpected(bad("table size exceeds input"));
  }
  if (*created > clock_ || *last_insert > clock_ || *last_insert < *created) {
    return tl::unexpected(bad("table ticks inconsistent with the clock"));
  }
  const std::uint32_t window = config_.ticks_per_window;
  auto t = std::make_unique<Table>();
  t->layout = compact::Layout::of(shape, t_);
  t->lines = *lines;
  t->alive.init(window);
  if (t->alive.ring.size() > r.remaining() / 4) {
    return tl::unexpected(bad("window counts exceed input"));
  }
  for (std::uint32_t& c : t->alive.ring) {
    c = *r.get<std::uint32_t>("window counts");
    t->alive.sum += c;
  }
  if (t->alive.sum > *inserts) return tl::unexpected(bad("window count exceeds insertions"));
  if (t->alive.at(clock_ + 1) != 0) {
    return tl::unexpected(bad("window counts do not match the clock"));
  }
  for (Tick x = clock_ - std::min<Tick>(clock_, window); x < *created; ++x) {
    if (t->alive.at(x) != 0) {
      return tl::unexpected(bad("window counts before the table was created"));
    }
  }
  auto cells = r.get_bytes(t->bytes(), "lines");
  if (!cells) return tl::unexpected(bad("truncated lines"));
  t->data.reset(compact::allocate_lines(t->lines));
  if (!t->data) {
    return tl::unexpected(bad("cannot allocate " + std::to_string(t->bytes()) + " bytes"));
  }
  std::memcpy(static_cast<void*>(t->data.get()), cells->data(), cells->size());
  t->created = *created;
  t->swept = *swept;
  t->last_insert = *last_insert;
  t->inserts = *inserts;
  t->nonempty = *nonempty;
  if (t->swept < t->required(clock_, period_) || t->swept > t->required(clock_ + 1, period_)) {
    return tl::unexpected(bad("scrub position inconsistent with the clock"));
  }
  const compact::Age age{static_cast<std::uint32_t>(clock_) & ((1U << t_) - 1), window};
  std::uint64_t held = 0;
  for (std::uint64_t j = 0; j < t->lines; ++j) {
    unsigned n = 0;
    if (!compact::consistent(t->line(j), t->layout, age, n)) {
      return tl::unexpected(bad("line " + std::to_string(j) + " of table " + std::to_string(i) +
                                " is not one the codec writes"));
    }
    held += n;
  }
  if (held != t->nonempty) {
    return tl::unexpected(bad("entries inconsistent with the recorded count"));
  }
  return t;
}

Status CompactFilter::restore_overflow(ByteReader& r) {
  // The overflow list: every entry in a table, line, bucket and remainder
  // range of its table, and alive at the clock.
  auto overflow = r.get<std::uint32_t>("overflow size");
  if (!overflow) return tl::unexpected(bad("truncated overflow"));
  if (*overflow > compact::kMaxOverflow + kOverflowSeal) {
    return tl::unexpected(bad("overflow size out of range"));
  }
  if (*overflow > r.remaining() / kOverflowBytes) {
    return tl::unexpected(bad("overflow exceeds input"));
  }
  const compact::Age age{static_cast<std::uint32_t>(clock_) & ((1U << t_) - 1),
                         config_.ticks_per_window};
  for (std::uint32_t i = 0; i < *overflow; ++i) {
    Overflow o;
    o.table = *r.get<std::uint32_t>("overflow table");
    o.line = *r.get<std::uint64_t>("overflow line");
    o.q = *r.get<std::uint32_t>("overflow bucket");
    o.rem = *r.get<std::uint32_t>("overflow remainder");
    o.tag = *r.get<std::uint32_t>("overflow tag");
    o.bin = *r.get<std::uint8_t>("overflow bin");
    const bool table_ok = o.table < tables_.size();
    const Table* t = table_ok ? tables_[o.table].get() : nullptr;
    if (!table_ok || o.line >= t->lines || o.q >= t->layout.shape.B || o.rem > t->layout.rmask ||
        o.tag > t->layout.tmask || !compact::alive(o.tag, t->layout, age)) {
      return tl::unexpected(bad("overflow entry " + std::to_string(i) + " inconsistent"));
    }
    overflow_.push_back(o);
    ++overflow_bins_[o.bin];
  }
  return {};
}

}  // namespace kdedup::filter
