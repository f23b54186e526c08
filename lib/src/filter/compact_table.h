#pragma once
// The compact filter's private parts shared by its source files: a table,
// the hot path's view of the tables, the overflow list, the per-tick
// counters. compact_filter.h has the design; compact_line.h the line codec.
//
// Threading: owned by the filter, used on its thread.

#include <cstdlib>
#include <memory>
#include <vector>

#include "compact_line.h"
#include "kdedup/filter/compact_filter.h"

namespace kdedup::filter {

namespace compact {

// A failed full table adds one even past kMaxTables, up to this many (the
// hot path's view of the tables is a fixed array).
inline constexpr std::uint32_t kHardMaxTables = 64;
// Overflow entries beyond which a full table no longer adds one.
inline constexpr std::size_t kMaxOverflow = 4096;

struct FreeLines {
  void operator()(Line* p) const { std::free(p); }
};

/// Zeroed lines (a zero line is empty). Large tables are 2 MiB aligned and
/// asked to use transparent huge pages, as the timer filter's cells are:
/// every operation reads random lines.
Line* allocate_lines(std::uint64_t lines);

/// Insertions per tick over the last W + 1 ticks, one counter per tick.
struct TickCounts {
  std::vector<std::uint32_t> ring;  // tick x at x % ring.size(); W + 2 slots
  std::uint64_t sum = 0;            // over ticks clock - W .. clock

  void init(std::uint32_t window) {
    ring.assign(window + 2, 0);
    sum = 0;
  }
  [[nodiscard]] std::uint32_t at(Tick x) const { return ring[x % ring.size()]; }
  /// The clock moves from `old` to `now`: ticks old - W .. now - W - 1 leave.
  void advance(Tick old, Tick now, std::uint32_t window);
};

}  // namespace compact

/// An identity's place in the active table, computed once per element (the
/// batch path computes it when it prefetches).
struct CompactFilter::Where {
  compact::Key key;
  std::uint64_t i1 = 0, i2 = 0;  // its two lines
  std::uint32_t q = 0, rem = 0;  // its bucket and remainder
};

/// The identity's two lines in the active table as its test left them: their
/// entry counts and the code position of its bucket in each (where a new
/// entry goes).
struct CompactFilter::Fill {
  unsigned n1 = 0, n2 = 0;
  unsigned p1 = 0, p2 = 0;
};

/// One table: whole lines of one shape, and what its scrub and budget need.
struct CompactFilter::Table {
  std::unique_ptr<compact::Line[], compact::FreeLines> data;
  std::uint64_t lines = 0;
  compact::Layout layout;
  Tick created = 0;            // start of the scrub schedule
  std::uint64_t swept = 0;     // lines visited since `created`
  Tick last_insert = 0;        // newest insertion (== created before any)
  std::uint64_t inserts = 0;   // since creation
  std::uint64_t nonempty = 0;  // entries held (live or not yet compacted)
  compact::TickCounts alive;   // insertions in the window
  MemoryCharge charge;         // its bytes in the MemoryBudget, if any

  [[nodiscard]] std::uint64_t bytes() const { return lines * compact::kLineBytes; }
  [[nodiscard]] std::uint64_t slots() const { return lines * layout.shape.S; }
  [[nodiscard]] compact::Line& line(std::uint64_t i) const { return data[i]; }
  /// Lines the schedule requires by clock c: floor((c - created) lines / P).
  [[nodiscard]] std::uint64_t required(Tick c, std::uint32_t period) const {
    if (c <= created) return 0;
    const compact::u128 r = static_cast<compact::u128>(c - created) * lines / period;
    return r > ~std::uint64_t{0} ? ~std::uint64_t{0} : static_cast<std::uint64_t>(r);
  }
};

/// An insertion that found both its lines full, kept until its tag leaves
/// the window: the table, the identity's first line, bucket and remainder.
struct CompactFilter::Overflow {
  std::uint32_t table = 0;
  std::uint64_t line = 0;
  std::uint32_t q = 0;
  std::uint32_t rem = 0;
  std::uint32_t tag = 0;
  std::uint32_t bin = 0;  // Key::bin()
};

/// What the hot path reads, as plain values: rebuilt by refresh_view()
/// whenever the clock moves or the tables change.
struct CompactFilter::View {
  struct Cells {
    compact::Line* data = nullptr;
    std::uint64_t lines = 0;
    const compact::Layout* layout = nullptr;
  };
  std::array<Cells, compact::kHardMaxTables> tables{};  // newest (the active one) first
  std::uint32_t count = 0;
  compact::Age age;
  std::uint32_t tick_slot = 0;  // clock mod (W + 2): the tick's insertion counter
  std::uint64_t room = 0;       // inserts the active may take before it must be sealed
};

/// Why a table is added (compact_filter.h, "Memory follows load" and "Memory
/// budget").
enum class CompactFilter::Seal : std::uint8_t {
  kBudget,   ///< the active's fpp room ran out: may be refused
  kFull,     ///< the active cannot take more (kMaxLoad, no room): never refused
  kReplace,  ///< the right-sized replacement of a lone table: may be refused
  kProbe,    ///< the rate-sized successor of a probe, at the first known rate: may be refused
};

}  // namespace kdedup::filter
