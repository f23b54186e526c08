// Timer and compact filter benchmark: prints tables, asserts nothing.
//
// 1. Throughput. For state sizes of 1 MiB, 64 MiB (and 1 GiB with --large):
//    test-and-insert ops/s on one thread, one call per element and through
//    the prefetching batch path (with the best vector level this CPU
//    supports, and with AVX2 and the portable path too, see
//    kdedup/filter/simd.h), next to the machine's random cache-line read
//    rate over an array of the same size: independent random 64-byte reads,
//    prefetched ahead, the best of prefetch distances 16, 32 and 64 (the
//    batch path prefetches 32 ahead). A second reference
//    rate writes one byte into each line it reads, as an insert does (every
//    line is then written back to memory once evicted). The filter is
//    pre-sized for the window and filled for one window first, so every
//    operation works on a loaded filter with the scrub running. The 64 MiB
//    case is repeated with ticks_per_window 128 instead of the 8-bit default
//    192 (a third of the scrub work, a coarser window edge). Each case runs
//    --rounds times (default 3), the filter and the references alternating;
//    the table gives the medians, and the ratios are medians of the per-round
//    ratios, so that load from other processes hits both sides alike.
//    The compact filter (fpp 1%, its default 10 ticks per window) runs in
//    the same rounds at the same state sizes, pre-sized and filled for one
//    window the same way: its batch rate is given beside the timer filter's
//    and the random-line rate, with both ratios. A compact query reads two
//    cache lines (its two buckets) where the timer filter reads one.
// 2. Memory and accuracy. Bits per element of a filter pre-sized for the
//    window, and the false-positive rate measured against an exact oracle
//    (seed 000 Definition 4) in steady state, at fpp 1% and 0.1% for 4-, 8-
//    and 16-bit timers, plus the exact filter for comparison.
// 3. Dynamic size. The same stream from a 10x under-sized capacity hint
//    (the filter starts at the floor and sizes itself from the rate): bytes
//    and sub-filters at steady state against the pre-sized filter.
//
// 4. With --compact-ticks: where the compact filter's time goes within a
//    tick, ns per operation by tenth of the tick at 1 MiB and 64 MiB (the
//    last tenth holds the clock move).
// 5. With --compact-baseline PATH: the compact filter's batch rate of this
//    build and of another filter_bench build (PATH, which must have
//    --compact-only) at 1 MiB and 64 MiB, each in its own process, the two
//    alternating for --rounds rounds: medians and the median of the
//    per-round ratios (the machine's load moves both sides of a round alike).
//    --compact-only MIB prints one such rate and nothing else.
// 6. With --timer-baseline PATH: the same for the 8-bit timer filter's batch
//    rate (its default 192 ticks per window), through --timer-only MIB.
//
// Usage: filter_bench [--large] [--rounds N] [--skip-throughput] [--skip-accuracy]
//                     [--compact-ticks] [--compact-baseline PATH] [--compact-only MIB]
//                     [--timer-baseline PATH] [--timer-only MIB]

#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "kdedup/filter/compact_filter.h"
#include "kdedup/filter/exact_filter.h"
#include "kdedup/filter/simd.h"
#include "kdedup/filter/timer_filter.h"

namespace {

using kdedup::filter::CompactFilter;
using kdedup::filter::Decision;
using kdedup::filter::ExactFilter;
using kdedup::filter::FilterConfig;
using kdedup::filter::FilterType;
using kdedup::filter::Fingerprint;
using kdedup::filter::Growth;
using kdedup::filter::Tick;
using kdedup::filter::TimerFilter;
__extension__ typedef unsigned __int128 u128;

std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 31;
  return x;
}

Fingerprint fingerprint_of(std::uint64_t id) {
  const std::uint64_t lo = mix64(id + 0x9E3779B97F4A7C15ULL);
  return Fingerprint{lo, mix64(lo ^ 0x6A09E667F3BCC909ULL)};
}

