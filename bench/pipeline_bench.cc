// Pipeline throughput on the test broker: the same harness measures
// configurations of `kdedup run` one after the other in one run, and prints
// records/s and the measured process's CPU seconds (user + system, from
// /proc) per million records for each, and their ratios.
//
//   --compare filter (default): the filter off (filter.enabled: false,
//     passthrough: every record is distinct) against on (timer filter, fpp
//     0.01); target ratio >= 0.9.
//   --compare snapshots: dedup without snapshots (state.dir: "") against
//     dedup snapshotting every partition every second (state.dir in the run's
//     work dir, state.snapshot_interval: 1s); target ratio >= 0.8. The
//     snapshots written, their bytes and write time during the timed part are
//     read from the instance's /metrics before and after it (one instance).
//
//   --compare cost: the physical limit and what kdedup adds to it: a raw
//     librdkafka copy (bench/raw_copy.cc: consume -> produce with the same
//     client settings and batch size, auto commit, nothing else), passthrough,
//     dedup with the timer filter and with the exact filter; beside CPU, the
//     context switches of the instance's threads per 1,000 records. Targets: CPU per
//     record of dedup (timer) <= 1.3x the raw copy's, passthrough <= 1.2x.
//     --baseline-binary PATH adds passthrough and dedup (timer) of another
//     kdedup binary (a build from before a change) to the same rounds; given
//     more than once, each is a row pair ("baseline 1", "baseline 2", ...).
//
//   --compare format: the raw copy alone, with kdedup's headers only, with
//     a delivery report per record only, and with both (the "raw copy,
//     kdedup headers" row of --compare cost): where the output format's
//     cost inside librdkafka goes.
//
//   --compare scale: the raw copy and dedup (timer) at --partitions and at
//     --scale-partitions (1024 by default) partitions on one instance, side
//     by side in each round; beside the table, how much each one's CPU per
//     record grew from the smaller to the larger count, per round (median
//     and range), and the timer's growth over the raw copy's: what kdedup
//     adds to librdkafka's own cost of many partitions. Target: dedup
//     (timer) within 1.2x of its figure at the smaller count.
//
//   --compare confirm: dedup with the timer filter alone against confirmed
//     mode (filter.confirm_store: true: every duplicate confirmed in the
//     exact store under state.dir, deliveries moved to disk with each
//     snapshot), both snapshotting every partition every second into their
//     state.dir; the click stream holds ~44% duplicates. Target ratio >= 0.5.
//     Confirmed mode's output is judged as an exact filter's (fpp 0).
//
//   --compare repartition (or --repartition): keyed input deduplicated
//     directly against unkeyed input (each record to a fixed, identity-blind
//     partition) re-keyed by the repartition stage (`repartition:`, internal
//     topic of --partitions partitions) and then deduplicated, both stages in
//     the measured process: what the stage costs. Target: at most 2x, i.e.
//     records/s ratio >= 0.5 (the CPU ratio is printed beside it).
//
// Each measurement: fresh test broker and one `kdedup run` instance; a small
// warm-up batch is produced and fully committed first (group joined,
// partitions assigned), then the timed batch is produced while the instance
// consumes it concurrently (--backlog: while it is stopped, and the clock
// starts when it is resumed); the clock stops when the group has committed
// every input offset (output is delivered before offsets are committed).
// The test broker keeps at most ~5 MiB per partition, so the harness checks
// that every input and output partition still starts at offset 0 and that
// the input holds every record; then that passthrough (and the raw copy)
// emitted every record, and that every deduplicating mode's output passes
// the output oracle the tests use (output_oracle.h). The stream and those
// checks are testbroker::ClickRun, the run `kdedup demo` is made of too.
//
// Modes alternate (first, second, first, ...) --repeat times and the median
// of each is reported, so load from other processes on the machine hits both
// alike.
//
// --idle-partitions P measures memory instead (DESIGN.md "Memory follows
// load"): one `kdedup run` (filter.capacity: 1000000, the documented default)
// is assigned P partitions; its resident set (VmRSS, and the peak VmHWM),
// the sum of kdedup_filter_bytes and kdedup_memory_used_bytes are read once
// every partition is assigned and nothing was produced, then again after
// --records distinct keys (all inside the window, spread over the partitions
// by key) were processed; beside memory it prints how long the instance took
// from its start to every partition assigned, its CPU while idle (share of
// one core over 3 s once assigned), the load's records/s and CPU
// seconds per million records (consumed while produced; see --backlog), how
// long a rebalance takes that moves half of the partitions to a second instance
// (started to both holding a share of all), and the longest line either
// instance logged, and what one /metrics scrape costs the loaded instance
// (CPU ms, KiB, sample lines). --threads T sets the instance's worker threads.
// --park-after D (this build only) gives the instance a state dir, snapshots
// every second and state.park_after D, and reads its memory a third time
// once every partition parked after the load (a quiet instance; baselines
// run without snapshots as before, and print no third row). D = 0: the same
// with parking off, the third figure 10 s after the load.
// --backlog (here and in the --compare modes) stops the instance (SIGSTOP)
// while the records are produced and resumes it once they all are:
// records/s and CPU per record are then those of the instance working
// through a backlog in full batches (its capacity), not of a race with the
// producer on the same cores, whose batch sizes vary from run to run.
// --baseline-binary PATH (repeatable) runs the same against
// another kdedup binary (e.g. a build from before this change) first, so
// both lines come from one run.
// --event-span MS (the --compare modes): the event time the click stream's
// timestamps span, 300000 (5 minutes) by default. A run reads them in a few
// seconds, so event time runs far ahead of the wall clock and every
// partition's timer filter crosses many ticks (each one a share of its
// sweep); a span near the run's own length measures a stream that keeps up
// with real time. The duplicates per window change with it (the output
// counts say how).
//
//   pipeline_bench [--compare filter|snapshots|cost|format|scale|confirm|repartition]
//                  [--records N] [--partitions P] [--scale-partitions P]
//                  [--instances I] [--repeat R] [--backlog] [--event-span MS]
//   pipeline_bench --compare cost [--baseline-binary PATH] [--records N] ...
//   pipeline_bench --idle-partitions P [--records N] [--backlog] [--baseline-binary PATH]
//                  [--park-after D]

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "kdedup/testbroker/click_run.h"
#include "kdedup/testbroker/kafka_io.h"
#include "kdedup/testbroker/output_oracle.h"
#include "kdedup/testbroker/pipeline_rig.h"

