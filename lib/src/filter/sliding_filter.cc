// Shared parts of the filter family: config validation and encoding, the
// default batch loop, and the factory that maps FilterType to a class.

#include "kdedup/filter/sliding_filter.h"

#include <cmath>

#include "kdedup/common/bytes.h"
#include "kdedup/filter/aging_filter.h"
#include "kdedup/filter/compact_filter.h"
#include "kdedup/filter/config_codec.h"
#include "kdedup/filter/exact_filter.h"
#include "kdedup/filter/timer_filter.h"

namespace kdedup::filter {

void test_and_refresh_batch(SlidingFilter& filter, std::span<const Fingerprint> fps,
                            std::span<const Tick> ticks, std::span<Decision> out) {
  // One element at a time: a batch call would decide a later copy before
  // this one's renewal, and the cells a renewal touches can change the
  // decisions of other fingerprints too (probabilistic filters).
  for (std::size_t i = 0; i < fps.size(); ++i) {
    out[i] = filter.test_and_insert(fps[i], ticks[i]);
    if (out[i] == Decision::kDuplicate) filter.insert(fps[i], ticks[i]);
  }
}

void SlidingFilter::test_and_insert_batch(std::span<const Fingerprint> fps,
                                          std::span<const Tick> ticks, std::span<Decision> out) {
  for (std::size_t i = 0; i < fps.size(); ++i) out[i] = test_and_insert(fps[i], ticks[i]);
}

void SlidingFilter::set_memory_budget(std::shared_ptr<MemoryBudget>) {}

const char* to_string(FilterType type) noexcept {
  switch (type) {
    case FilterType::kTimer:
      return "timer";
    case FilterType::kAging:
      return "aging";
    case FilterType::kExact:
      return "exact";
    case FilterType::kCompact:
      return "compact";
  }
  return "unknown";
}

Result<FilterType> parse_filter_type(std::string_view name) {
  if (name == "timer") return FilterType::kTimer;
  if (name == "aging") return FilterType::kAging;
  if (name == "exact") return FilterType::kExact;
  if (name == "compact") return FilterType::kCompact;
  return fail("unknown filter type '" + std::string(name) +
              "' (use timer, aging, exact or compact)");
}

Result<FilterConfig> normalize(FilterConfig c) {
  if (!(c.fpp > 0.0 && c.fpp < 0.5)) {
    return fail("fpp must be in (0, 0.5), got " + std::to_string(c.fpp));
  }
  if (c.capacity == 0) return fail("capacity must be at least 1");
  switch (c.type) {
    case FilterType::kTimer:
      if (c.timer_bits != 4 && c.timer_bits != 8 && c.timer_bits != 16) {
        return fail("timer_bits must be 4, 8 or 16, got " + std::to_string(c.timer_bits));
      }
      break;
    case FilterType::kAging:
      // choose_aging_shape() searches k up to AgingFilter::kMaxK.
      if (c.fpp < AgingFilter::kMinFpp) {
        return fail("fpp must be at least 1e-9 for the aging filter");
      }
      break;
    case FilterType::kExact:
      break;
    case FilterType::kCompact:
      if (c.fpp < CompactFilter::kMinFpp) {
        return fail("fpp must be at least 1e-7 for the compact filter");
      }
      break;
    default:
      return fail("unknown filter type " + std::to_string(static_cast<int>(c.type)));
  }
  if (c.ticks_per_window == 0) {
    // Timer filters: leave room under the wrapping clock for the scrub
    // (see timer_filter.h); the others default to the 8-bit timer's precision.
    if (c.type == FilterType::kTimer) {
      c.ticks_per_window = c.timer_bits == 4 ? 8 : c.timer_bits == 8 ? 192 : 4096;
    } else if (c.type == FilterType::kCompact) {
      // One tick is 10% of the window: the coarsest edge allowed, and 4-bit
      // tags with room for the scrub (compact_filter.h).
      c.ticks_per_window = 10;
    } else {
      c.ticks_per_window = 192;
    }
  }
  if (c.type == FilterType::kTimer &&
      c.ticks_per_window > max_timer_ticks_per_window(c.timer_bits)) {
    // The scrub needs clock values between "dead" and "wrapped" (timer_filter.h).
    return fail("ticks_per_window " + std::to_string(c.ticks_per_window) + " is too large for " +
                std::to_string(c.timer_bits) + "-bit timers (at most " +
                std::to_string(max_timer_ticks_per_window(c.timer_bits)) +
                "); use wider timer_bits or fewer ticks per window");
  }
  if (c.type == FilterType::kCompact) {
    if (c.ticks_per_window > kMaxCompactTicksPerWindow) {
      // Tags of at most 8 bits, with room for the scrub (compact_filter.h).
      return fail("ticks_per_window " + std::to_string(c.ticks_per_window) +
                  " is too large for the compact filter (at most " +
                  std::to_string(kMaxCompactTicksPerWindow) + ")");
    }
    const unsigned tag = compact_tag_bits(c.ticks_per_window);
    if (!compact_fpp_supported(c.fpp, tag)) {
      return fail("fpp " + std::to_string(c.fpp) + " is too small for the compact filter with " +
                  std::to_string(c.ticks_per_window) + " ticks per window (" + std::to_string(tag) +
                  "-bit tags): raise fpp or use fewer ticks");
    }
  }
  if (c.min_bytes == 0 || c.max_bytes < c.min_bytes) {
    return fail("max_bytes must be >= min_bytes > 0");
  }
  return c;
}

void write_config(ByteWriter& w, const FilterConfig& c) {
  w.put<std::uint8_t>(static_cast<std::uint8_t>(c.type));
  w.put<std::uint32_t>(c.ticks_per_window);
  w.put<double>(c.fpp);
  w.put<std::uint64_t>(c.capacity);
  w.put<std::uint8_t>(c.timer_bits);
  w.put<std::uint8_t>(c.equal_timers);
  w.put<std::uint8_t>(static_cast<std::uint8_t>(c.growth));
  w.put<std::uint64_t>(c.min_bytes);
  w.put<std::uint64_t>(c.max_bytes);
}

Result<FilterConfig> read_config(ByteReader& r) {
  FilterConfig c;
  auto type = r.get<std::uint8_t>("config.type");
  auto ticks = r.get<std::uint32_t>("config.ticks_per_window");
  auto fpp = r.get<double>("config.fpp");
  auto capacity = r.get<std::uint64_t>("config.capacity");
  auto bits = r.get<std::uint8_t>("config.timer_bits");
  auto equal = r.get<std::uint8_t>("config.equal_timers");
  auto growth = r.get<std::uint8_t>("config.growth");
  auto min_bytes = r.get<std::uint64_t>("config.min_bytes");
  auto max_bytes = r.get<std::uint64_t>("config.max_bytes");
  if (!type || !ticks || !fpp || !capacity || !bits || !equal || !growth || !min_bytes ||
      !max_bytes) {
    return fail("filter state: truncated config");
  }
  if (*growth > 1) return fail("filter state: bad growth mode");
  c.type = static_cast<FilterType>(*type);
  c.ticks_per_window = *ticks;
  c.fpp = *fpp;
  c.capacity = *capacity;
  c.timer_bits = *bits;
  c.equal_timers = *equal;
  c.growth = static_cast<Growth>(*growth);
  c.min_bytes = *min_bytes;
  c.max_bytes = *max_bytes;
  if (c.ticks_per_window == 0) return fail("filter state: ticks_per_window is 0");
  auto normalized = normalize(c);
  if (!normalized) return fail("filter state: " + normalized.error().message);
  return normalized;
}

std::uint64_t config_fingerprint(const FilterConfig& config) {
  std::string bytes;
  ByteWriter w(bytes);
  write_config(w, config);
  // A compact filter's state format is part of what its snapshots need:
  // state of another format is a changed configuration (compact_filter.h).
  if (config.type == FilterType::kCompact) w.put<std::uint16_t>(kCompactStateVersion);
  return hash64(bytes, 0x636f6e666967ULL);
}

Result<std::unique_ptr<SlidingFilter>> make_filter(const FilterConfig& raw) {
  auto config = normalize(raw);
  if (!config) return tl::unexpected(config.error());
  switch (config->type) {
    case FilterType::kTimer: {
      auto timer = TimerFilter::create(*config);
      if (!timer) return tl::unexpected(timer.error());
      return std::unique_ptr<SlidingFilter>(std::move(*timer));
    }
    case FilterType::kAging:
      return std::unique_ptr<SlidingFilter>(std::make_unique<AgingFilter>(*config));
    case FilterType::kExact:
      return std::unique_ptr<SlidingFilter>(std::make_unique<ExactFilter>(*config));
    case FilterType::kCompact: {
      auto compact = CompactFilter::create(*config);
      if (!compact) return tl::unexpected(compact.error());
      return std::unique_ptr<SlidingFilter>(std::move(*compact));
    }
    default:
      break;
  }
  return fail(std::string("filter type '") + to_string(config->type) + "' is not available");
}

Result<std::unique_ptr<SlidingFilter>> restore_filter(std::string_view blob) {
  auto env = open_envelope(blob, "filter state");
  if (!env) return tl::unexpected(env.error());
  switch (static_cast<FilterType>(env->kind)) {
    case FilterType::kTimer:
      return TimerFilter::restore(env->payload, env->version);
    case FilterType::kAging:
      return AgingFilter::restore(env->payload, env->version);
    case FilterType::kExact:
      return ExactFilter::restore(env->payload, env->version);
    case FilterType::kCompact:
      return CompactFilter::restore(env->payload, env->version);
    default:
      break;
  }
  return fail("filter state: unknown filter kind " + std::to_string(env->kind));
}

}  // namespace kdedup::filter
