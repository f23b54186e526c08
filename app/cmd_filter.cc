// `kdedup filter`: the service's sliding-window filters over newline-delimited
// records (files or pipes, no Kafka). The stream is one partition (a
// pipeline::Slice) decided by the pipeline's PartitionProcessor with files as
// its sinks, so the decisions are the ones `kdedup run` makes for one
// partition.
//
// Time: with `--time json:/ptr` the stream clock is the largest timestamp
// seen so far (event time, max-so-far), like a partition clock; a record
// older than the clock is judged at the clock. With `--time arrival` (the
// default) the clock is the wall clock when the record is read. Clock
// milliseconds become ticks through filter::TickScale, as in `kdedup run`.
//
// Confirmed mode (`--confirm-store DIR`): the filter's duplicates are
// confirmed against an exact store of delivered fingerprints in DIR
// (state::ConfirmStore). A run has nothing to recover, so each run starts
// the store empty and skips RocksDB's write-ahead log; deliveries are staged
// in memory and moved to disk in large batches every kConfirmMove of them
// (what a snapshot does in kdedup run).

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "command.h"
#include "kdedup/common/byte_size.h"
#include "kdedup/common/duration.h"
#include "kdedup/filter/fingerprint.h"
#include "kdedup/filter/simd.h"
#include "kdedup/filter/sliding_filter.h"
#include "kdedup/filter/tick_scale.h"
#include "kdedup/identity/extractor.h"
#include "kdedup/pipeline/confirm.h"
#include "kdedup/pipeline/partition_processor.h"
#include "kdedup/pipeline/slice.h"
#include "kdedup/state/confirm_store.h"

namespace kdedup::app {
namespace {

constexpr std::size_t kBatch = 4096;           // records per test_and_insert_batch
constexpr std::size_t kReadChunk = 1 << 20;    // bytes per read(2)
constexpr std::size_t kWriteBuffer = 1 << 20;  // bytes buffered per output
constexpr std::uint64_t kInvalidReportCap = 20;
constexpr std::uint64_t kConfirmMove = 1 << 20;  // staged deliveries (50-110 MiB) per move

void print_error(const std::string& message) {
  std::fprintf(stderr, "kdedup filter: %s\n", message.c_str());
}

std::string errno_text(int err) { return std::strerror(err); }

/// Buffered line output to a file descriptor. A disabled sink (no path given
/// for an optional output) discards nothing because nothing is routed to it.
/// Remembers the first write error for flush() to report. One thread.
class LineSink {
 public:
  LineSink() = default;
  LineSink(int fd, bool owned, std::string name) : fd_(fd), owned_(owned), name_(std::move(name)) {
    buffer_.reserve(kWriteBuffer + 4096);
  }
  LineSink(LineSink&& o) noexcept { *this = std::move(o); }
  LineSink& operator=(LineSink&& o) noexcept {
    std::swap(fd_, o.fd_);
    std::swap(owned_, o.owned_);
    std::swap(name_, o.name_);
    std::swap(buffer_, o.buffer_);
    std::swap(error_, o.error_);
    return *this;
  }
  ~LineSink() {
    if (owned_ && fd_ >= 0) ::close(fd_);
  }

  bool enabled() const { return fd_ >= 0; }

  void write_line(std::string_view line) {
    buffer_.append(line);
    buffer_.push_back('\n');
    if (buffer_.size() >= kWriteBuffer) drain();
  }

  [[nodiscard]] Status flush() {
    drain();
    if (error_ != 0) return fail("writing " + name_ + ": " + errno_text(error_));
    return {};
  }

 private:
  void drain() {
    std::size_t done = 0;
    while (done < buffer_.size() && error_ == 0) {
      ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        error_ = errno;
        break;
      }
      done += static_cast<std::size_t>(n);
    }
    buffer_.clear();
  }

  int fd_ = -1;
  bool owned_ = false;
  std::string name_;
  std::string buffer_;
  int error_ = 0;
};

/// Splits a byte stream into lines, a large read at a time. The views handed
/// out stay valid until the next call. A final line without '\n' is still a
/// record. One thread.
class LineSource {
 public:
  LineSource(int fd, bool owned, std::string name)
      : fd_(fd), owned_(owned), name_(std::move(name)), buffer_(kReadChunk) {}
  ~LineSource() {
    if (owned_ && fd_ >= 0) ::close(fd_);
  }
  LineSource(const LineSource&) = delete;
  LineSource& operator=(const LineSource&) = delete;