namespace {

namespace tb = kdedup::testbroker;
using Clock = std::chrono::steady_clock;

constexpr const char* kConfig = R"(group_id: kdedup-bench
input:
  topics: [clicks]
output:
  topic: clicks-distinct
identity:
  extractor: key
  salt: bench-salt
window: 1m
max_future_skew: 10s
filter:
  type: timer
  fpp: 0.01
  capacity: 100000
threads: 2
on_invalid: dlq
dlq_topic: clicks-dlq
commit_interval: 200ms
shutdown_timeout: 10s
kafka:
  bootstrap.servers: ${KDEDUP_BOOTSTRAP}
# The test broker's coordinator waits up to a session timeout (librdkafka's
# default: 45 s) for members before it rebalances: keep it short, so a
# measured rebalance is kdedup's work and not that wait.
consumer:
  session.timeout.ms: "6000"
  heartbeat.interval.ms: "500"
log_level: warn
)";

struct Options {
  std::string compare = "filter";
  std::uint64_t records = 150'000;
  int partitions = 8;
  int scale_partitions = 1024;  ///< the larger count of --compare scale
  int instances = 1;
  int repeat = 3;
  int idle_partitions = 0;  ///< > 0: the memory measurement instead
  /// Other kdedup binaries (builds from before a change) measured beside
  /// this build; --baseline-binary may be given more than once.
  std::vector<std::string> baseline_binaries;
  int threads = 0;         ///< > 0: threads of the instance (--idle-partitions)
  std::string park_after;  ///< --idle-partitions: state.park_after of this build; empty: none
  bool backlog = false;    ///< the timed records produced first, then consumed
  /// Event time the click stream's timestamps span (--event-span).
  std::int64_t event_span_ms = 300'000;
};

/// One side of a comparison: a name and the --set overrides that make it.
/// The rig gives every instance its own state.dir in the run's work dir.
struct Mode {
  std::string name;
  std::string slug;  ///< work dir name
  std::vector<std::string> overrides;
  bool all_distinct = false;       ///< every record must come out (passthrough)
  std::string binary;              ///< run this instead of kdedup (same command line)
  std::string repartition_topic;   ///< non-empty: run the repartition stage into it
  bool random_partitions = false;  ///< produce unkeyed: partition unrelated to the key
  /// Judged as an exact filter (fpp 0): confirmed mode prevents every false
  /// positive of its filter, so none is accepted.
  bool exact = false;
  int partitions = 0;  ///< > 0: the input's partitions for this mode (else --partitions)
};

struct Comparison {
  std::vector<Mode> modes;        ///< the first is the reference of the ratios
  double target = 0;              ///< for the last mode against the first; 0 = none
  bool snapshot_figures = false;  ///< read snapshot metrics over the timed part
};

/// The raw librdkafka copy (bench/raw_copy.cc) in place of kdedup, every
/// record copied; with `set`, asked for part of kdedup's output format.
Mode raw_copy(const std::string& what = "", const std::string& slug = "",
              const std::string& set = "") {
  if (set.empty()) return {"raw librdkafka copy", "raw-copy", {}, true, RAW_COPY_BINARY};
  return {"raw copy" + what, "raw-copy-" + slug, {set}, true, RAW_COPY_BINARY};
}

/// The raw copy asked for all kdedup's output format needs from librdkafka.
Mode raw_copy_with_format() {
  return raw_copy(", kdedup headers", "provenance", "raw_copy.provenance=true");
}

/// A mode run at `partitions` input partitions, named for them.
Mode at_partitions(Mode mode, int partitions) {
  mode.name += fmt::format(" @{}", partitions);
  mode.slug += fmt::format("-p{}", partitions);
  mode.partitions = partitions;
  return mode;
}

Comparison comparison(const Options& opt) {
  const std::string& name = opt.compare;
  if (name == "snapshots") {
    return {{{"dedup, no snapshots", "no-snapshots", {"filter.enabled=true", "state.dir="}},
             {"dedup + snapshots 1s",
              "snapshots",
              {"filter.enabled=true", "state.snapshot_interval=1s"}}},
            0.8,
            true};
  }
  if (name == "repartition") {
    Mode unkeyed{"unkeyed + repartition", "repartition", {"filter.enabled=true"}};
    unkeyed.repartition_topic = "clicks-by-id";
    unkeyed.random_partitions = true;
    return {{{"keyed, dedup only", "keyed", {"filter.enabled=true"}}, unkeyed}, 0.5, false};
  }
  if (name == "confirm") {
    Mode confirmed{
        "dedup (timer, confirmed)",
        "dedup-confirmed",
        {"filter.enabled=true", "filter.confirm_store=true", "state.snapshot_interval=1s"}};
    confirmed.exact = true;
    return {
        {{"dedup (timer)", "dedup-timer", {"filter.enabled=true", "state.snapshot_interval=1s"}},
         confirmed},
        0.5,
        false};
  }
  if (name == "format") {
    // What kdedup's output format costs inside librdkafka, in halves: the
    // headers (the input's list taken over, three provenance headers added)
    // and a delivery report per record, each alone and both together.
    return {{raw_copy(), raw_copy(" + headers", "headers", "raw_copy.headers=true"),
             raw_copy(" + delivery reports", "reports", "raw_copy.reports=true"),
             raw_copy_with_format()},
            0,
            false};
  }
  if (name == "scale") {
    // Each size's physical limit beside it; the growth figures pair them.
    const Mode timer{"dedup (timer)", "dedup-timer", {"filter.enabled=true", "filter.type=timer"}};
    return {{at_partitions(raw_copy(), opt.partitions), at_partitions(timer, opt.partitions),
             at_partitions(raw_copy(), opt.scale_partitions),
             at_partitions(timer, opt.scale_partitions)},
            0,
            false};
  }
  if (name == "cost") {
    // The physical limit first: the ratios are kdedup's cost over it.
    return {{raw_copy(),
             raw_copy_with_format(),
             {"passthrough", "passthrough", {"filter.enabled=false"}, true},
             {"dedup (timer)", "dedup-timer", {"filter.enabled=true", "filter.type=timer"}},
             {"dedup (exact)", "dedup-exact", {"filter.enabled=true", "filter.type=exact"}}},
            0,
            false};
  }
  return {{{"passthrough", "passthrough", {"filter.enabled=false"}, true},
           {"dedup", "dedup", {"filter.enabled=true"}}},
          0.9,
          false};
}

/// What the rows of a baseline binary are called: "baseline", or
/// "baseline K" (K from 1, in command-line order) when there are several.
std::string baseline_label(const Options& opt, const std::string& path) {
  const auto& all = opt.baseline_binaries;
  if (all.size() == 1) return "baseline";
  const auto k = std::find(all.begin(), all.end(), path) - all.begin();
  return "baseline " + std::to_string(k + 1);
}

std::string slug_of(std::string label) {
  std::replace(label.begin(), label.end(), ' ', '-');
  return label;
}

/// A process's user and system CPU seconds so far, from /proc/PID/stat;
/// negative when unreadable.
struct CpuTimes {
  double user = -1, sys = -1;
};

