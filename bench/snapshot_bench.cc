// snapshot_bench: cost of snapshotting a 256 MiB partition state through the
// SnapshotStore, measured side by side in one run.
//
//   snapshot_bench [--mib N] [--dir DIR]
//
// Prints one table: capture (worker-thread) time vs background write time;
// full and incremental write durations and bytes written; load and restore
// time vs rebuilding the same filter by replaying its records. States: a
// timer filter grown to ~N MiB (the default filter type), and an
// incompressible synthetic blob of N MiB (the write path's worst case).
// Figures depend on the disk; run on the volume the state dir will live on
// (--dir).

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kdedup/state/snapshot_store.h"

namespace {

constexpr kdedup::filter::TickScale kScale(600'000, 192);

using namespace kdedup;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}
double secs(std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); }
double mib(std::uint64_t b) { return static_cast<double>(b) / (1 << 20); }

void row(const std::string& what, double seconds, const std::string& written,
         const std::string& chunks) {
  std::printf("%-54s %10.3f s %14s %12s\n", what.c_str(), seconds, written.c_str(), chunks.c_str());
}

void report_row(const std::string& what, const state::WriteReport& r) {
  row(what, secs(r.write_time), fmt::format("{:.1f} MiB", mib(r.bytes_written)),
      fmt::format("{}/{}", r.chunks_written, r.chunks_total));
}

state::WriteReport must_write(state::SnapshotStore& store, state::SnapshotCapture c) {
  auto r = store.write(std::move(c));
  if (!r) {
    std::fprintf(stderr, "snapshot_bench: %s\n", r.error().message.c_str());
    std::exit(1);
  }
  return *r;
}

filter::Fingerprint fp_of(std::uint64_t i) {
  // Same spread as salted XXH3 output, without hashing cost in the loops.
  std::uint64_t x = i * 0x9E3779B97F4A7C15ULL;
  x ^= x >> 31;
  return {x * 0xBF58476D1CE4E5B9ULL, (x ^ (x >> 29)) * 0x94D049BB133111EBULL};
}