  /// Replaces `lines` with the next complete lines (without '\n'). Returns
  /// false at the end of input.
  [[nodiscard]] Result<bool> next(std::vector<std::string_view>& lines) {
    lines.clear();
    // Keep the unfinished tail of the previous read at the front.
    if (begin_ > 0) {
      std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    std::size_t scanned = 0;
    while (true) {
      if (eof_) {
        if (end_ == 0) return false;
        lines.emplace_back(buffer_.data(), end_);  // last line, no newline
        begin_ = end_;
        return true;
      }
      if (end_ == buffer_.size()) buffer_.resize(buffer_.size() * 2);  // a very long line
      ssize_t n = ::read(fd_, buffer_.data() + end_, buffer_.size() - end_);
      if (n < 0) {
        if (errno == EINTR) continue;
        return fail("reading " + name_ + ": " + errno_text(errno));
      }
      if (n == 0) {
        eof_ = true;
        continue;
      }
      end_ += static_cast<std::size_t>(n);
      const char* base = buffer_.data();
      const char* last_newline =
          static_cast<const char*>(memrchr(base + scanned, '\n', end_ - scanned));
      if (!last_newline) {
        scanned = end_;
        continue;
      }
      const std::size_t stop = static_cast<std::size_t>(last_newline - base);
      std::size_t pos = 0;
      while (pos <= stop) {
        const char* nl = static_cast<const char*>(std::memchr(base + pos, '\n', stop + 1 - pos));
        const std::size_t len = static_cast<std::size_t>(nl - (base + pos));
        lines.emplace_back(base + pos, len);
        pos += len + 1;
      }
      begin_ = stop + 1;
      return true;
    }
  }

 private:
  int fd_;
  bool owned_;
  std::string name_;
  std::vector<char> buffer_;
  std::size_t begin_ = 0, end_ = 0;
  bool eof_ = false;
};

struct Options {
  std::string input = "-";
  std::string output = "-";
  std::string duplicates;
  std::string invalid;
  std::string key;
  std::string time = "arrival";
  std::string window;
  double fpp = 0.01;
  std::string filter = "timer";
  int timer_bits = 8;
  int equal_timers = 0;
  std::uint64_t capacity = 100'000;
  std::uint32_t ticks_per_window = 0;
  std::string growth = "density";
  std::string on_duplicate = "keep_first";
  std::string salt;
  std::string stats;
  std::string max_future_skew = "1m";
  std::string confirm_store;  ///< directory; empty = the filter decides alone
  bool strict = false;
};

struct Counters {
  std::uint64_t records_in = 0;
  std::uint64_t distinct = 0;
  std::uint64_t duplicates = 0;
  std::uint64_t invalid = 0;
  std::uint64_t bytes_peak = 0;
  std::uint32_t subfilters_peak = 0;
};

/// Everything one run needs, checked and opened; built by prepare().
struct Run {
  std::int64_t window_ms = 0;
  filter::FilterConfig config;
  /// Confirmed mode's exact store; declared before the slice, which holds
  /// a view of it.
  std::unique_ptr<state::ConfirmStore> confirm;
  /// The stream as one partition: its clock (the largest time seen, like a
  /// partition clock), filter and counters, decided by the same
  /// PartitionProcessor as kdedup run's workers.
  std::unique_ptr<pipeline::Slice> slice;
  std::optional<identity::IdentityExtractor> extractor;
  bool arrival_time = true;
  std::unique_ptr<LineSource> source;
  LineSink out, duplicates, invalid;
};

// Translates `--key` into an identity spec: `line` is the whole value; JSON
// pointers pass through. Keys and headers do not exist for lines.
Result<std::string> identity_spec_for_key(const std::string& key) {
  if (key == "line") return std::string("value");
  auto spec = identity::parse_identity_spec(key);
  if (!spec) return tl::unexpected(spec.error());
  for (const auto& part : spec->parts) {
    if (part.kind != identity::PartKind::kJson) {
      return fail("'" + key + "': lines have only `line` or json:/pointer[,json:/pointer...]");
    }
  }
  return key;
}

Result<int> open_for_read(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail("cannot open '" + path + "': " + errno_text(errno));
  return fd;
}

Result<LineSink> open_sink(const std::string& path, const char* flag, const struct stat* input) {
  if (path == "-") return LineSink(STDOUT_FILENO, false, "standard output");
  struct stat st {};
  if (input && ::stat(path.c_str(), &st) == 0 && st.st_dev == input->st_dev &&
      st.st_ino == input->st_ino && S_ISREG(st.st_mode)) {
    return fail(std::string(flag) + ": '" + path + "' is the input file; it would be overwritten");
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail(std::string(flag) + ": cannot open '" + path + "': " + errno_text(errno));
  return LineSink(fd, true, "'" + path + "'");
}

// Filter config errors name the config field; say which flag set it.
std::string config_error(const std::string& message) {
  static constexpr std::pair<std::string_view, std::string_view> kFields[] = {
      {"ticks_per_window", "--ticks-per-window"},
      {"equal_timers", "--equal-timers"},
      {"timer_bits", "--timer-bits"},
      {"capacity", "--capacity"},
      {"fpp", "--fpp"},
  };
  for (const auto& [field, flag] : kFields) {
    if (message.find(field) != std::string::npos) return std::string(flag) + ": " + message;
  }
  return "--filter: " + message;
}

// --confirm-store: the directory (parents created), refused for the exact
// filter, which has no false positives to confirm.
Result<std::unique_ptr<state::ConfirmStore>> open_confirm_store(const std::string& dir,
                                                                const filter::FilterConfig& f) {
  if (f.type == filter::FilterType::kExact) {
    return fail(
        "--confirm-store: the exact filter has no false positives to confirm; use --filter "
        "timer, aging or compact with it, or the exact filter alone");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return fail("--confirm-store: cannot create '" + dir + "': " + ec.message());
  state::ConfirmOptions co;
  co.write_ahead_log = false;  // nothing to recover: every run starts empty
  auto store = state::ConfirmStore::open(dir, co);
  if (!store) return fail("--confirm-store: " + store.error().message);
  return std::move(*store);
}

// Checks every flag value and opens every file. Errors name the flag.
Result<Run> prepare(const Options& o) {
  Run run;
  auto window = parse_duration_ms(o.window);
  if (!window) return fail("--window: " + window.error().message);
  run.window_ms = *window;

  auto key_spec = identity_spec_for_key(o.key);
  if (!key_spec) return fail("--key: " + key_spec.error().message);
  std::string time_spec;
  if (o.time != "arrival") {
    auto parsed = identity::parse_time_spec(o.time);
    if (!parsed) return fail("--time: " + parsed.error().message + " or arrival");
    time_spec = o.time;
    run.arrival_time = false;
  }
  auto extractor = identity::IdentityExtractor::create(*key_spec, time_spec);
  if (!extractor) return fail("--key: " + extractor.error().message);
  run.extractor.emplace(std::move(*extractor));

  auto type = filter::parse_filter_type(o.filter);
  if (!type) return fail("--filter: " + type.error().message);
  if (!(o.fpp > 0.0 && o.fpp < 0.5)) {
    return fail("--fpp: must be in (0, 0.5), got " + fmt::format("{}", o.fpp));
  }
  if (o.on_duplicate != "keep_first" && o.on_duplicate != "refresh") {
    return fail("--on-duplicate: '" + o.on_duplicate + "' is not keep_first or refresh");
  }
  if (o.growth != "density" && o.growth != "cardinality") {
    return fail("--growth: '" + o.growth + "' is not density or cardinality");
  }
  filter::FilterConfig config;
  config.type = *type;
  config.fpp = o.fpp;
  config.capacity = o.capacity;
  config.timer_bits = static_cast<std::uint8_t>(o.timer_bits);
  config.equal_timers = static_cast<std::uint8_t>(o.equal_timers);
  config.ticks_per_window = o.ticks_per_window;
  config.growth = o.growth == "density" ? filter::Growth::kDensity : filter::Growth::kCardinality;
  auto normalized = filter::normalize(config);
  if (!normalized) return fail(config_error(normalized.error().message));
  run.config = *normalized;
  pipeline::SliceOptions so;
  so.window_ms = run.window_ms;
  auto skew = parse_duration_ms(o.max_future_skew);
  if (!skew) return fail("--max-future-skew: " + skew.error().message);
  so.max_future_skew_ms = *skew;
  so.filter = run.config;
  so.refresh = o.on_duplicate == "refresh";
  if (!o.confirm_store.empty()) {
    auto opened = open_confirm_store(o.confirm_store, run.config);
    if (!opened) return tl::unexpected(opened.error());
    run.confirm = std::move(*opened);
    so.confirm = run.confirm.get();
  }
  auto slice = pipeline::Slice::create(pipeline::PartitionId{"input", 0}, so);
  if (!slice) return fail(config_error(slice.error().message));
  run.slice = std::move(*slice);

  struct stat input_stat {};
  const struct stat* input = nullptr;
  if (o.input == "-") {
    run.source = std::make_unique<LineSource>(STDIN_FILENO, false, "standard input");
  } else {
    auto fd = open_for_read(o.input);
    if (!fd) return fail("--input: " + fd.error().message);
    run.source = std::make_unique<LineSource>(*fd, true, "'" + o.input + "'");
    if (::fstat(*fd, &input_stat) == 0) input = &input_stat;
  }
  auto out = open_sink(o.output, "--output", input);
  if (!out) return tl::unexpected(out.error());
  run.out = std::move(*out);
  if (!o.duplicates.empty()) {
    auto sink = open_sink(o.duplicates, "--duplicates", input);
    if (!sink) return tl::unexpected(sink.error());
    run.duplicates = std::move(*sink);
  }
  if (!o.invalid.empty()) {
    auto sink = open_sink(o.invalid, "--invalid", input);
    if (!sink) return tl::unexpected(sink.error());
    run.invalid = std::move(*sink);
  }
  return run;
}

/// Moves the staged deliveries of the run's one partition to disk.
Status move_confirmed(Run& run, const pipeline::Slice& slice) {
  return run.confirm->flush_for_snapshot(
      state::PartitionKey{slice.id().topic, slice.id().partition}, slice.next_offset(), 0,
      slice.clock().now_ms());
}

std::int64_t wall_clock_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

/// Confirmed mode's figures of a run (`confirm` in --stats).
struct ConfirmFigures {
  std::uint64_t lookups = 0;
  std::uint64_t prevented = 0;
  std::uint64_t store_bytes = 0;
};

Status write_stats(const std::string& path, const Counters& c, double elapsed_s,
                   const filter::SlidingFilter& f, const std::optional<ConfirmFigures>& confirm) {
  const filter::FilterStats s = f.stats();
  const std::string confirm_json =
      confirm ? fmt::format(
                    ",\"confirm\":{{\"lookups\":{},\"prevented_false_positives\":{},"
                    "\"store_bytes\":{}}}",
                    confirm->lookups, confirm->prevented, confirm->store_bytes)
              : std::string();
  const std::string json = fmt::format(
      "{{\"records_in\":{},\"distinct\":{},\"duplicates\":{},\"invalid\":{},\"elapsed_s\":{:.6f},"
      "\"filter\":{{\"type\":\"{}\",\"bytes_peak\":{},\"bytes_final\":{},\"subfilters_peak\":{},"
      "\"subfilters_final\":{},"
      "\"fpp_estimate\":{},\"vector_instructions\":\"{}\"}}{}}}\n",
      c.records_in, c.distinct, c.duplicates, c.invalid, elapsed_s, filter::to_string(f.type()),
      std::max(c.bytes_peak, s.bytes_peak), s.bytes, std::max(c.subfilters_peak, s.subfilters),
      s.subfilters, s.fpp_estimate, filter::to_string(filter::simd_in_use()), confirm_json);
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (!file) return fail("--stats: cannot open '" + path + "': " + errno_text(errno));
  const bool ok = std::fwrite(json.data(), 1, json.size(), file) == json.size();
  const bool closed = std::fclose(file) == 0;
  if (!ok || !closed) return fail("--stats: writing '" + path + "' failed");
  return {};
}

/// Lines to the output files; invalid ones also reported on stderr (the
/// first kInvalidReportCap). One batch of lines at a time.
class FileSinks final : public pipeline::RecordSinks {
 public:
  FileSinks(Run& run, const std::vector<std::string_view>& lines, std::size_t first,
            std::uint64_t first_line, std::uint64_t& reported)
      : run_(run), lines_(lines), first_(first), first_line_(first_line), reported_(reported) {}
  void output(std::size_t i) override { run_.out.write_line(lines_[first_ + i]); }
  void duplicate(std::size_t i) override { run_.duplicates.write_line(lines_[first_ + i]); }
  void dead_letter(std::size_t i, const identity::ExtractError& e) override {
    if (++reported_ <= kInvalidReportCap) {
      print_error(fmt::format("line {}: {}: {}", first_line_ + i, identity::to_string(e.reason),
                              e.message));
    }
    if (run_.invalid.enabled()) run_.invalid.write_line(lines_[first_ + i]);
  }

 private:
  Run& run_;
  const std::vector<std::string_view>& lines_;
  std::size_t first_;
  std::uint64_t first_line_;
  std::uint64_t& reported_;
};

/// One `kdedup filter` run: the stream is one partition, through the same
/// record path as kdedup run's workers (PartitionProcessor), with the files
/// as its sinks. Single-threaded.
class FilterStream {
 public:
  FilterStream(const Options& o, Run& run)
      : o_(o),
        run_(run),
        processor_(processor_options(o, run), std::move(*run.extractor),
                   filter::Fingerprinter(o.salt)),
        counts_(*run.slice->counters()) {
    records_.reserve(kBatch);
  }

  /// Reads and decides every line; returns the exit status.
  int run();

 private:
  static pipeline::ProcessorOptions processor_options(const Options& o, const Run& run) {
    pipeline::ProcessorOptions po;
    po.on_invalid = o.strict ? config::OnInvalid::kFail : config::OnInvalid::kDlq;
    po.route_duplicates = run.duplicates.enabled();
    po.refresh = o.on_duplicate == "refresh";
    po.time_from_extractor = !run.arrival_time;
    return po;
  }
  void process_batch(const std::vector<std::string_view>& lines, std::size_t first,
                     std::size_t count);
  void show_progress();
  void flush_outputs();
  [[nodiscard]] Counters totals() const;
  [[nodiscard]] std::optional<ConfirmFigures> finish_confirmed();
  void report(const Counters& c, double elapsed_s);

  const Options& o_;
  Run& run_;
  pipeline::PartitionProcessor processor_;
  const pipeline::PartitionCounters& counts_;
  std::vector<pipeline::RecordIn> records_;
  std::uint64_t first_line_ = 1;  // line number of records_[0]
  std::uint64_t bytes_peak_ = 0;
  std::uint32_t subfilters_peak_ = 0;
  std::uint64_t reported_ = 0;  // invalid lines reported on stderr
  bool strict_failed_ = false;
  int exit_code_ = kExitOk;
  bool progress_ = ::isatty(STDERR_FILENO) == 1;
  bool progress_shown_ = false;
  std::chrono::steady_clock::time_point last_progress_ = std::chrono::steady_clock::now();
};

int FilterStream::run() {
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::string_view> lines;
  while (!strict_failed_) {
    auto more = run_.source->next(lines);
    if (!more) {
      print_error(more.error().message);
      exit_code_ = kExitFailure;
      break;
    }
    if (!*more) break;
    for (std::size_t first = 0; first < lines.size() && !strict_failed_; first += kBatch) {
      process_batch(lines, first, std::min(kBatch, lines.size() - first));
    }
    show_progress();
  }
  if (progress_shown_) std::fputc('\n', stderr);
  flush_outputs();
  const double elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  report(totals(), elapsed_s);
  // --strict's usage status, unless the run failed otherwise (a confirm
  // store failure also stops the reading).
  if (strict_failed_ && exit_code_ == kExitOk) return kExitUsage;
  return exit_code_;
}

void FilterStream::process_batch(const std::vector<std::string_view>& lines, std::size_t first,
                                 std::size_t count) {
  const std::int64_t now_ms = wall_clock_ms();
  records_.clear();
  for (std::size_t i = 0; i < count; ++i) {
    pipeline::RecordIn r;
    r.offset = static_cast<std::int64_t>(first_line_ + i);
    r.timestamp_ms = run_.arrival_time ? now_ms : 0;
    r.view.value = lines[first + i];
    records_.push_back(r);
  }
  FileSinks sinks(run_, lines, first, first_line_, reported_);
  const pipeline::BatchResult result = processor_.process(*run_.slice, records_, now_ms, sinks);
  if (result.slice_failed) {
    print_error(*result.fail_message);
    exit_code_ = kExitFailure;
    strict_failed_ = true;  // stop reading: nothing more can be decided
    return;
  }
  if (result.fail_error) {
    const std::uint64_t line_no = first_line_ + result.processed;
    print_error(fmt::format("line {}: {}: {}", line_no,
                            identity::to_string(result.fail_error->reason),
                            result.fail_error->message));
    print_error(fmt::format("line {} is invalid and --strict is set; stopping", line_no));
    strict_failed_ = true;
  }
  first_line_ += count;
  if (run_.confirm && run_.slice->confirmer()->store().staged() >= kConfirmMove) {
    if (auto moved = move_confirmed(run_, *run_.slice); !moved) {
      print_error(moved.error().message);
      exit_code_ = kExitFailure;
      strict_failed_ = true;
      return;
    }
  }
  const filter::FilterStats s = run_.slice->filter()->stats();
  bytes_peak_ = std::max(bytes_peak_, s.bytes_peak);
  subfilters_peak_ = std::max(subfilters_peak_, s.subfilters);
}

/// Counts on a terminal's stderr, rewritten once a second.
void FilterStream::show_progress() {
  if (!progress_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_progress_ < std::chrono::seconds(1)) return;
  last_progress_ = now;
  progress_shown_ = true;
  std::fprintf(stderr, "\r%llu records, %llu distinct, %llu duplicates, %llu invalid ",
               static_cast<unsigned long long>(counts_.records_in.load()),
               static_cast<unsigned long long>(counts_.distinct.load()),
               static_cast<unsigned long long>(counts_.duplicates.load()),
               static_cast<unsigned long long>(counts_.invalid.load()));
}

void FilterStream::flush_outputs() {
  for (LineSink* sink : {&run_.out, &run_.duplicates, &run_.invalid}) {
    if (!sink->enabled()) continue;
    if (auto flushed = sink->flush(); !flushed) {
      print_error(flushed.error().message);
      exit_code_ = kExitFailure;
    }
  }
}

Counters FilterStream::totals() const {
  Counters c;
  c.records_in = counts_.records_in.load();
  c.distinct = counts_.distinct.load();
  c.duplicates = counts_.duplicates.load();
  c.invalid = counts_.invalid.load();
  c.bytes_peak = bytes_peak_;
  c.subfilters_peak = subfilters_peak_;
  return c;
}

/// Confirmed mode at the end of a run: the last staged deliveries to disk
/// (so store_bytes is the whole store), a summary line, the --stats figures.
std::optional<ConfirmFigures> FilterStream::finish_confirmed() {
  if (!run_.confirm) return std::nullopt;
  const pipeline::Slice& slice = *run_.slice;
  if (exit_code_ == kExitOk) {
    if (auto moved = move_confirmed(run_, slice); !moved) {
      print_error(moved.error().message);
      exit_code_ = kExitFailure;
    }
  }
  const pipeline::ConfirmCounts cc = slice.counters()->confirm.read();
  const ConfirmFigures f{cc.lookups, cc.prevented, run_.confirm->approximate_bytes()};
  std::fprintf(stderr,
               "kdedup filter: confirmed in %s: %llu duplicates of the filter looked up, %llu "
               "false positives prevented, store %s\n",
               run_.confirm->dir().c_str(), static_cast<unsigned long long>(f.lookups),
               static_cast<unsigned long long>(f.prevented), format_bytes(f.store_bytes).c_str());
  return f;
}

/// The summary line on stderr, and --stats.
void FilterStream::report(const Counters& c, double elapsed_s) {
  if (c.invalid > kInvalidReportCap && !o_.strict) {
    print_error(fmt::format("{} more invalid lines not shown", c.invalid - kInvalidReportCap));
  }
  const filter::SlidingFilter& f = *run_.slice->filter();
  const filter::FilterStats s = f.stats();
  std::fprintf(
      stderr,
      "kdedup filter: %llu records in, %llu distinct, %llu duplicates, %llu invalid in "
      "%.3f s; %s filter %s (peak %s)\n",
      static_cast<unsigned long long>(c.records_in), static_cast<unsigned long long>(c.distinct),
      static_cast<unsigned long long>(c.duplicates), static_cast<unsigned long long>(c.invalid),
      elapsed_s, filter::to_string(f.type()), format_bytes(s.bytes).c_str(),
      format_bytes(std::max(c.bytes_peak, s.bytes_peak)).c_str());
  const std::optional<ConfirmFigures> confirm = finish_confirmed();
  if (!o_.stats.empty()) {
    if (auto written = write_stats(o_.stats, c, elapsed_s, f, confirm); !written) {
      print_error(written.error().message);
      exit_code_ = kExitFailure;
    }
  }
}

int run_filter(const Options& o) {
  auto prepared = prepare(o);
  if (!prepared) {
    print_error(prepared.error().message);
    return kExitUsage;
  }
  return FilterStream(o, *prepared).run();
}

int filter_main(int argc, char** argv) {
  CLI::App app{
      "Drop duplicate lines within a sliding time window, with the same filters as the "
      "Kafka service. Distinct lines go to the output unchanged and in input order.",
      "kdedup filter"};
  Options o;
  app.add_option("--input", o.input, "Input file of newline-delimited records ('-' = stdin)")
      ->capture_default_str();
  app.add_option("--output", o.output, "Where distinct lines go ('-' = stdout)")
      ->capture_default_str();
  app.add_option("--duplicates", o.duplicates, "Write duplicate lines to this file");
  app.add_option("--invalid", o.invalid,
                 "Write lines whose identity or time cannot be read to this file");
  app.add_option("--key", o.key,
                 "Identity: 'line' (the whole line) or json:/ptr[,json:/ptr...] (RFC 6901 "
                 "pointers into a JSON object per line)")
      ->required();
  app.add_option("--time", o.time,
                 "Event time: json:/ptr (integer epoch milliseconds; the clock is the largest "
                 "time seen) or 'arrival' (wall clock when read)")
      ->capture_default_str();
  app.add_option("--window", o.window, "Sliding window, e.g. 500ms, 30s, 10m, 24h")->required();
  app.add_option("--max-future-skew", o.max_future_skew,
                 "Times beyond the wall clock plus this count as wall clock plus this, as in "
                 "kdedup run (default 1m)");
  app.add_option("--fpp", o.fpp, "Target false-positive probability")->capture_default_str();
  app.add_option("--filter", o.filter, "Filter type: timer, exact, aging or compact")
      ->capture_default_str();
  app.add_option("--timer-bits", o.timer_bits, "Timer filter: bits per cell")
      ->check(CLI::IsMember({4, 8, 16}))
      ->capture_default_str();
  app.add_option("--equal-timers", o.equal_timers,
                 "Timer filter: duplicate only if K of the k timers are equal (0 = off)")
      ->check(CLI::Range(0, 255))
      ->capture_default_str();
  app.add_option("--capacity", o.capacity,
                 "Expected distinct identities per window: a starting hint (the filter starts "
                 "at no more than 64 KiB and sizes itself from the insertion rate)")
      ->check(CLI::Range(std::uint64_t{1}, std::numeric_limits<std::uint64_t>::max()))
      ->capture_default_str();
  app.add_option("--ticks-per-window", o.ticks_per_window,
                 "Window precision in ticks (default: the filter type's)")
      ->check(CLI::Range(std::uint32_t{1}, std::numeric_limits<std::uint32_t>::max()));
  app.add_option("--on-duplicate", o.on_duplicate,
                 "keep_first: remember an identity one window from its delivery; refresh: every "
                 "duplicate renews it (repeats stay suppressed while they continue)")
      ->capture_default_str();
  app.add_option("--growth", o.growth, "Timer filter growth: density or cardinality")
      ->capture_default_str();
  app.add_option("--salt", o.salt, "Secret salt for identity hashing")->envname("KDEDUP_SALT");
  app.add_option("--stats", o.stats, "Write run statistics as one JSON object to this file");
  app.add_option("--confirm-store", o.confirm_store,
                 "Confirmed mode: confirm every duplicate the filter finds against an exact "
                 "store of delivered fingerprints in this directory (created if missing, "
                 "emptied at the start of each run; timer, aging or compact filter): no false "
                 "positives, RAM of the filter plus RocksDB's caches");
  app.add_flag("--strict", o.strict, "Stop with exit code 2 at the first invalid line");
  if (auto code = kdedup::app::parse_command_line(app, argc, argv)) return *code;
  return run_filter(o);
}

const CommandRegistration kFilterCommand{
    "filter", "deduplicate newline-delimited records from files or stdin (no Kafka)", filter_main};

}  // namespace
}  // namespace kdedup::app