CpuTimes cpu_times(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return {};
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  // Fields 3.. after the name: state is field 3, utime 14, stime 15.
  for (int f = 3; f <= 15 && rest >> field; ++f) {
    if (f == 14) utime = std::stoull(field);
    if (f == 15) stime = std::stoull(field);
  }
  const auto tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  return {static_cast<double>(utime) / tick, static_cast<double>(stime) / tick};
}

/// CPU seconds (user + system) a process has used so far.
double cpu_seconds(pid_t pid) {
  const CpuTimes t = cpu_times(pid);
  return t.user < 0 ? -1 : t.user + t.sys;
}

/// Context switches (voluntary + involuntary) every live thread of a
/// process has made so far, from /proc/PID/task/*/status: how often its
/// threads hand work to each other and wait. Threads that ended are not
/// counted; negative when unreadable.
double context_switches(pid_t pid) {
  std::error_code ec;
  std::filesystem::directory_iterator tasks("/proc/" + std::to_string(pid) + "/task", ec);
  if (ec) return -1;
  double sum = 0;
  for (const auto& task : tasks) {
    std::ifstream in(task.path() / "status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0 ||
          line.rfind("nonvoluntary_ctxt_switches:", 0) == 0) {
        sum += std::stod(line.substr(line.find(':') + 1));
      }
    }
  }
  return sum;
}

/// Sums of the instance's metric samples that matter while snapshotting.
struct SnapshotFigures {
  double snapshots = 0, failures = 0, bytes = 0, write_seconds = 0, busy_seconds = 0;

  SnapshotFigures minus(const SnapshotFigures& b) const {
    return {snapshots - b.snapshots, failures - b.failures, bytes - b.bytes,
            write_seconds - b.write_seconds, busy_seconds - b.busy_seconds};
  }
};

/// Closes a socket when it goes out of scope.
struct Socket {
  int fd = -1;
  ~Socket() {
    if (fd >= 0) close(fd);
  }
};