/// Feeds records [from, to) at a slowly advancing clock (nothing expires).
void insert_range(filter::SlidingFilter& f, std::uint64_t from, std::uint64_t to) {
  for (std::uint64_t i = from; i < to; ++i) f.test_and_insert(fp_of(i), i >> 20);
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t target_mib = 256;
  std::string base = std::filesystem::temp_directory_path().string();
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--mib") && i + 1 < argc) {
      target_mib = std::strtoull(argv[++i], nullptr, 10);
    } else if (!std::strcmp(argv[i], "--dir") && i + 1 < argc) {
      base = argv[++i];
    } else {
      std::fprintf(stderr, "usage: snapshot_bench [--mib N] [--dir DIR]\n");
      return 2;
    }
  }
  const std::uint64_t target = target_mib << 20;
  const std::string dir = base + "/kdedup-snapshot-bench-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  auto opened = state::SnapshotStore::open(dir);
  if (!opened) {
    std::fprintf(stderr, "snapshot_bench: %s\n", opened.error().message.c_str());
    return 1;
  }
  auto& store = **opened;
  const state::StoreOptions defaults;

  // A timer filter whose one sub-filter is target bytes; fill it to ~90% of
  // the capacity it was sized for. 8-bit timers at fpp 1%: ~11.8 cells each.
  filter::FilterConfig cfg;
  cfg.type = filter::FilterType::kTimer;
  cfg.fpp = 0.01;
  cfg.capacity = target / 12;
  cfg.min_bytes = target;
  cfg.max_bytes = target;
  auto made = filter::make_filter(cfg);
  const bool timer = static_cast<bool>(made);
  if (!timer) {  // fall back to the exact filter (24 serialized bytes per entry)
    cfg.type = filter::FilterType::kExact;
    cfg.ticks_per_window = 1 << 30;
    made = filter::make_filter(cfg);
  }
  if (!made) {
    std::fprintf(stderr, "snapshot_bench: %s\n", made.error().message.c_str());
    return 1;
  }
  auto& f = **made;
  const std::uint64_t records = timer ? cfg.capacity * 9 / 10 : target / 24;
  auto t = Clock::now();
  insert_range(f, 0, records);
  const double fill_s = seconds_since(t);

  std::printf("snapshot_bench: store %s, chunk %u KiB, compression %s, fsync per snapshot\n",
              dir.c_str(), defaults.chunk_size / 1024, store.compression());
  std::printf("%-54s %12s %14s %12s\n", "step", "time", "bytes written", "chunks w/t");

  // --- filter state ---
  const state::PartitionKey fkey{"bench", 0};
  auto capture = state::capture_snapshot(fkey, f, kScale, static_cast<std::int64_t>(records), 0, 1);
  const std::uint64_t state_bytes = capture.state.size();
  std::printf("-- %s filter, %llu records, state %.1f MiB (filled in %.2f s)\n",
              filter::to_string(f.type()), static_cast<unsigned long long>(records),
              mib(state_bytes), fill_s);
  row("capture on the worker (serialize + copy)", secs(capture.capture_time), "-", "-");
  const auto full = must_write(store, std::move(capture));
  report_row("full snapshot write (writer thread)", full);

  const std::uint64_t more = records / 100;
  insert_range(f, records, records + more);
  auto capture2 =
      state::capture_snapshot(fkey, f, kScale, static_cast<std::int64_t>(records + more), 0, 1);
  row("capture after +1% records", secs(capture2.capture_time), "-", "-");
  report_row("incremental write after +1% records", must_write(store, std::move(capture2)));
  insert_range(f, records + more, records + more + 200);
  report_row("incremental write after +200 records",
             must_write(store, state::capture_snapshot(fkey, f, kScale, 0, 0, 1)));

  // Restore vs rebuild: the same filter state, from the store vs by replay.
  const auto expected = state::state_fingerprint(f.config(), kScale, 1);
  t = Clock::now();
  auto read = store.read(fkey, expected);
  const double read_s = seconds_since(t);
  if (!read) {
    std::fprintf(stderr, "snapshot_bench: %s\n", read.error().message.c_str());
    return 1;
  }
  t = Clock::now();
  auto restored = filter::restore_filter(read->state);
  const double restore_s = seconds_since(t);
  if (!restored) {
    std::fprintf(stderr, "snapshot_bench: %s\n", restored.error().message.c_str());
    return 1;
  }
  row("load: read + verify all chunks", read_s, "-", "-");
  row("load: restore_filter", restore_s, "-", "-");
  auto fresh = filter::make_filter(f.config());
  t = Clock::now();
  insert_range(**fresh, 0, records + more + 200);
  const double rebuild_s = seconds_since(t);
  row(fmt::format("rebuild by replay ({} inserts, no Kafka fetch)", records + more + 200),
      rebuild_s, "-", "-");
  std::printf("   restore / rebuild = %.3f   capture / full write = %.3f\n",
              (read_s + restore_s) / rebuild_s, secs(full.capture_time) / secs(full.write_time));

  // --- synthetic incompressible state: the write path's worst case ---
  std::string blob(state_bytes, '\0');
  std::mt19937_64 rng(42);
  for (std::size_t i = 0; i + 8 <= blob.size(); i += 8) {
    const std::uint64_t v = rng();
    std::memcpy(blob.data() + i, &v, 8);
  }
  std::printf("-- synthetic random blob, %.1f MiB\n", mib(blob.size()));
  const state::PartitionKey skey{"bench", 1};
  auto raw = [&](std::int64_t offset) {
    state::SnapshotCapture c;
    c.key = skey;
    c.next_offset = offset;
    c.fingerprint = {1, 1};
    t = Clock::now();
    c.state = blob;  // the capture is a copy of the state
    c.capture_time = Clock::now() - t;
    return c;
  };
  auto c0 = raw(0);
  row("capture (copy)", secs(c0.capture_time), "-", "-");
  report_row("full snapshot write", must_write(store, std::move(c0)));
  const std::size_t one_percent = blob.size() / 100;
  for (std::size_t i = blob.size() / 2; i < blob.size() / 2 + one_percent; ++i) blob[i] ^= 0x5a;
  report_row("incremental, 1% changed in one region", must_write(store, raw(1)));
  const std::size_t chunks = blob.size() / defaults.chunk_size;
  for (std::size_t c = 0; c < chunks; c += 100) blob[c * defaults.chunk_size + 7] ^= 1;
  report_row("incremental, 1 byte in every 100th chunk", must_write(store, raw(2)));
  for (std::size_t c = 0; c < chunks; ++c) blob[c * defaults.chunk_size + 11] ^= 1;
  report_row("incremental, 1 byte in every chunk (worst case)", must_write(store, raw(3)));
  t = Clock::now();
  auto sread = store.read(skey, std::nullopt);
  row("load: read + verify all chunks", seconds_since(t), "-", "-");
  if (!sread || sread->state != blob) {
    std::fprintf(stderr, "snapshot_bench: synthetic state did not read back intact\n");
    return 1;
  }

  auto listed = store.list();
  if (listed) {
    for (const auto& l : *listed) {
      if (l.info) {
        std::printf("   on disk %s: %.1f MiB (approximate, compressed)\n",
                    l.key.to_string().c_str(), mib(l.info->disk_bytes));
      }
    }
  }
  std::printf("   pipeline throughput while snapshotting: pending (needs the pipeline)\n");
  opened->reset();
  std::filesystem::remove_all(dir);
  return 0;
}