// Timed regions use this thread's CPU time: on a shared machine wall time
// mostly measures the other processes. Both sides of every ratio are timed
// the same way.
struct CpuClock {
  using time_point = double;
  static double now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }
};

double seconds_since(double start) { return CpuClock::now() - start; }

// `presized`: one sub-filter sized for config.capacity from the start (the
// filters kdedup runs start at the floor and size themselves from the rate).
std::unique_ptr<TimerFilter> make_timer(const FilterConfig& raw, bool presized = true) {
  auto config = kdedup::filter::normalize(raw);
  if (!config) {
    std::fprintf(stderr, "config: %s\n", config.error().message.c_str());
    std::exit(1);
  }
  auto f = presized ? TimerFilter::create_presized(*config) : TimerFilter::create(*config);
  if (!f) {
    std::fprintf(stderr, "filter: %s\n", f.error().message.c_str());
    std::exit(1);
  }
  return std::move(*f);
}

// ---------------------------------------------------------------------------
// 1. Throughput

// A stream of distinct fingerprints, `per_tick` per tick.
struct DistinctStream {
  std::uint64_t next_id = 0;
  std::uint64_t per_tick = 1;
  void fill(std::vector<Fingerprint>& fps, std::vector<Tick>& ticks) {
    for (std::size_t i = 0; i < fps.size(); ++i, ++next_id) {
      fps[i] = fingerprint_of(next_id);
      ticks[i] = next_id / per_tick;
    }
  }
};

// Independent random 64-byte reads over `bytes`, each prefetched `distance`
// reads ahead. The array gets the same allocation as filter cells (2 MiB
// aligned, transparent huge pages) so both sides pay the same TLB costs.
double random_line_rate(std::uint64_t bytes, std::uint64_t reads, bool write,
                        std::size_t distance) {
  const std::uint64_t lines = bytes / 64;
  constexpr std::uint64_t kHuge = 2ULL << 20;
  const std::uint64_t rounded = (lines * 64 + kHuge - 1) / kHuge * kHuge;
  auto* data = static_cast<std::uint8_t*>(std::aligned_alloc(kHuge, rounded));
#if defined(MADV_HUGEPAGE)
  (void)madvise(data, rounded, MADV_HUGEPAGE);
#endif
  std::memset(data, 1, lines * 64);
  constexpr std::size_t kChunk = 4096;
  std::vector<std::uint64_t> idx(kChunk);
  std::uint64_t sum = 0, seed = 1;
  double elapsed = 0;
  for (std::uint64_t done = 0; done < reads; done += kChunk) {
    for (auto& v : idx) {
      // Same hash and range reduction as the filter picks its line with.
      const Fingerprint fp = fingerprint_of(seed++);
      v = static_cast<std::uint64_t>((static_cast<u128>(fp.hi) * lines) >> 64);
    }
    const double start = CpuClock::now();
    for (std::size_t i = 0; i < kChunk; ++i) {
      if (i + distance < kChunk) __builtin_prefetch(data + idx[i + distance] * 64, 0, 3);
      std::uint8_t* line = data + idx[i] * 64;
      sum += line[idx[i] & 63];
      if (write) line[(idx[i] >> 6) & 63] = static_cast<std::uint8_t>(sum);
    }
    elapsed += seconds_since(start);
  }
  std::free(data);
  if (sum == 42) std::puts("");  // keep the reads
  return static_cast<double>(reads) / elapsed;
}