/// GET /metrics from 127.0.0.1:port (HTTP/1.0: the server closes after the
/// body, so reading to EOF is the whole answer).
kdedup::Result<std::string> scrape(int port) {
  Socket s{socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  if (s.fd < 0) return kdedup::fail(fmt::format("socket: {}", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(s.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return kdedup::fail(fmt::format("cannot reach the instance's /metrics on port {}: {}", port,
                                    std::strerror(errno)));
  }
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (send(s.fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    return kdedup::fail(fmt::format("GET /metrics: {}", std::strerror(errno)));
  }
  std::string reply;
  char buf[65536];
  for (ssize_t n; (n = recv(s.fd, buf, sizeof buf, 0)) > 0;) reply.append(buf, n);
  const auto body = reply.find("\r\n\r\n");
  if (reply.rfind("HTTP/1.", 0) != 0 || reply.find(" 200 ") > reply.find('\n') ||
      body == std::string::npos) {
    return kdedup::fail("GET /metrics: unexpected answer: " + reply.substr(0, 200));
  }
  return reply.substr(body + 4);
}

/// Sum of every sample of `name` (any labels) in an exposition text.
double sum_samples(const std::string& text, const std::string& name) {
  double sum = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    if (line[name.size()] != '{' && line[name.size()] != ' ') continue;
    sum += std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr);
  }
  return sum;
}

kdedup::Result<SnapshotFigures> snapshot_figures(int port) {
  auto text = scrape(port);
  if (!text) return tl::unexpected(text.error());
  SnapshotFigures f;
  f.snapshots = sum_samples(*text, "kdedup_snapshots_total");
  f.failures = sum_samples(*text, "kdedup_snapshot_failures_total");
  f.bytes = sum_samples(*text, "kdedup_snapshot_written_bytes_total");
  f.write_seconds = sum_samples(*text, "kdedup_snapshot_duration_seconds_sum");
  f.busy_seconds = sum_samples(*text, "kdedup_worker_busy_seconds_total");
  return f;
}

struct Measurement {
  double records_per_s = 0;
  double cpu_seconds = -1;  ///< of the measured instance(s) over the timed part
  double sys_seconds = -1;  ///< the kernel's part of cpu_seconds
  double switches = -1;     ///< their threads' context switches over the timed part
  double seconds = 0;
  double produce_per_s = 0;  ///< the producer's own rate in the timed window
  std::int64_t output = 0;
  std::optional<SnapshotFigures> snapshots;  ///< over the timed part
};

/// Records produced and committed before the timed part: the group has
/// joined and every partition is assigned when the clock starts.
constexpr std::uint64_t kWarmUp = 2'000;

/// What the output of a measured run must be: every record (passthrough,
/// the raw copy), or the output oracle's verdict with the bench config's
/// window and fpp (0 for a mode judged exact: no false positive accepted).
kdedup::Status check_output(const Options& opt, const Mode& mode, tb::ClickRun& run,
                            Measurement& m) {
  auto out = run.output_records();
  if (!out) return tl::unexpected(out.error());
  m.output = *out;
  if (mode.all_distinct) {
    if (static_cast<std::uint64_t>(m.output) != opt.records + kWarmUp) {
      return kdedup::fail(
          fmt::format("{} emitted {} of {} records", mode.name, m.output, opt.records + kWarmUp));
    }
    return {};
  }
  auto back = run.read_back();
  if (!back) return tl::unexpected(back.error());
  tb::VerifySpec spec;
  spec.window_ms = 60'000;  // kConfig's window and fpp
  spec.fpp = mode.exact ? 0.0 : 0.01;
  const tb::VerifyReport report = tb::verify_output(back->input, back->output, spec);
  if (!report.ok()) return kdedup::fail(mode.name + ": wrong output: " + report.to_string());
  return {};
}

/// --backlog: the measured instances are stopped (SIGSTOP) while the timed
/// records are produced and resumed once they all are, so they take them in
/// full batches and their rate is their own, not a race with the producer on
/// the same cores. Resumes them on every path: a stopped process ignores
/// SIGTERM.
class Backlog {
 public:
  Backlog(const std::vector<pid_t>& pids, bool enabled) : since_(Clock::now()) {
    if (!enabled) return;
    for (const pid_t pid : pids) {
      if (::kill(pid, SIGSTOP) == 0) stopped_.push_back(pid);
    }
  }
  Backlog(const Backlog&) = delete;
  Backlog& operator=(const Backlog&) = delete;
  ~Backlog() { resume(); }

  [[nodiscard]] bool stopped() const { return !stopped_.empty(); }
  void resume() {
    if (stopped_.empty()) return;
    for (const pid_t pid : stopped_) ::kill(pid, SIGCONT);
    stopped_.clear();
    // The group's session timeout (6 s in this config) runs while they are
    // stopped: past it, the figures include a rejoin.
    const double paused = std::chrono::duration<double>(Clock::now() - since_).count();
    if (paused > 5.0) {
      std::fprintf(stderr,
                   "note: the instances were stopped %.1f s while the backlog was produced, "
                   "near the session timeout; the figures may include a rejoin (fewer "
                   "--records)\n",
                   paused);
    }
  }

 private:
  Clock::time_point since_;
  std::vector<pid_t> stopped_;
};

kdedup::Result<Measurement> measure(const Options& opt, const std::string& work,
                                    const std::string& config, const Mode& mode,
                                    bool snapshot_figures_wanted) {
  tb::RigOptions ro;
  ro.kdedup_binary = KDEDUP_BINARY;
  ro.instance_binary = mode.binary;
  ro.config_path = config;
  ro.work_dir = work + "/" + mode.slug;
  ro.partitions = mode.partitions > 0 ? mode.partitions : opt.partitions;
  ro.instances = opt.instances;
  ro.group = "kdedup-bench";
  ro.overrides = mode.overrides;
  ro.repartition_topic = mode.repartition_topic;
  // The rig gives each instance a metrics port it does not report; with one
  // instance, choose it here so /metrics can be read.
  int metrics_port = -1;
  if (snapshot_figures_wanted && opt.instances == 1) {
    auto port = tb::free_loopback_port();
    if (!port) return tl::unexpected(port.error());
    metrics_port = *port;
    ro.overrides.push_back(fmt::format("metrics.address=127.0.0.1:{}", metrics_port));
  }
  auto rig = tb::PipelineRig::start(ro);
  if (!rig) return tl::unexpected(rig.error());
  auto& r = **rig;
  tb::ClickRunOptions co;
  co.records = opt.records + kWarmUp;
  co.seed = 42;  // every mode sees the same stream
  co.span_ms = opt.event_span_ms;
  co.unkeyed = mode.random_partitions;
  co.producer_properties = {{"linger.ms", "20"}};
  auto started = tb::ClickRun::start(r, co);
  if (!started) return tl::unexpected(started.error());
  tb::ClickRun& run = **started;

  // Warm-up: the group has joined and every partition is assigned.
  if (auto ok = run.produce(kWarmUp); !ok) return tl::unexpected(ok.error());
  if (auto ok = run.wait_caught_up(std::chrono::seconds(90)); !ok) {
    return tl::unexpected(ok.error());
  }
  SnapshotFigures before;
  if (metrics_port > 0) {
    auto f = snapshot_figures(metrics_port);
    if (!f) return tl::unexpected(f.error());
    before = *f;
  }
  std::vector<pid_t> pids;
  for (int i = 0; i < opt.instances; ++i) pids.push_back(r.instance_pid(i));
  // A per-process figure summed over them; user and system CPU from one
  // read of each process's /proc/PID/stat.
  auto instances = [&](double (*figure)(pid_t)) {
    double sum = 0;
    for (const pid_t pid : pids) sum += figure(pid);
    return sum;
  };
  auto instances_cpu = [&] {
    CpuTimes sum{0, 0};
    for (const pid_t pid : pids) {
      const CpuTimes t = cpu_times(pid);
      sum.user += t.user;
      sum.sys += t.sys;
    }
    return sum;
  };
  Backlog backlog(pids, opt.backlog);
  CpuTimes cpu0 = instances_cpu();
  double switches0 = instances(context_switches);
  auto t0 = Clock::now();
  // Producing on this thread while the instance consumes (or, --backlog,
  // while it is stopped); the clock stops when the group committed everything.
  if (auto ok = run.produce(opt.records); !ok) return tl::unexpected(ok.error());
  const double produce_secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (backlog.stopped()) {
    cpu0 = instances_cpu();
    switches0 = instances(context_switches);
    t0 = Clock::now();
    backlog.resume();
  }
  if (auto ok = run.wait_caught_up(std::chrono::seconds(300)); !ok) {
    return tl::unexpected(ok.error());
  }
  // kdedup commits an offset only once its output was acknowledged, but the
  // raw copy commits what it consumed: for modes that copy every record the
  // timed part also waits until the output holds all of them.
  if (mode.all_distinct) {
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    for (;;) {
      auto held = run.output_records();
      if (!held) return tl::unexpected(held.error());
      if (static_cast<std::uint64_t>(*held) >= opt.records + kWarmUp || Clock::now() >= deadline) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  Measurement m;
  const CpuTimes cpu1 = instances_cpu();
  m.cpu_seconds = (cpu1.user + cpu1.sys) - (cpu0.user + cpu0.sys);
  m.sys_seconds = cpu1.sys - cpu0.sys;
  m.switches = instances(context_switches) - switches0;
  if (metrics_port > 0) {
    auto f = snapshot_figures(metrics_port);
    if (!f) return tl::unexpected(f.error());
    m.snapshots = f->minus(before);
  }
  m.seconds = secs;
  m.records_per_s = static_cast<double>(opt.records) / secs;
  m.produce_per_s = static_cast<double>(opt.records) / produce_secs;
  if (auto ok = run.check_input_kept(); !ok) return tl::unexpected(ok.error());
  if (auto ok = check_output(opt, mode, run, m); !ok) return tl::unexpected(ok.error());
  run.close();
  if (auto ok = r.stop_instances(); !ok) return tl::unexpected(ok.error());
  return m;
}

/// Resident and peak resident memory of a process, from /proc/PID/status.
struct ProcessMemory {
  double rss_mib = 0, hwm_mib = 0;
};

ProcessMemory process_memory(pid_t pid) {
  ProcessMemory m;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    const auto kib = [&] { return std::strtod(line.c_str() + 6, nullptr) / 1024.0; };
    if (line.rfind("VmRSS:", 0) == 0) m.rss_mib = kib();
    if (line.rfind("VmHWM:", 0) == 0) m.hwm_mib = kib();
  }
  return m;
}

struct MemoryFigures {
  ProcessMemory process;
  double filter_mib = 0;  ///< sum of kdedup_filter_bytes
  double used_mib = 0;    ///< kdedup_memory_used_bytes (0 where not exported)
  double assigned = 0;
};

kdedup::Result<MemoryFigures> memory_figures(pid_t pid, int port) {
  auto text = scrape(port);
  if (!text) return tl::unexpected(text.error());
  MemoryFigures f;
  f.process = process_memory(pid);
  f.filter_mib = sum_samples(*text, "kdedup_filter_bytes") / (1024.0 * 1024.0);
  f.used_mib = sum_samples(*text, "kdedup_memory_used_bytes") / (1024.0 * 1024.0);
  f.assigned = sum_samples(*text, "kdedup_consumer_assigned_partitions");
  return f;
}

/// What one instance with many partitions did besides its memory.
struct ScaleFigures {
  double ready_s = 0;        ///< start to every partition assigned
  double idle_cpu = 0;       ///< share of one core used while idle (after ready)
  double records_per_s = 0;  ///< produce start to everything committed
  double cpu_per_million = 0;
  double rebalance_s = 0;        ///< a second instance started to both holding a share
  double rebalance_ready_s = 0;  ///< to the new instance's partitions all recovered
  /// The same rebalance as the new instance's log tells it (RebalanceLog).
  double rebalance_protocol_s = 0;
  int rebalance_rounds = 0;
  double rebalance_recovery_s = 0;
  std::size_t longest_log_line = 0;
  // One /metrics scrape once loaded: the instance's CPU for it, its size.
  double scrape_cpu_ms = 0;
  double scrape_kib = 0;
  std::size_t scrape_series = 0;
};

/// Scrapes /metrics `rounds` times: the instance's CPU milliseconds per
/// scrape, the text's size and its sample lines (what a Prometheus server
/// pays to read one instance, beside what the instance pays).
kdedup::Status measure_scrape(pid_t pid, int port, ScaleFigures& out) {
  constexpr int rounds = 5;
  const double before = cpu_seconds(pid);
  std::string text;
  for (int i = 0; i < rounds; ++i) {
    auto t = scrape(port);
    if (!t) return tl::unexpected(t.error());
    text = std::move(*t);
  }
  out.scrape_cpu_ms = (cpu_seconds(pid) - before) * 1e3 / rounds;
  out.scrape_kib = static_cast<double>(text.size()) / 1024.0;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line[0] != '#') ++out.scrape_series;
  }
  return {};
}

struct ScaleRun {
  MemoryFigures idle, loaded;
  std::optional<MemoryFigures> parked;  ///< --park-after: once every partition parked
  ScaleFigures scale;
};

/// Waits until every one of `partitions` partitions parked (none parks:
/// 10 s), then reads the memory again (the heap trim follows the last park
/// within a second).
kdedup::Result<MemoryFigures> parked_figures(tb::PipelineRig& r, pid_t pid, int port,
                                             int partitions, bool parks) {
  const auto deadline = Clock::now() + std::chrono::seconds(300);
  while (parks) {
    if (auto ok = r.check_instances(); !ok) return tl::unexpected(ok.error());
    auto text = scrape(port);
    if (text && sum_samples(*text, "kdedup_filter_parked") == partitions) break;
    if (Clock::now() > deadline) return kdedup::fail("the partitions did not park in time");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  std::this_thread::sleep_for(std::chrono::seconds(parks ? 2 : 10));
  return memory_figures(pid, port);
}

/// Length of the longest line of a text file.
std::size_t longest_line(const std::string& path) {
  std::ifstream in(path);
  std::size_t longest = 0;
  for (std::string line; std::getline(in, line);) longest = std::max(longest, line.size());
  return longest;
}

/// A rebalance as the log of the instance that joined tells it: the group
/// protocol (its join to the arrival of its first partitions, after
/// `rounds` assignments, counting the empty ones of a cooperative
/// rebalance) and its recovery (their arrival to the last of their
/// "recovery done" lines; `recovered` of `assigned` partitions have one).
/// The "assigned" line follows the recovery plan, which says how long it
/// took ("recovery of K partition(s) planned in N ms"): the partitions
/// arrived N ms before it.
struct RebalanceLog {
  double protocol_s = 0;
  int rounds = 0;
  double recovery_s = 0;
  int assigned = 0;
  int recovered = 0;
};

/// Seconds since midnight of a log line's timestamp
/// ("2026-12-01T21:22:35.086 info  ..."), or nullopt for other lines.
std::optional<double> log_line_seconds(const std::string& line) {
  int h = 0, m = 0;
  double s = 0;
  if (line.size() < 23 || line[10] != 'T' ||
      std::sscanf(line.c_str() + 11, "%2d:%2d:%lf", &h, &m, &s) != 3) {
    return std::nullopt;
  }
  return h * 3600.0 + m * 60.0 + s;
}

RebalanceLog read_rebalance_log(const std::string& path) {
  // Durations between two lines of one log (a run that crosses midnight
  // wraps once).
  auto between = [](double from, double to) { return to >= from ? to - from : to + 86400 - from; };
  RebalanceLog out;
  std::optional<double> joined, arrived, last_done;
  double planning_s = 0;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const std::optional<double> t = log_line_seconds(line);
    if (!t) continue;
    if (!joined && line.find("joined consumer group") != std::string::npos) {
      joined = t;
    } else if (const auto plan = line.find(" planned in "); !arrived && plan != std::string::npos) {
      planning_s = std::atof(line.c_str() + plan + 12) / 1e3;
    } else if (const auto at = line.find(" assigned ");
               !arrived && at != std::string::npos &&
               line.find(" partition(s)", at) != std::string::npos) {
      ++out.rounds;
      out.assigned = std::atoi(line.c_str() + at + 10);
      if (out.assigned > 0) arrived = *t - planning_s;
      planning_s = 0;
    } else if (line.find("recovery done (") != std::string::npos) {
      ++out.recovered;
      last_done = t;
    }
  }
  if (joined && arrived) out.protocol_s = between(*joined, *arrived);
  if (arrived && last_done) out.recovery_s = between(*arrived, *last_done);
  return out;
}

struct RebalanceFigures {
  double seconds = 0;        ///< started to both holding a share of all partitions
  double ready_seconds = 0;  ///< started to the new instance's last "recovery done"
  RebalanceLog log;          ///< the new instance's account of it
};

/// Starts a second instance (logging at info) and waits until both hold a
/// share of the partitions and together all of them: the rebalance's
/// duration. Then until every partition it was given has recovered, to
/// split that duration by the new instance's log.
kdedup::Result<RebalanceFigures> rebalance_seconds(tb::PipelineRig& r, const Options& opt,
                                                   int first_port, const std::string& state_dir) {
  auto port = tb::free_loopback_port();
  if (!port) return tl::unexpected(port.error());
  const auto t0 = Clock::now();
  auto added = r.add_instance({fmt::format("metrics.address=127.0.0.1:{}", *port), "log_level=info",
                               "state.dir=" + state_dir});
  if (!added) return tl::unexpected(added.error());
  const auto deadline = t0 + std::chrono::seconds(300);
  RebalanceFigures out;
  for (;;) {
    if (auto ok = r.check_instances(); !ok) return tl::unexpected(ok.error());
    if (out.seconds == 0) {
      auto a = memory_figures(r.instance_pid(0), first_port);
      auto b = memory_figures(r.instance_pid(*added), *port);
      if (a && b && a->assigned > 0 && b->assigned > 0 &&
          a->assigned + b->assigned == opt.idle_partitions) {
        out.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      }
    }
    if (out.seconds > 0) {
      out.log = read_rebalance_log(r.instance_log(*added));
      if (out.log.assigned > 0 && out.log.recovered >= out.log.assigned) {
        out.ready_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        return out;
      }
    }
    if (Clock::now() > deadline) {
      return kdedup::fail(out.seconds == 0 ? "the rebalance did not settle in time"
                                           : "the new instance did not recover its partitions "
                                             "in time; log " +
                                                 r.instance_log(*added));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

/// One `kdedup run` (binary `binary`) assigned opt.idle_partitions
/// partitions: memory once idle, then after opt.records distinct keys; how
/// long it took to be assigned everything, the load's rate and CPU, and a
/// rebalance that moves half of the partitions to a second instance.
kdedup::Result<ScaleRun> measure_memory(const Options& opt, const std::string& work,
                                        const std::string& config, const std::string& binary) {
  tb::RigOptions ro;
  ro.kdedup_binary = binary;
  ro.config_path = config;
  ro.work_dir = work;
  ro.partitions = opt.idle_partitions;
  ro.instances = 1;
  ro.group = "kdedup-bench-memory";
  auto port = tb::free_loopback_port();
  if (!port) return tl::unexpected(port.error());
  // No snapshots: a pre-sized baseline would write its whole state at stop.
  // Parking needs them (each instance its own state dir).
  const bool park = !opt.park_after.empty() && binary == KDEDUP_BINARY;
  ro.overrides = {"filter.enabled=true", "filter.capacity=1000000",
                  "state.dir=" + (park ? work + "/state-0" : std::string()),
                  fmt::format("metrics.address=127.0.0.1:{}", *port)};
  if (park) {
    ro.overrides.push_back("state.snapshot_interval=1s");
    ro.overrides.push_back("state.park_after=" + opt.park_after);
  }
  if (opt.threads > 0) ro.overrides.push_back(fmt::format("threads={}", opt.threads));
  ScaleRun run;
  const auto started = Clock::now();
  auto rig = tb::PipelineRig::start(ro);
  if (!rig) return tl::unexpected(rig.error());
  auto& r = **rig;
  const pid_t pid = r.instance_pid(0);
  // Every partition assigned (and its filter built) before the first figure.
  const auto deadline = Clock::now() + std::chrono::seconds(180);
  for (;;) {
    if (auto ok = r.check_instances(); !ok) return tl::unexpected(ok.error());
    auto f = memory_figures(pid, *port);
    if (f && f->assigned == opt.idle_partitions) break;
    if (Clock::now() > deadline) {
      return kdedup::fail("the instance was not assigned every partition in time; logs in " + work);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  run.scale.ready_s = std::chrono::duration<double>(Clock::now() - started).count();
  const double idle_cpu0 = cpu_seconds(pid);
  const auto idle_started = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(3));  // a few stats rounds
  run.scale.idle_cpu = (cpu_seconds(pid) - idle_cpu0) /
                       std::chrono::duration<double>(Clock::now() - idle_started).count();
  auto idle = memory_figures(pid, *port);
  if (!idle) return tl::unexpected(idle.error());
  run.idle = *idle;
  Backlog backlog({pid}, opt.backlog);
  double cpu0 = cpu_seconds(pid);
  auto load_started = Clock::now();
  auto producer = tb::RecordProducer::create(r.bootstrap(), {{"linger.ms", "20"}});
  if (!producer) return tl::unexpected(producer.error());
  const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  for (std::uint64_t i = 0; i < opt.records; ++i) {
    const std::string key = "id-" + std::to_string(i);
    auto ok = (*producer)->produce(ro.input_topic, -1, key, "v", now_ms);
    if (!ok) return tl::unexpected(ok.error());
  }
  if (auto ok = (*producer)->flush(std::chrono::seconds(120)); !ok) {
    return tl::unexpected(ok.error());
  }
  if (backlog.stopped()) {
    cpu0 = cpu_seconds(pid);
    load_started = Clock::now();
    backlog.resume();
  }
  const auto caught_up_by = Clock::now() + std::chrono::seconds(300);
  for (;;) {
    if (auto ok = r.check_instances(); !ok) return tl::unexpected(ok.error());
    auto p = r.progress();
    if (p && p->caught_up) break;
    if (Clock::now() > caught_up_by) {
      return kdedup::fail("the group did not commit every input offset in time; logs in " + work);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double load_s = std::chrono::duration<double>(Clock::now() - load_started).count();
  run.scale.records_per_s = static_cast<double>(opt.records) / load_s;
  run.scale.cpu_per_million = (cpu_seconds(pid) - cpu0) * 1e6 / static_cast<double>(opt.records);
  std::this_thread::sleep_for(std::chrono::seconds(3));
  auto loaded = memory_figures(pid, *port);
  if (!loaded) return tl::unexpected(loaded.error());
  run.loaded = *loaded;
  if (auto ok = measure_scrape(pid, *port, run.scale); !ok) return tl::unexpected(ok.error());
  producer->reset();
  if (park) {
    const bool parks = opt.park_after.find_first_not_of('0') == 0;  // "0", "0s": off
    auto parked = parked_figures(r, pid, *port, opt.idle_partitions, parks);
    if (!parked) return tl::unexpected(parked.error());
    run.parked = *parked;
  }
  auto moved = rebalance_seconds(r, opt, *port, park ? work + "/state-1" : std::string());
  if (!moved) return tl::unexpected(moved.error());
  run.scale.rebalance_s = moved->seconds;
  run.scale.rebalance_ready_s = moved->ready_seconds;
  run.scale.rebalance_protocol_s = moved->log.protocol_s;
  run.scale.rebalance_rounds = moved->log.rounds;
  run.scale.rebalance_recovery_s = moved->log.recovery_s;
  if (auto ok = r.stop_instances(); !ok) {
    std::fprintf(stderr, "note: %s\n", ok.error().message.c_str());
  }
  run.scale.longest_log_line =
      std::max(longest_line(r.instance_log(0)), longest_line(r.instance_log(1)));
  return run;
}

int memory_main(const Options& opt, const std::string& work, const std::string& config) {
  std::printf(
      "memory of one `kdedup run` on the test broker: %d assigned partitions, filter.capacity "
      "1000000, then %llu distinct keys within the window%s\n\n",
      opt.idle_partitions, static_cast<unsigned long long>(opt.records),
      opt.backlog ? ", produced while it was stopped and consumed as a backlog" : "");
  std::printf(
      "| binary | state | VmRSS MiB | VmHWM MiB | sum kdedup_filter_bytes MiB | "
      "kdedup_memory_used_bytes MiB |\n|---|---|---|---|---|---|\n");
  std::vector<std::pair<std::string, std::string>> binaries;
  for (const auto& path : opt.baseline_binaries) {
    binaries.emplace_back(baseline_label(opt, path), path);
  }
  binaries.emplace_back("this build", KDEDUP_BINARY);
  std::vector<ScaleFigures> runs;
  for (std::size_t b = 0; b < binaries.size(); ++b) {
    auto m = measure_memory(opt, work + "/memory-" + std::to_string(b), config, binaries[b].second);
    if (!m) {
      std::fprintf(stderr, "%s: %s\n", binaries[b].first.c_str(), m.error().message.c_str());
      return 1;
    }
    std::vector<std::pair<std::string, MemoryFigures>> rows{{"idle", m->idle},
                                                            {"loaded", m->loaded}};
    if (m->parked) rows.emplace_back("quiet, park_after " + opt.park_after, *m->parked);
    for (const auto& [state, f] : rows) {
      std::printf("| %s | %s | %.1f | %.1f | %.1f | %.1f |\n", binaries[b].first.c_str(),
                  state.c_str(), f.process.rss_mib, f.process.hwm_mib, f.filter_mib, f.used_mib);
    }
    std::fflush(stdout);
    runs.push_back(m->scale);
  }
  // One table per aspect, a row per binary.
  auto table = [&](const char* head, auto row) {
    std::printf("%s", head);
    for (std::size_t b = 0; b < binaries.size(); ++b) row(binaries[b].first.c_str(), runs[b]);
  };
  table(
      "\n| binary | start to all assigned s | idle CPU % of a core | records/s | CPU s per "
      "million | rebalance of half s | longest log line | one /metrics scrape: CPU ms, KiB, "
      "samples |\n|---|---|---|---|---|---|---|---|\n",
      [&opt](const char* name, const ScaleFigures& f) {
        // With --records 0 there is no load to divide by.
        const std::string load =
            opt.records == 0 ? std::string("- | -")
                             : fmt::format("{:.0f} | {:.2f}", f.records_per_s, f.cpu_per_million);
        std::printf("| %s | %.1f | %.1f | %s | %.1f | %zu | %.0f, %.0f, %zu |\n", name, f.ready_s,
                    f.idle_cpu * 100, load.c_str(), f.rebalance_s, f.longest_log_line,
                    f.scrape_cpu_ms, f.scrape_kib, f.scrape_series);
      });
  table(
      "\nthe rebalance of half as the new instance's log tells it: the group protocol (its "
      "join to the arrival of its partitions) and their recovery (to the last \"recovery "
      "done\")\n\n| binary | rebalance of half s | to ready s | group protocol s | assignment "
      "rounds | recovery s |\n|---|---|---|---|---|---|\n",
      [](const char* name, const ScaleFigures& f) {
        std::printf("| %s | %.1f | %.1f | %.1f | %d | %.1f |\n", name, f.rebalance_s,
                    f.rebalance_ready_s, f.rebalance_protocol_s, f.rebalance_rounds,
                    f.rebalance_recovery_s);
      });
  return 0;
}

}  // namespace

void print_snapshot_figures(const SnapshotFigures& f, const Mode& mode) {
  std::printf(
      "          during the timed part: %.0f snapshots (%.0f failed), %.1f MiB written, "
      "%.3f s writing; workers busy %.2f s\n",
      f.snapshots, f.failures, f.bytes / (1024.0 * 1024.0), f.write_seconds, f.busy_seconds);
  if (mode.slug == "snapshots" && f.snapshots == 0) {
    std::printf(
        "          no snapshot was written during the timed part: it is shorter than "
        "the interval, use more --records\n");
  }
}

/// The middle of `v` (the upper one of an even count), as the tables report.
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// "median (least-most)" of per-round ratios.
std::string median_and_range(const std::vector<double>& v) {
  const auto [least, most] = std::minmax_element(v.begin(), v.end());
  return fmt::format("{:.3f} ({:.2f}-{:.2f})", median(v), *least, *most);
}

/// --compare scale: how much each mode's CPU per record grew from the
/// smaller partition count to the larger, paired within each round (modes
/// 0 and 1 at the smaller count, 2 and 3 the same at the larger).
void print_growth(const Options& opt, const std::vector<std::vector<Measurement>>& runs) {
  std::vector<double> raw, timer, excess;
  for (std::size_t i = 0; i < runs[0].size(); ++i) {
    raw.push_back(runs[2][i].cpu_seconds / runs[0][i].cpu_seconds);
    timer.push_back(runs[3][i].cpu_seconds / runs[1][i].cpu_seconds);
    excess.push_back(timer.back() / raw.back());
  }
  std::printf("  CPU per record at %d partitions over %d, per round: median (range)\n",
              opt.scale_partitions, opt.partitions);
  std::printf("  %-28s %s\n", "raw librdkafka copy", median_and_range(raw).c_str());
  std::printf("  %-28s %s  (target <= 1.2)\n", "dedup (timer)", median_and_range(timer).c_str());
  std::printf("  %-28s %s\n", "timer's growth / raw copy's", median_and_range(excess).c_str());
}

int main(int argc, char** argv) {
  Options opt;
  const char* usage =
      "usage: pipeline_bench [--compare filter|snapshots|cost|format|scale|confirm|repartition | "
      "--repartition] "
      "[--records N] [--partitions P] [--scale-partitions P] "
      "[--instances I] [--repeat R] [--backlog] [--event-span MS]\n"
      "       pipeline_bench --idle-partitions P [--threads T] [--records N] [--backlog] "
      "[--baseline-binary PATH] [--park-after D]\n";
  for (int i = 1; i < argc; i += 2) {
    if (!std::strcmp(argv[i], "--repartition")) {
      opt.compare = "repartition";
      --i;  // a flag: no value follows
      continue;
    }
    if (!std::strcmp(argv[i], "--backlog")) {
      opt.backlog = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: missing value\n%s", argv[i], usage);
      return 2;
    }
    if (!std::strcmp(argv[i], "--compare")) {
      opt.compare = argv[i + 1];
      if (opt.compare != "filter" && opt.compare != "snapshots" && opt.compare != "cost" &&
          opt.compare != "format" && opt.compare != "scale" && opt.compare != "confirm" &&
          opt.compare != "repartition") {
        std::fprintf(stderr,
                     "--compare: '%s' is not 'filter', 'snapshots', 'cost', 'format', 'scale', "
                     "'confirm' or 'repartition'\n%s",
                     argv[i + 1], usage);
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--records")) {
      opt.records = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (!std::strcmp(argv[i], "--partitions")) {
      opt.partitions = std::atoi(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--scale-partitions")) {
      opt.scale_partitions = std::atoi(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--instances")) {
      opt.instances = std::atoi(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--repeat")) {
      opt.repeat = std::max(1, std::atoi(argv[i + 1]));
    } else if (!std::strcmp(argv[i], "--idle-partitions")) {
      opt.idle_partitions = std::max(1, std::atoi(argv[i + 1]));
    } else if (!std::strcmp(argv[i], "--park-after")) {
      opt.park_after = argv[i + 1];
    } else if (!std::strcmp(argv[i], "--threads")) {
      opt.threads = std::max(1, std::atoi(argv[i + 1]));
    } else if (!std::strcmp(argv[i], "--baseline-binary")) {
      opt.baseline_binaries.emplace_back(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--event-span")) {
      char* end = nullptr;
      const long long ms = std::strtoll(argv[i + 1], &end, 10);
      if (end == argv[i + 1] || *end != '\0' || ms < 1) {
        std::fprintf(stderr, "--event-span: expected milliseconds (at least 1), got '%s'\n%s",
                     argv[i + 1], usage);
        return 2;
      }
      opt.event_span_ms = ms;
    } else {
      std::fprintf(stderr, "unknown option %s\n%s", argv[i], usage);
      return 2;
    }
  }
  if (opt.compare == "scale" &&
      (opt.partitions < 1 || opt.scale_partitions < 1 || opt.scale_partitions == opt.partitions)) {
    std::fprintf(stderr,
                 "--compare scale: --partitions (%d) and --scale-partitions (%d) must be two "
                 "different counts of at least 1\n%s",
                 opt.partitions, opt.scale_partitions, usage);
    return 2;
  }
  Comparison cmp = comparison(opt);
  for (const auto& path : opt.baseline_binaries) {
    std::printf("%s: %s\n", baseline_label(opt, path).c_str(), path.c_str());
  }
  if (opt.compare == "cost") {
    // Before and after a change, side by side in the same run.
    for (const auto& path : opt.baseline_binaries) {
      const std::string label = baseline_label(opt, path);
      cmp.modes.push_back({"passthrough (" + label + ")",
                           "passthrough-" + slug_of(label),
                           {"filter.enabled=false"},
                           true,
                           path});
      cmp.modes.push_back({"dedup timer (" + label + ")",
                           "dedup-timer-" + slug_of(label),
                           {"filter.enabled=true", "filter.type=timer"},
                           false,
                           path});
    }
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/kdedup-bench-XXXXXX";
  if (!mkdtemp(tmpl.data())) return 1;
  const std::string work = tmpl;
  const std::string config = work + "/bench.yaml";
  std::ofstream(config) << kConfig;
  if (opt.idle_partitions > 0) {
    const int status = memory_main(opt, work, config);
    std::error_code ec;
    std::filesystem::remove_all(work, ec);
    return status;
  }

  std::printf(
      "pipeline throughput on the test broker (%s): %llu records, %s partitions, %d "
      "instance(s), %s\n",
      opt.compare.c_str(), static_cast<unsigned long long>(opt.records),
      (opt.compare == "scale" ? fmt::format("{} and {}", opt.partitions, opt.scale_partitions)
                              : std::to_string(opt.partitions))
          .c_str(),
      opt.instances,
      opt.backlog ? "produced while the instances were stopped and consumed as a backlog"
                  : "producer and pipeline concurrent");
  const std::size_t n = cmp.modes.size();
  std::vector<std::vector<Measurement>> runs(n);
  for (int round = 0; round < opt.repeat; ++round) {
    for (std::size_t k = 0; k < n; ++k) {
      const Mode& mode = cmp.modes[k];
      auto m = measure(opt, work + "/" + std::to_string(round), config, mode, cmp.snapshot_figures);
      if (!m) {
        std::fprintf(stderr, "%s: %s\n", mode.name.c_str(), m.error().message.c_str());
        return 1;
      }
      std::printf(
          "  round %d %-22s %10.0f records/s  %6.2f CPU s per million (%4.2f sys)  %6.1f "
          "switches per 1,000  (%.2f s, %lld out; producer %.0f/s)\n",
          round + 1, mode.name.c_str(), m->records_per_s,
          m->cpu_seconds * 1e6 / static_cast<double>(opt.records),
          m->sys_seconds * 1e6 / static_cast<double>(opt.records),
          m->switches * 1e3 / static_cast<double>(opt.records), m->seconds,
          static_cast<long long>(m->output), m->produce_per_s);
      if (m->snapshots) print_snapshot_figures(*m->snapshots, mode);
      std::fflush(stdout);
      runs[k].push_back(*m);
    }
  }
  std::vector<double> rate(n), cpu(n), sys(n), switches(n);
  // The CPU ratio of each round against the first mode of the same round,
  // measured a few seconds apart: the machine's drift between rounds cancels
  // out of it, which the ratio of the medians keeps.
  std::vector<std::vector<double>> paired(n);
  for (std::size_t k = 0; k < n; ++k) {
    std::vector<double> r, c, y, w;
    for (std::size_t i = 0; i < runs[k].size(); ++i) {
      const Measurement& m = runs[k][i];
      r.push_back(m.records_per_s);
      c.push_back(m.cpu_seconds * 1e6 / static_cast<double>(opt.records));
      y.push_back(m.sys_seconds * 1e6 / static_cast<double>(opt.records));
      w.push_back(m.switches * 1e3 / static_cast<double>(opt.records));
      paired[k].push_back(m.cpu_seconds / runs[0][i].cpu_seconds);
    }
    rate[k] = median(r);
    cpu[k] = median(c);
    sys[k] = median(y);
    switches[k] = median(w);
  }
  std::printf(
      "  medians of %d rounds; ratios against %s (CPU per round: that round's ratio, "
      "median and range)\n",
      opt.repeat, cmp.modes[0].name.c_str());
  std::printf("  %-28s %12s %10s %14s %10s %8s %16s %22s\n", "mode", "records/s", "ratio",
              "CPU s/million", "ratio", "of it sys", "switches/1,000", "CPU ratio per round");
  for (std::size_t k = 0; k < n; ++k) {
    std::printf("  %-28s %12.0f %10.3f %14.2f %10.3f %9.2f %16.1f %22s\n",
                cmp.modes[k].name.c_str(), rate[k], rate[k] / rate[0], cpu[k], cpu[k] / cpu[0],
                sys[k], switches[k], median_and_range(paired[k]).c_str());
  }
  if (opt.compare == "scale") print_growth(opt, runs);
  if (cmp.target > 0) {
    std::printf("  %-26s %10.3f  (target >= %.1f)\n",
                (cmp.modes[n - 1].slug + " / " + cmp.modes[0].slug).c_str(), rate[n - 1] / rate[0],
                cmp.target);
  }
  std::error_code ec;
  std::filesystem::remove_all(work, ec);
  return 0;
}
