// Compact filter: construction, the test-and-insert paths, statistics. The
// design, its sources and the reasoning behind every constant are in
// compact_filter.h; the line policies of the hot path in compact_kernels.h,
// the clock and its scrub in compact_clock.cc, growth and the budget in
// compact_growth.cc, snapshots in compact_snapshot.cc, the line codec in
// compact_line.h.

#include "kdedup/filter/compact_filter.h"

#include <algorithm>
#include <bit>
#include <cmath>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "compact_kernels.h"
#include "kdedup/filter/simd.h"

namespace kdedup::filter {

using compact::Key;

namespace compact {

Line* allocate_lines(std::uint64_t lines) {
  constexpr std::uint64_t kHuge = 2ULL << 20;
  const std::uint64_t bytes = lines * kLineBytes;
  const bool huge = bytes >= kHuge;
  const std::uint64_t align = huge ? kHuge : kLineBytes;
  const std::uint64_t rounded = (bytes + align - 1) / align * align;
  auto* p = static_cast<Line*>(std::aligned_alloc(align, rounded));
  if (p == nullptr) return nullptr;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (huge) (void)madvise(p, rounded, MADV_HUGEPAGE);  // a hint; failure is harmless
#endif
  std::memset(static_cast<void*>(p), 0, bytes);
  return p;
}

void TickCounts::advance(Tick old, Tick now, std::uint32_t window) {
  if (now - old >= ring.size()) {
    std::fill(ring.begin(), ring.end(), 0);
    sum = 0;
    return;
  }
  for (Tick x = old; x < now; ++x) {
    if (x < window) continue;
    std::uint32_t& c = ring[(x - window) % ring.size()];
    sum -= c;
    c = 0;
  }
}

}  // namespace compact

unsigned compact_fingerprint_bits(double fpp, unsigned tag_bits) {
  return compact::best_shape(CompactFilter::kBudgetShare * fpp, CompactFilter::kFingerprintLoad,
                             tag_bits)
      .r;
}

bool compact_fpp_supported(double fpp, unsigned tag_bits) {
  const compact::Shape s = compact::best_shape(CompactFilter::kBudgetShare * fpp,
                                               CompactFilter::kFingerprintLoad, tag_bits);
  return compact::fpp_at(CompactFilter::kFingerprintLoad, s) <= CompactFilter::kBudgetShare * fpp;
}

// --- construction ------------------------------------------------------------------

CompactFilter::CompactFilter(const FilterConfig& config)
    : config_(config), view_(std::make_unique<View>()) {}
CompactFilter::~CompactFilter() = default;

Result<std::unique_ptr<CompactFilter>> CompactFilter::make_empty(const FilterConfig& config) {
  if (config.type != FilterType::kCompact) {
    return fail("compact filter: config type is not compact");
  }
  const unsigned t = compact_tag_bits(config.ticks_per_window);
  if (config.ticks_per_window == 0 || t == 0) {
    return fail("compact filter: ticks_per_window " + std::to_string(config.ticks_per_window) +
                " out of range (1 .. " + std::to_string(kMaxCompactTicksPerWindow) + ")");
  }
  std::unique_ptr<CompactFilter> f(new CompactFilter(config));
  f->t_ = t;
  f->base_ = compact::best_shape(kBudgetShare * config.fpp, kFingerprintLoad, t);
  if (compact::fpp_at(kFingerprintLoad, f->base_) > kBudgetShare * config.fpp) {
    return fail("compact filter: fpp " + std::to_string(config.fpp) + " needs more than " +
                std::to_string(compact::kMaxRemainder) + "-bit remainders with " +
                std::to_string(t) + "-bit tags");
  }
  f->coarsest_ = f->base_;
  f->target_ = config.fpp;
  f->period_ = (1U << t) - 2 - config.ticks_per_window;  // P = G - 1 >= 1
  f->tick_fpp_.assign(config.ticks_per_window + 2, 0.0);
  f->rejected_.assign(config.ticks_per_window + 2, 0);
  return f;
}

Result<std::unique_ptr<CompactFilter>> CompactFilter::create(const FilterConfig& config) {
  auto made = make_empty(config);
  if (!made) return tl::unexpected(made.error());
  std::unique_ptr<CompactFilter> f = std::move(*made);
  auto table = f->make_table(f->initial_lines(), f->base_, 0);
  if (!table) return fail("compact filter: cannot allocate the first table");
  f->tables_.push_back(std::move(table));
  f->refresh_limit();
  return f;
}

Result<std::unique_ptr<CompactFilter>> CompactFilter::create_presized(const FilterConfig& config) {
  auto made = make_empty(config);
  if (!made) return tl::unexpected(made.error());
  std::unique_ptr<CompactFilter> f = std::move(*made);
  auto table = f->make_table(f->lines_for(static_cast<double>(config.capacity), f->base_, false),
                             f->base_, 0);
  if (!table) return fail("compact filter: cannot allocate the first table");
  f->tables_.push_back(std::move(table));
  f->refresh_limit();
  return f;
}

std::unique_ptr<CompactFilter::Table> CompactFilter::make_table(std::uint64_t lines,
                                                                const compact::Shape& s,
                                                                Tick now) const {
  auto t = std::make_unique<Table>();
  t->layout = Layout::of(s, t_);
  t->data.reset(compact::allocate_lines(lines));
  if (!t->data) return nullptr;
  t->lines = lines;
  t->created = now;
  t->last_insert = now;
  t->alive.init(config_.ticks_per_window);
  return t;
}

unsigned CompactFilter::fingerprint_bits() const noexcept { return base_.r; }
unsigned CompactFilter::slots_per_line() const noexcept { return base_.S; }

bool CompactFilter::vector_path() const noexcept {
#if KDEDUP_COMPACT_X86
  return simd_in_use() == Simd::kAvx512 && compact::avx512_usable();
#else
  return false;
#endif
}

// --- the hot path ------------------------------------------------------------------

CompactFilter::Where CompactFilter::where_of(const Key& k) const {
  const View::Cells& c = view_->tables[0];
  const Layout& l = *c.layout;
  return {k, l.line1(k, c.lines), l.line2(k, c.lines), l.bucket_of(k), l.remainder_of(k)};
}

template <class Lines>
bool CompactFilter::seen(const Where& w, Fill& f) {
  // True when the identity is alive in some table or the overflow list. The
  // active table first: it holds the most recent, most often repeated
  // identities, and its lines are where a new one goes (f: their entry
  // counts and bucket positions, valid when false is returned).
  const View& v = *view_;
  const View::Cells& c = v.tables[0];
  const Layout& l = *c.layout;
  const Key& k = w.key;
  if (Lines::probe(c.data[w.i1], l, w.q, w.rem, v.age, f.n1, f.p1, pending_filled_)) return true;
  if (w.i2 == w.i1) {
    f.n2 = f.n1;
    f.p2 = f.p1;
  } else if (Lines::probe(c.data[w.i2], l, w.q, w.rem, v.age, f.n2, f.p2, pending_filled_)) {
    return true;
  }
  if (v.count == 1 && overflow_.empty()) [[likely]]
    return false;
  return seen_elsewhere(k);
}

[[gnu::noinline]] bool CompactFilter::seen_elsewhere(const Key& k) const {
  // The sealed tables (read only, tags checked) and the overflow list.
  const View& v = *view_;
  for (std::uint32_t s = 1; s < v.count; ++s) {
    const View::Cells& o = v.tables[s];
    const Layout& l = *o.layout;
    const std::uint32_t q = l.bucket_of(k), rem = l.remainder_of(k);
    if (seek_line(o.data[l.line1(k, o.lines)], l, q, rem, v.age) ||
        seek_line(o.data[l.line2(k, o.lines)], l, q, rem, v.age)) {
      return true;
    }
  }
  return !overflow_.empty() && overflow_bins_[k.bin()] != 0 && in_overflow(k, v.age);
}

#if KDEDUP_COMPACT_X86
KDEDUP_COMPACT_AVX512 bool CompactFilter::seek_vector(const Line& L, const Layout& l,
                                                      std::uint32_t q, std::uint32_t rem,
                                                      const Age& a) {
  return VectorLines<ScanKind::kAny>::seek(L, l, q, rem, a);
}
#endif

bool CompactFilter::seek_line(const Line& L, const Layout& l, std::uint32_t q, std::uint32_t rem,
                              const Age& a) const {
#if KDEDUP_COMPACT_X86
  if (vector_path()) return seek_vector(L, l, q, rem, a);
#endif
  return PortableLines::seek(L, l, q, rem, a);
}

bool CompactFilter::in_overflow(const Key& k, const Age& a) const {
  const std::uint32_t mask = (1U << t_) - 1;
  return std::any_of(overflow_.begin(), overflow_.end(), [&](const Overflow& o) {
    if (o.bin != k.bin() || ((a.now - o.tag) & mask) > a.window) return false;
    const Table& t = *tables_[o.table];
    const Layout& l = t.layout;
    return o.line == l.line1(k, t.lines) && o.q == l.bucket_of(k) && o.rem == l.remainder_of(k);
  });
}

template <class Lines>
void CompactFilter::place(const Where& w, const Fill& f) {
  // A new identity into the active table: the line with fewer entries (the
  // first on a tie), or the overflow list when both are full. Counted in
  // pending_filled_; the caller books the insertion.
  const View& v = *view_;
  const View::Cells& c = v.tables[0];
  const Layout& l = *c.layout;
  if (f.n1 < l.shape.S || f.n2 < l.shape.S) [[likely]] {
    // Which line is a coin flip: selected by masks, not a branch.
    const std::uint64_t second = 0 - static_cast<std::uint64_t>(f.n2 < f.n1);
    const std::uint64_t line = w.i1 ^ ((w.i1 ^ w.i2) & second);
    const auto p = static_cast<unsigned>(f.p1 ^ ((f.p1 ^ f.p2) & second));
    Lines::put(c.data[line], l, w.q, p, w.rem, v.age.now);
    ++pending_filled_;
    return;
  }
  Overflow o;
  o.table = static_cast<std::uint32_t>(tables_.size() - 1);
  o.line = w.i1;
  o.q = w.q;
  o.rem = w.rem;
  o.tag = v.age.now;
  o.bin = w.key.bin();
  overflow_.push_back(o);
  ++overflow_bins_[o.bin];
  note_full();
}

void CompactFilter::note_full() {
  // kOverflowSeal insertions without room in the active table, plus one per
  // kOverflowPer live entries: it is full. A full overflow list takes no
  // more (when no table can be added): new identities without room are
  // judged duplicates until it has room again.
  const auto active = static_cast<std::uint32_t>(tables_.size() - 1);
  const auto in_active = static_cast<std::size_t>(std::count_if(
      overflow_.begin(), overflow_.end(), [&](const Overflow& o) { return o.table == active; }));
  if (in_active >= kOverflowSeal + tables_.back()->alive.sum / kOverflowPer) seal_due_ = true;
  if (overflow_.size() >= compact::kMaxOverflow) saturated_ = true;
}

template <class Lines>
void CompactFilter::active_counts(const Where& w, Fill& f) {
  // The entry counts of the identity's two lines in the active table
  // (compacted when stale), for an identity known to be new.
  const View& v = *view_;
  const View::Cells& c = v.tables[0];
  const Layout& l = *c.layout;
  (void)Lines::probe(c.data[w.i1], l, w.q, w.rem, v.age, f.n1, f.p1, pending_filled_);
  f.n2 = f.n1;
  f.p2 = f.p1;
  if (w.i2 != w.i1) {
    (void)Lines::probe(c.data[w.i2], l, w.q, w.rem, v.age, f.n2, f.p2, pending_filled_);
  }
}

template <class Lines>
Decision CompactFilter::decide(const Where& where) {
  Where w = where;
  Fill f;
  if (seen<Lines>(w, f)) {
    commit_pending();
    return Decision::kDuplicate;
  }
  if (view_->room == 0 && tables_.back()->inserts > 0 && grow_for_insert()) {
    // The lines read belong to a sealed table now: read the new active's
    // (whose layout may be of another kind than this kernel's).
    w = where_of(w.key);
    return insert_new<typename Lines::Any>(w);
  }
  return insert_new<Lines>(w, f);
}

template <class Lines>
Decision CompactFilter::insert_new(const Where& w) {
  Fill f;
  active_counts<Lines>(w, f);
  return insert_new<Lines>(w, f);
}

template <class Lines>
Decision CompactFilter::insert_new(const Where& w, const Fill& f) {
  const unsigned S = view_->tables[0].layout->shape.S;
  if (saturated_ && f.n1 == S && f.n2 == S) {
    // No room anywhere and none to be had: judged a duplicate (a false
    // positive, counted in the estimate), never a live entry evicted.
    ++pending_rejected_;
    commit_pending();
    return Decision::kDuplicate;
  }
  place<Lines>(w, f);
  pending_inserts_ = 1;
  commit_pending();
  if (seal_due_) {
    seal_due_ = false;
    (void)seal_and_grow(Seal::kFull);
  }
  return Decision::kDistinct;
}

void CompactFilter::commit_pending() {
  // Books the insertions and entry-count changes of a run (or of one call)
  // into the active table.
  Table& a = *tables_.back();
  a.nonempty = static_cast<std::uint64_t>(static_cast<std::int64_t>(a.nonempty) + pending_filled_);
  pending_filled_ = 0;
  if (pending_rejected_ != 0) {
    rejected_[clock_ % rejected_.size()] += pending_rejected_;
    pending_rejected_ = 0;
  }
  const std::uint64_t n = pending_inserts_;
  if (n == 0) return;
  a.alive.ring[view_->tick_slot] += static_cast<std::uint32_t>(n);
  a.alive.sum += n;
  a.inserts += n;
  a.last_insert = clock_;
  if (insertions_ == 0) first_tick_ = clock_;
  insertions_ += n;
  view_->room = view_->room > n ? view_->room - n : 0;
  pending_inserts_ = 0;
}

void CompactFilter::count_refresh() {
  // insert() renewed a live copy: counted as an insertion at this tick (the
  // live count may then overestimate, never underestimate).
  pending_inserts_ = 1;
  commit_pending();
}

template <class Lines>
void CompactFilter::run_batch(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                              std::span<Decision> out, std::size_t& i) {
  // Decisions are made strictly in order, by the one-by-one path's functions,
  // so they and the state equal the one-by-one calls. The work is split into
  // runs of elements at one clock value, insertions booked once at a run's
  // end. A run ends early when the active table must be sealed (that
  // element goes through decide(), which seals it) or ran out of room; the
  // caller then picks the path again. Every table's two lines of an
  // element are prefetched kPrefetchDistance elements ahead (a table added
  // mid-batch only misses a hint); the keys are kept in a ring.
  constexpr std::size_t D = kPrefetchDistance;
  const std::size_t n = fps.size();
  std::array<Where, D> ring;
  auto stage = [&](std::size_t j) __attribute__((always_inline)) {
    const Key k = compact::key_of(fps[j].lo, fps[j].hi);
    const View& v = *view_;
    const Layout& l = *v.tables[0].layout;
    Where& w = ring[j % D];
    w = {k, l.line1(k, v.tables[0].lines), l.line2(k, v.tables[0].lines), l.bucket_of(k),
         l.remainder_of(k)};
    __builtin_prefetch(v.tables[0].data + w.i1, 1, 3);
    __builtin_prefetch(v.tables[0].data + w.i2, 1, 3);
    for (std::uint32_t s = 1; s < v.count; ++s) {
      const Layout& o = *v.tables[s].layout;
      __builtin_prefetch(v.tables[s].data + o.line1(k, v.tables[s].lines), 0, 3);
      __builtin_prefetch(v.tables[s].data + o.line2(k, v.tables[s].lines), 0, 3);
    }
  };
  // The positions depend on the active table: computed again after a clock
  // move (which may replace it).
  auto prime = [&] {
    for (std::size_t j = i; j < std::min(n, i + D); ++j) stage(j);
  };
  prime();
  while (i < n) {
    if (ticks[i] > clock_) {
      move_clock(ticks[i]);
      if (!Lines::accepts(tables_.back()->layout)) return;  // another kernel's layout now
      prime();
    }
    const std::uint64_t room = view_->room;
    std::uint64_t inserted = 0, rejected = 0;
    bool full = false;  // element i is new and the active table must be sealed first
    Where full_at;
    const unsigned S = view_->tables[0].layout->shape.S;
    for (; i < n && ticks[i] <= clock_; ++i) {
      const Where w = ring[i % D];
      if (i + D < n) stage(i + D);
      Fill f;
      if (seen<Lines>(w, f)) {
        out[i] = Decision::kDuplicate;
        continue;
      }
      if (inserted >= room) {
        full = true;
        full_at = w;
        break;
      }
      if (saturated_ && f.n1 == S && f.n2 == S) [[unlikely]] {
        ++rejected;
        out[i] = Decision::kDuplicate;
        continue;
      }
      place<Lines>(w, f);
      out[i] = Decision::kDistinct;
      ++inserted;
      if (seal_due_) [[unlikely]] {  // the active ran out of room: book the run, then seal
        ++i;
        break;
      }
    }
    pending_inserts_ = inserted;
    pending_rejected_ += static_cast<std::uint32_t>(rejected);
    commit_pending();
    if (seal_due_) {
      seal_due_ = false;
      (void)seal_and_grow(Seal::kFull);
      return;  // the ring is stale: the caller starts again
    }
    if (full) {
      out[i] = decide<Lines>(full_at);
      ++i;
      return;
    }
  }
}

void CompactFilter::run_any(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                            std::span<Decision> out, std::size_t& i) {
#if KDEDUP_COMPACT_X86
  if (vector_path() && tables_.back()->layout.vector) return run_vector(fps, ticks, out, i);
#endif
  run_batch<PortableLines>(fps, ticks, out, i);
}

#if KDEDUP_COMPACT_X86
KDEDUP_COMPACT_AVX512 [[gnu::flatten]] Decision CompactFilter::decide_vector(const Where& w) {
  return decide<VectorLines<ScanKind::kAny>>(w);
}

// One kernel per scan kind of the active table; a run ends when the active
// table changes, and the caller picks the kernel again.
KDEDUP_COMPACT_AVX512 [[gnu::flatten]] void CompactFilter::run_bytes(
    std::span<const Fingerprint> fps, std::span<const Tick> ticks, std::span<Decision> out,
    std::size_t& i) {
  run_batch<VectorLines<ScanKind::kBytes>>(fps, ticks, out, i);
}

KDEDUP_COMPACT_AVX512 [[gnu::flatten]] void CompactFilter::run_words(
    std::span<const Fingerprint> fps, std::span<const Tick> ticks, std::span<Decision> out,
    std::size_t& i) {
  run_batch<VectorLines<ScanKind::kWords>>(fps, ticks, out, i);
}

void CompactFilter::run_vector(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                               std::span<Decision> out, std::size_t& i) {
  if (tables_.back()->layout.bytes) return run_bytes(fps, ticks, out, i);
  run_words(fps, ticks, out, i);
}
#else
Decision CompactFilter::decide_vector(const Where& w) { return decide<PortableLines>(w); }

void CompactFilter::run_vector(std::span<const Fingerprint> fps, std::span<const Tick> ticks,
                               std::span<Decision> out, std::size_t& i) {
  run_batch<PortableLines>(fps, ticks, out, i);
}
#endif

void CompactFilter::test_and_insert_batch(std::span<const Fingerprint> fps,
                                          std::span<const Tick> ticks, std::span<Decision> out) {
  std::size_t done = 0;
  while (done < fps.size()) run_any(fps, ticks, out, done);
}

Decision CompactFilter::test_and_insert(const Fingerprint& fp, Tick now) {
  if (now > clock_) move_clock(now);
  const Where w = where_of(compact::key_of(fp.lo, fp.hi));
#if KDEDUP_COMPACT_X86
  if (vector_path()) return decide_vector(w);
#endif
  return decide<PortableLines>(w);
}

bool CompactFilter::renew(const Key& k) {
  // insert(): a live copy in the active table's lines or the overflow list
  // takes the clock's tag.
  const View& v = *view_;
  const View::Cells& c = v.tables[0];
  const Layout& l = *c.layout;
  const std::uint32_t q = l.bucket_of(k), rem = l.remainder_of(k);
  for (const std::uint64_t i : {l.line1(k, c.lines), l.line2(k, c.lines)}) {
    unsigned n = 0, p = 0;
    (void)PortableLines::probe(c.data[i], l, q, rem, v.age, n, p, pending_filled_);
    if (compact::renew(c.data[i], l, q, rem, v.age)) return true;
  }
  const auto active = static_cast<std::uint32_t>(tables_.size() - 1);
  for (Overflow& o : overflow_) {
    if (o.table == active && o.bin == k.bin() && o.line == l.line1(k, c.lines) && o.q == q &&
        o.rem == rem && compact::alive(o.tag, l, v.age)) {
      o.tag = v.age.now;
      return true;
    }
  }
  return false;
}

void CompactFilter::insert(const Fingerprint& x, Tick now) {
  if (now > clock_) move_clock(now);
  const Key k = compact::key_of(x.lo, x.hi);
  if (renew(k)) return count_refresh();
  if (view_->room == 0 && tables_.back()->inserts > 0) (void)grow_for_insert();
  const Where w = where_of(k);
  Fill f;
  active_counts<PortableLines>(w, f);
  place<PortableLines>(w, f);
  pending_inserts_ = 1;
  commit_pending();
  if (seal_due_) {
    seal_due_ = false;
    (void)seal_and_grow(Seal::kFull);
  }
}

bool CompactFilter::contains(const Fingerprint& x, Tick now) const {
  // Ages at `now` are the ages at the clock plus the difference (exact: the
  // scrub keeps every tag unwrapped at the clock).
  const Tick later = now > clock_ ? now - clock_ : 0;
  if (later > config_.ticks_per_window) return false;
  const Key k = compact::key_of(x.lo, x.hi);
  const View& v = *view_;
  Age a = v.age;
  a.window = static_cast<std::uint32_t>(config_.ticks_per_window - later);
  for (std::uint32_t s = 0; s < v.count; ++s) {
    const View::Cells& c = v.tables[s];
    const Layout& l = *c.layout;
    const std::uint32_t q = l.bucket_of(k), rem = l.remainder_of(k);
    if (PortableLines::seek(c.data[l.line1(k, c.lines)], l, q, rem, a) ||
        PortableLines::seek(c.data[l.line2(k, c.lines)], l, q, rem, a)) {
      return true;
    }
  }
  return in_overflow(k, a);
}

// --- stats -------------------------------------------------------------------------

std::size_t CompactFilter::stash_size() const noexcept { return overflow_.size(); }

std::uint64_t CompactFilter::rejected_in_window() const {
  std::uint64_t n = 0;
  for (std::uint32_t r : rejected_) n += r;
  return n;
}

std::uint64_t CompactFilter::state_bytes() const {
  std::uint64_t bytes =
      overflow_.size() * sizeof(Overflow) + rejected_.size() * sizeof(std::uint32_t);
  for (const auto& t : tables_) bytes += t->bytes() + t->alive.ring.size() * sizeof(std::uint32_t);
  return bytes;
}

FilterStats CompactFilter::stats() const {
  FilterStats st;
  st.bytes = state_bytes();
  st.bytes_peak = peak_with(st.bytes);
  double none = 1.0;
  std::uint64_t delivered = 0;
  for (const auto& t : tables_) {
    st.cells += t->slots();
    st.live_cells += t->nonempty;
    none *= 1.0 - table_fpp(*t);
    delivered += t->alive.sum;
  }
  // Identities judged duplicates for want of room: their share of the new
  // identities that arrived in the window is a false-positive rate too.
  const auto rejected = static_cast<double>(rejected_in_window());
  if (rejected > 0) none *= 1.0 - rejected / (rejected + static_cast<double>(delivered));
  st.live_cells += overflow_.size();
  st.subfilters = static_cast<std::uint32_t>(tables_.size());
  st.insertions = insertions_;
  st.fpp_estimate = 1.0 - none;
  return st;
}

std::vector<std::uint64_t> CompactFilter::table_bytes() const {
  std::vector<std::uint64_t> out;
  for (const auto& t : tables_) out.push_back(t->bytes());
  return out;
}

std::vector<unsigned> CompactFilter::table_fingerprint_bits() const {
  std::vector<unsigned> out;
  for (const auto& t : tables_) out.push_back(t->layout.shape.r);
  return out;
}

}  // namespace kdedup::filter