// Medians over the rounds; the ratios are medians of the per-round ratios.
struct Throughput {
  double single = 0, batch = 0, random_line = 0, random_line_write = 0;
  double compact = 0, compact_vs_timer = 0, compact_vs_reads = 0;  // 0: not measured
  std::uint64_t compact_bytes = 0;
  double batch_avx2 = 0, batch_portable = 0;  // 0: not measured (the CPU lacks AVX2)
  double ratio = 0, ratio_write = 0;
  std::uint64_t bytes = 0;
  std::uint32_t window = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Batch size of the compact filter's runs.
constexpr std::size_t kCompactChunk = 4096;

// A compact filter (fpp 1%, its default tick) pre-sized for `state_bytes`
// and filled for one window with distinct ids at the rate it was sized
// for, and the stream that continues it: every later operation works on a
// table at its target live load, with the scrub running.
struct LoadedCompact {
  std::unique_ptr<CompactFilter> filter;
  DistinctStream stream;
};

LoadedCompact loaded_compact(std::uint64_t state_bytes) {
  FilterConfig c;
  c.type = FilterType::kCompact;
  c.fpp = 0.01;
  c.max_bytes = std::max<std::uint64_t>(c.max_bytes, state_bytes);
  auto presized = [](const FilterConfig& raw) -> std::unique_ptr<CompactFilter> {
    auto config = kdedup::filter::normalize(raw);
    if (!config) {
      std::fprintf(stderr, "config: %s\n", config.error().message.c_str());
      std::exit(1);
    }
    auto made = CompactFilter::create_presized(*config);
    if (!made) {
      std::fprintf(stderr, "compact filter: %s\n", made.error().message.c_str());
      std::exit(1);
    }
    return std::move(*made);
  };
  {  // Capacity that makes the first table state_bytes.
    const double per_byte =
        static_cast<double>(c.capacity) / static_cast<double>(presized(c)->table_bytes().front());
    c.capacity = static_cast<std::uint64_t>(per_byte * static_cast<double>(state_bytes) * 0.999);
  }
  // Pre-sized like the timer filter it is compared with (the filters kdedup
  // runs start at the floor and size themselves from the rate).
  LoadedCompact out{presized(c), {}};
  const std::uint32_t window = out.filter->config().ticks_per_window;
  // A distinct stream at the capacity's rate: the live load settles at the
  // target load the table was sized for.
  out.stream.per_tick = std::max<std::uint64_t>(1, c.capacity / (window + 1));
  std::vector<Fingerprint> fps(kCompactChunk);
  std::vector<Tick> ticks(kCompactChunk);
  std::vector<Decision> decisions(kCompactChunk);
  for (std::uint64_t done = 0; done < out.stream.per_tick * (window + 1); done += kCompactChunk) {
    out.stream.fill(fps, ticks);
    out.filter->test_and_insert_batch(fps, ticks, decisions);
  }
  return out;
}

// Batch test-and-insert ops/s of loaded_compact(state_bytes) over `ops`
// more; sets `bytes`.
double compact_rate(std::uint64_t state_bytes, std::uint64_t ops, std::uint64_t& bytes) {
  LoadedCompact loaded = loaded_compact(state_bytes);
  CompactFilter& f = *loaded.filter;
  bytes = f.stats().bytes;
  std::vector<Fingerprint> fps(kCompactChunk);
  std::vector<Tick> ticks(kCompactChunk);
  std::vector<Decision> decisions(kCompactChunk);
  double elapsed = 0;
  for (std::uint64_t done = 0; done < ops; done += kCompactChunk) {
    loaded.stream.fill(fps, ticks);
    const double start = CpuClock::now();
    f.test_and_insert_batch(fps, ticks, decisions);
    elapsed += seconds_since(start);
  }
  if (f.stats().subfilters != 1) {
    std::fprintf(stderr, "note: compact filter holds %u tables at %" PRIu64 " bytes\n",
                 f.stats().subfilters, state_bytes);
  }
  return static_cast<double>(((ops + kCompactChunk - 1) / kCompactChunk) * kCompactChunk) / elapsed;
}

// One rate printed by another filter_bench build run as a child process
// (`flag` is --compact-only or --timer-only, which it must have) at `mib`
// MiB; 0 on failure.
double rate_of(const std::string& binary, const char* flag, std::uint64_t mib) {
  const std::string command = "'" + binary + "' " + flag + " " + std::to_string(mib);
  FILE* child = popen(command.c_str(), "r");
  if (child == nullptr) return 0;
  double rate = 0;
  if (std::fscanf(child, "%lf", &rate) != 1) rate = 0;
  return pclose(child) == 0 ? rate : 0;
}

// Where a compact filter's time goes within a tick: ns per operation of
// loaded_compact(state_bytes) by tenth of the tick, over `ticks` ticks. A
// chunk is booked to the tenth it starts in; the last tenth holds the clock
// move (the scrub, and the whole compaction of a busy table).
std::array<double, 10> compact_tick_profile(std::uint64_t state_bytes, std::uint64_t ticks_run) {
  LoadedCompact loaded = loaded_compact(state_bytes);
  const std::uint64_t per_tick = loaded.stream.per_tick;
  std::vector<Fingerprint> fps(kCompactChunk);
  std::vector<Tick> ticks(kCompactChunk);
  std::vector<Decision> decisions(kCompactChunk);
  std::array<double, 10> seconds{}, ops{};
  for (std::uint64_t done = 0; done < per_tick * ticks_run; done += kCompactChunk) {
    const auto tenth = static_cast<std::size_t>(10 * (loaded.stream.next_id % per_tick) / per_tick);
    loaded.stream.fill(fps, ticks);
    const double start = CpuClock::now();
    loaded.filter->test_and_insert_batch(fps, ticks, decisions);
    seconds[tenth] += seconds_since(start);
    ops[tenth] += kCompactChunk;
  }
  std::array<double, 10> ns{};
  for (std::size_t i = 0; i < ns.size(); ++i) ns[i] = ops[i] > 0 ? 1e9 * seconds[i] / ops[i] : 0;
  return ns;
}

// The 8-bit timer filter of the throughput table (fpp 1%), pre-sized to
// state_bytes.
FilterConfig timer_config(std::uint64_t state_bytes, std::uint32_t ticks_per_window) {
  FilterConfig c;
  c.type = FilterType::kTimer;
  c.timer_bits = 8;
  c.fpp = 0.01;
  c.ticks_per_window = ticks_per_window;
  c.max_bytes = std::max<std::uint64_t>(c.max_bytes, state_bytes);
  // Capacity that makes the initial sub-filter exactly state_bytes.
  auto probe = make_timer(c);
  const double per_line = static_cast<double>(c.capacity) / (probe->presized_bytes() / 64.0);
  c.capacity = static_cast<std::uint64_t>(per_line * (state_bytes / 64.0) * 0.999);
  c.capacity = std::max<std::uint64_t>(c.capacity, 1);
  return c;
}

// Test-and-insert ops/s of a timer filter of config `c` filled for one
// window of distinct identities (not timed), over `ops` more: batch or one
// call per element. Sets the bytes and window of `out` when given.
double timer_rate(const FilterConfig& c, std::uint64_t ops, bool batch, Throughput* out = nullptr) {
  constexpr std::size_t kChunk = 4096;
  std::vector<Fingerprint> fps(kChunk);
  std::vector<Tick> ticks(kChunk);
  std::vector<Decision> decisions(kChunk);
  auto f = make_timer(c);
  const std::uint32_t window = f->config().ticks_per_window;
  if (out != nullptr) {
    out->bytes = f->stats().bytes;
    out->window = window;
  }
  DistinctStream stream;
  stream.per_tick = std::max<std::uint64_t>(1, c.capacity / (window + 1));
  // Fill one window (not timed), then time `ops` operations.
  const std::uint64_t warm = stream.per_tick * (window + 1);
  for (std::uint64_t done = 0; done < warm; done += kChunk) {
    stream.fill(fps, ticks);
    f->test_and_insert_batch(fps, ticks, decisions);
  }
  double elapsed = 0;
  std::uint64_t duplicates = 0;
  for (std::uint64_t done = 0; done < ops; done += kChunk) {
    stream.fill(fps, ticks);
    const double start = CpuClock::now();
    if (batch) {
      f->test_and_insert_batch(fps, ticks, decisions);
    } else {
      for (std::size_t i = 0; i < kChunk; ++i) decisions[i] = f->test_and_insert(fps[i], ticks[i]);
    }
    elapsed += seconds_since(start);
    for (Decision d : decisions) duplicates += d == Decision::kDuplicate;
  }
  if (f->stats().subfilters != 1) {
    std::fprintf(stderr, "note: %u sub-filters at %" PRIu64 " bytes\n", f->stats().subfilters,
                 f->stats().bytes);
  }
  (void)duplicates;
  return static_cast<double>(((ops + kChunk - 1) / kChunk) * kChunk) / elapsed;
}

Throughput measure_throughput(std::uint64_t state_bytes, std::uint64_t ops,
                              std::uint32_t ticks_per_window, int rounds, bool compact) {
  const FilterConfig c = timer_config(state_bytes, ticks_per_window);
  Throughput out;
  auto run = [&](bool batch) { return timer_rate(c, ops, batch, &out); };
  using kdedup::filter::Simd;
  const Simd best = kdedup::filter::simd_supported();
  out.single = run(false);  // no vector path: once is enough
  std::vector<double> batch, avx2, portable, reads, writes, ratio, ratio_write;
  std::vector<double> compact_batch, compact_vs_timer, compact_vs_reads;
  for (int r = 0; r < rounds; ++r) {
    kdedup::filter::set_simd(best);
    batch.push_back(run(true));
    double best_reads = 0;
    for (std::size_t distance : {16, 32, 64}) {
      best_reads = std::max(best_reads, random_line_rate(state_bytes, ops, false, distance));
    }
    reads.push_back(best_reads);
    writes.push_back(random_line_rate(state_bytes, ops, true, TimerFilter::kPrefetchDistance));
    ratio.push_back(batch.back() / reads.back());
    ratio_write.push_back(batch.back() / writes.back());
    if (compact) {
      compact_batch.push_back(compact_rate(state_bytes, ops, out.compact_bytes));
      compact_vs_timer.push_back(compact_batch.back() / batch.back());
      compact_vs_reads.push_back(compact_batch.back() / reads.back());
    }
    if (best == Simd::kAvx512) {
      kdedup::filter::set_simd(Simd::kAvx2);
      avx2.push_back(run(true));
    }
    kdedup::filter::set_simd(Simd::kPortable);
    portable.push_back(run(true));
  }
  kdedup::filter::set_simd(best);
  out.batch = median(batch);
  out.batch_avx2 = best == Simd::kAvx2 ? out.batch : avx2.empty() ? 0 : median(avx2);
  out.batch_portable = median(portable);
  out.random_line = median(reads);
  out.random_line_write = median(writes);
  out.ratio = median(ratio);
  out.ratio_write = median(ratio_write);
  if (compact) {
    out.compact = median(compact_batch);
    out.compact_vs_timer = median(compact_vs_timer);
    out.compact_vs_reads = median(compact_vs_reads);
  }
  return out;
}

// ---------------------------------------------------------------------------
// 2. and 3. Memory and accuracy against the oracle

struct Accuracy {
  std::uint64_t capacity = 0;
  std::uint64_t bytes = 0;  // at the end of the run
  std::uint32_t subfilters = 0;
  std::uint32_t k = 0;
  double fp_rate = 0;
  std::uint64_t false_negatives = 0;
  std::uint64_t scored = 0;  // "not delivered" events in the measured part
};

// Uniform draws from a domain 50x larger than the window's content, a fixed
// number of events per tick; the first two windows warm up, the next `windows`
// are scored. `start_capacity` < capacity gives the under-sized start.
Accuracy measure_accuracy(FilterType type, std::uint8_t bits, double fpp, std::uint64_t target,
                          double start_fraction, std::uint32_t windows) {
  FilterConfig c;
  c.type = type;
  c.timer_bits = bits;
  c.fpp = fpp;
  c.min_bytes = 4096;
  auto normalized = kdedup::filter::normalize(c);
  const std::uint32_t window = normalized->ticks_per_window;
  const std::uint64_t per_tick = std::max<std::uint64_t>(1, target / (window + 1));
  Accuracy out;
  out.capacity = per_tick * (window + 1);
  c.capacity =
      std::max<std::uint64_t>(1, static_cast<std::uint64_t>(out.capacity * start_fraction));
  std::unique_ptr<kdedup::filter::SlidingFilter> f;
  if (type == FilterType::kExact) {
    f = std::make_unique<ExactFilter>(*kdedup::filter::normalize(c));
  } else {
    auto t = make_timer(c, start_fraction == 1.0);
    out.k = t->k();
    f = std::move(t);
  }
  FilterConfig oc;
  oc.type = FilterType::kExact;
  oc.ticks_per_window = window;
  ExactFilter oracle(oc);
  std::uint64_t rng = 12345, fp = 0, tn = 0;
  const std::uint64_t domain = 50 * out.capacity;
  const Tick ticks = static_cast<Tick>(window + 1) * (2 + windows);
  const Tick measured_from = static_cast<Tick>(window + 1) * 2;
  for (Tick t = 0; t < ticks; ++t) {
    for (std::uint64_t i = 0; i < per_tick; ++i) {
      const Fingerprint x = fingerprint_of(mix64(++rng) % domain);
      const bool delivered = oracle.contains(x, t);
      const Decision d = f->test_and_insert(x, t);
      if (d == Decision::kDistinct) {
        (void)oracle.test_and_insert(x, t);
        if (delivered) ++out.false_negatives;
      }
      if (t >= measured_from && !delivered) {
        (d == Decision::kDuplicate ? fp : tn) += 1;
      }
    }
  }
  const auto st = f->stats();
  out.bytes = st.bytes;
  out.subfilters = st.subfilters;
  out.scored = fp + tn;
  out.fp_rate = out.scored ? static_cast<double>(fp) / static_cast<double>(out.scored) : 0.0;
  return out;
}

std::string human_bytes(std::uint64_t b) {
  char buf[32];
  if (b >= (1ULL << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ULL << 30));
  } else if (b >= (1ULL << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(1ULL << 20));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  }
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  bool large = false, throughput = true, accuracy = true, compact_ticks = false;
  std::string compact_baseline, timer_baseline;
  int rounds = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--large") {
      large = true;
    } else if (arg == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
      if (rounds < 1) {
        std::fprintf(stderr, "--rounds: expected a positive count, got '%s'\n", argv[i]);
        return 2;
      }
    } else if (arg == "--skip-throughput") {
      throughput = false;
    } else if (arg == "--skip-accuracy") {
      accuracy = false;
    } else if (arg == "--compact-ticks") {
      compact_ticks = true;
    } else if (arg == "--compact-baseline" && i + 1 < argc) {
      compact_baseline = argv[++i];
    } else if (arg == "--timer-baseline" && i + 1 < argc) {
      timer_baseline = argv[++i];
    } else if (arg == "--timer-only" && i + 1 < argc) {
      const long mib = std::atol(argv[++i]);
      if (mib < 1) {
        std::fprintf(stderr, "--timer-only: expected a size in MiB, got '%s'\n", argv[i]);
        return 2;
      }
      std::printf("%.0f\n", timer_rate(timer_config(static_cast<std::uint64_t>(mib) << 20, 0),
                                       20'000'000, true));
      return 0;
    } else if (arg == "--compact-only" && i + 1 < argc) {
      const long mib = std::atol(argv[++i]);
      if (mib < 1) {
        std::fprintf(stderr, "--compact-only: expected a size in MiB, got '%s'\n", argv[i]);
        return 2;
      }
      std::uint64_t bytes = 0;
      std::printf("%.0f\n", compact_rate(static_cast<std::uint64_t>(mib) << 20, 20'000'000, bytes));
      return 0;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--large] [--rounds N] [--skip-throughput] [--skip-accuracy] "
                   "[--compact-ticks] [--compact-baseline PATH] [--compact-only MIB] "
                   "[--timer-baseline PATH] [--timer-only MIB]\n",
                   argv[0]);
      return 2;
    }
  }

  if (throughput) {
    const auto vector = kdedup::filter::to_string(kdedup::filter::simd_supported());
    std::printf(
        "### Throughput (8-bit timers and the compact filter, fpp 1%%, one thread, median of %d "
        "rounds)\n\n",
        rounds);
    std::printf("Vector level of this CPU: %.*s\n\n", static_cast<int>(vector.size()),
                vector.data());
    std::printf(
        "| state | W | single ops/s | batch ops/s | batch, avx2 | batch, portable | "
        "random-line reads/s | batch / random-line | random-line read+writes/s | "
        "batch / read+write | compact batch ops/s (W 10) | compact / timer batch | "
        "compact / random-line |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    struct Case {
      std::uint64_t size;
      std::uint32_t window;  // 0: the default
    };
    std::vector<Case> cases = {{1ULL << 20, 0}, {64ULL << 20, 0}, {64ULL << 20, 128}};
    if (large) cases.push_back({1ULL << 30, 0});
    for (const Case& cs : cases) {
      const std::uint64_t ops = cs.size >= (1ULL << 30) ? 40'000'000 : 20'000'000;
      // The compact filter runs beside the timer at the default window only.
      const Throughput t = measure_throughput(cs.size, ops, cs.window, rounds, cs.window == 0);
      char avx2[32] = "-";
      if (t.batch_avx2 > 0) std::snprintf(avx2, sizeof avx2, "%.2fM", t.batch_avx2 / 1e6);
      char compact[96] = "- | - | -";
      if (t.compact > 0) {
        std::snprintf(compact, sizeof compact, "%.2fM (%s) | %.0f%% | %.0f%%", t.compact / 1e6,
                      human_bytes(t.compact_bytes).c_str(), 100.0 * t.compact_vs_timer,
                      100.0 * t.compact_vs_reads);
      }
      std::printf(
          "| %s | %u | %.2fM | %.2fM | %s | %.2fM | %.2fM | %.0f%% | %.2fM | %.0f%% | %s |\n",
          human_bytes(t.bytes).c_str(), t.window, t.single / 1e6, t.batch / 1e6, avx2,
          t.batch_portable / 1e6, t.random_line / 1e6, 100.0 * t.ratio, t.random_line_write / 1e6,
          100.0 * t.ratio_write, compact);
      std::fflush(stdout);
    }
    std::printf("\n");
  }

  if (compact_ticks) {
    std::printf(
        "### The compact filter within a tick (fpp 1%%, batch test-and-insert of new ids, ns per "
        "operation by tenth of the tick, 6 ticks)\n\n");
    std::printf(
        "| state | 1st | 2nd | 3rd | 4th | 5th | 6th | 7th | 8th | 9th | 10th (clock move) |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const std::uint64_t size : {1ULL << 20, 64ULL << 20}) {
      const auto ns = compact_tick_profile(size, 6);
      std::printf("| %s |", human_bytes(size).c_str());
      for (const double x : ns) std::printf(" %.1f |", x);
      std::printf("\n");
      std::fflush(stdout);
    }
    std::printf("\n");
  }

  // This build against another one, each side in its own process (the
  // machine's load moves both sides of a round alike).
  struct Baseline {
    const std::string& path;
    const char* flag;
    const char* what;
  };
  for (const Baseline& b :
       {Baseline{timer_baseline, "--timer-only", "The 8-bit timer filter (W 192)"},
        Baseline{compact_baseline, "--compact-only", "The compact filter"}}) {
    if (b.path.empty()) continue;
    char self[4096];
    const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) {
      std::fprintf(stderr, "cannot read /proc/self/exe\n");
      return 1;
    }
    self[len] = '\0';
    std::printf(
        "### %s against a baseline build (fpp 1%%, batch test-and-insert of new ids, each side "
        "in its own process, %d alternating rounds)\n\n",
        b.what, rounds);
    std::printf(
        "| state | this build ops/s | baseline ops/s | this / baseline | rounds (this / baseline) "
        "|\n");
    std::printf("|---|---|---|---|---|\n");
    for (const std::uint64_t mib : {1ULL, 64ULL}) {
      std::vector<double> mine, base, ratio;
      std::string pairs;
      for (int r = 0; r < rounds; ++r) {
        mine.push_back(rate_of(self, b.flag, mib));
        base.push_back(rate_of(b.path, b.flag, mib));
        if (mine.back() <= 0 || base.back() <= 0) {
          std::fprintf(stderr, "a %s run failed (is '%s' a filter_bench with it?)\n", b.flag,
                       b.path.c_str());
          return 1;
        }
        ratio.push_back(mine.back() / base.back());
        char pair[64];
        std::snprintf(pair, sizeof pair, "%s%.2fM / %.2fM", r == 0 ? "" : ", ", mine.back() / 1e6,
                      base.back() / 1e6);
        pairs += pair;
      }
      std::printf("| %" PRIu64 " MiB | %.2fM | %.2fM | %.2f | %s |\n", mib, median(mine) / 1e6,
                  median(base) / 1e6, median(ratio), pairs.c_str());
      std::fflush(stdout);
    }
    std::printf("\n");
  }

  if (accuracy) {
    const std::uint64_t target = 100'000;  // distinct identities per window
    std::printf("### Memory and measured false-positive rate (pre-sized for %" PRIu64
                " ids per window, 3 windows scored)\n\n",
                target);
    std::printf("| filter | fpp | ticks/window | k | bits/element | measured FP rate | FN |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    for (double fpp : {0.01, 0.001}) {
      for (std::uint8_t bits : {4, 8, 16}) {
        const Accuracy a = measure_accuracy(FilterType::kTimer, bits, fpp, target, 1.0, 3);
        FilterConfig c;
        c.timer_bits = bits;
        std::printf("| timer %u-bit | %.3g | %u | %u | %.1f | %.4f%% | %" PRIu64 " |\n", bits, fpp,
                    kdedup::filter::normalize(c)->ticks_per_window, a.k,
                    8.0 * static_cast<double>(a.bytes) / static_cast<double>(a.capacity),
                    100 * a.fp_rate, a.false_negatives);
        std::fflush(stdout);
      }
    }
    const Accuracy e = measure_accuracy(FilterType::kExact, 8, 0.01, target, 1.0, 3);
    std::printf("| exact | 0 | 192 | - | %.1f | %.4f%% | %" PRIu64 " |\n",
                8.0 * static_cast<double>(e.bytes) / static_cast<double>(e.capacity),
                100 * e.fp_rate, e.false_negatives);

    std::printf(
        "\n### Dynamic size from a 10x under-sized start (fpp 1%%, steady rate, "
        "6 windows scored)\n\n");
    std::printf(
        "| timer | growth | pre-sized bytes | dynamic bytes at end | overhead | "
        "sub-filters | measured FP rate |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    for (std::uint8_t bits : {4, 8, 16}) {
      const Accuracy pre = measure_accuracy(FilterType::kTimer, bits, 0.01, target, 1.0, 1);
      const Accuracy dyn = measure_accuracy(FilterType::kTimer, bits, 0.01, target, 0.1, 6);
      std::printf("| %u-bit | density | %s | %s | %+.0f%% | %u | %.4f%% |\n", bits,
                  human_bytes(pre.bytes).c_str(), human_bytes(dyn.bytes).c_str(),
                  100.0 * (static_cast<double>(dyn.bytes) / static_cast<double>(pre.bytes) - 1),
                  dyn.subfilters, 100 * dyn.fp_rate);
      std::fflush(stdout);
    }
  }
  return 0;
}
