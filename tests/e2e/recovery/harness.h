#pragma once
// What every recovery failure test needs: a test broker with per-test topics,
// `kdedup run` instances (real binary, own state dir, metrics on an
// ephemeral loopback port, log in a file) that can be SIGKILLed, restarted
// and stopped, a feeder producing a keyed stream with duplicates while the
// test injects faults, a wait for the group to have committed everything,
// and the output verifier run over the whole input and output.
//
// Owned by one test thread (the Feeder has its own producer thread).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "broker.h"
#include "kdedup/testbroker/child_process.h"
#include "verifier.h"

namespace kdedup::testing {

/// Settings of one instance's YAML config. Unset optionals are not written
/// (the binary's defaults apply).
struct RunSettings {
  std::string group = "recovery";
  std::string input = "in";
  std::string output = "out";
  std::string partitioning = "input";  ///< output.partitioning: input | key
  std::string window = "1h";           ///< long: nothing expires during a test
  std::string state_dir;               ///< "" = no snapshots
  std::string snapshot_interval = "1s";
  std::optional<std::uint64_t> snapshot_records;
  std::optional<std::uint64_t> reconcile_tail_records;
  std::optional<std::string> min_free_bytes;
  std::string filter = "exact";
  std::optional<double> fpp;
  std::optional<std::uint64_t> capacity;
  std::optional<std::string> min_bytes;  ///< filter.min_bytes (a small floor makes a busy filter)
  /// filter.confirm_store: confirmed mode. The verifier then judges with the
  /// exact oracle (no false positive allowed), whatever the filter.
  bool confirm = false;
  std::string commit_interval = "200ms";
  int threads = 2;                ///< worker threads
  std::uint32_t batch_size = 64;  ///< records per worker batch, at most
  int session_timeout_ms = 4000;
  std::map<std::string, std::string> consumer_extra;  ///< more consumer properties
  std::string log_level = "info";
  bool refresh = false;    ///< on_duplicate: refresh (the verifier follows it)
  std::string extra_yaml;  ///< appended verbatim
};

std::string run_config_yaml(const std::string& bootstrap, const RunSettings& s);

/// One `kdedup run` child.
class Instance {
 public:
  /// Starts `kdedup run --config <dir>/<name>.yaml` (the config is written
  /// there); the log goes to <dir>/<name>.log (appended across restarts).
  Instance(std::string name, const TempDir& dir, std::string bootstrap, RunSettings settings,
           std::vector<std::string> extra_env = {});
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;

  const std::string& name() const { return name_; }
  RunSettings& settings() { return settings_; }

  /// (Re)starts the process; fails when it is already running.
  [[nodiscard]] Status start();
  /// SIGKILL and reap.
  void kill9();
  /// SIGTERM and wait; the exit status (-1 = still running after `grace`,
  /// then SIGKILLed).
  int stop(std::chrono::milliseconds grace = std::chrono::seconds(30));
  /// Waits for the process to exit by itself; nullopt on timeout.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);
  bool running();
  pid_t pid() const { return process_ ? process_->pid() : -1; }

  /// The whole log (all runs), or only the current run's part.
  std::string log() const;
  std::string run_log() const;
  /// Last `lines` lines of the log, for failure messages.
  std::string log_tail(std::size_t lines = 40) const;

  /// Metrics port of the current run (parsed from its log), waiting for it.
  std::optional<int> metrics_port(std::chrono::milliseconds timeout = std::chrono::seconds(20));
  /// Sum over all series of metric `name` in the current run's /metrics;
  /// nullopt if unreachable.
  std::optional<double> metric(const std::string& name);
  /// GET /readyz status code (0 = unreachable).
  int readyz();
  /// Waits until /readyz answers 200.
  bool wait_ready(std::chrono::milliseconds timeout);

 private:
  std::string name_;
  std::string config_path_;
  std::string log_path_;
  std::string bootstrap_;
  RunSettings settings_;
  std::vector<std::string> env_;
  std::unique_ptr<testbroker::ChildProcess> process_;
  std::size_t run_log_start_ = 0;
  std::optional<int> port_;
};

/// Whether a run that ended with `exited` (Instance::wait_exit(0ms) or
/// stop()) and wrote `run_log` met librdkafka 2.0.2's cooperative-sticky
/// assignor fault: a SIGSEGV without kdedup's crash report. The group
/// leader's assignor, on librdkafka's main thread, sometimes faults when
/// members are killed and restarted within seconds, or leave while one is
/// stopping (lib/src/pipeline/README.md); librdkafka's threads block every
/// signal, so the kernel ends the process at once, without the report that
/// a fault in kdedup's own threads writes ("kdedup: fatal signal"). A test
/// that kills members judges such a run as it would a kill. Prints
/// "<name> had crashed by itself (SIGSEGV in librdkafka) <when>" when it is.
bool crashed_by_itself(const std::string& name, std::optional<int> exited,
                       const std::string& run_log, const std::string& when);

/// Stops `i` at the end of a test that killed members: its exit status, or
/// nullopt when it met the assignor's fault (crashed_by_itself) after the
/// last kill, while the group settled, or while it stopped and the other
/// member left; such a test judges that run as killed.
std::optional<int> stop_after_kills(Instance& i);

/// Produces a keyed stream with duplicates to `topic` from its own thread:
/// identity n = a draw of a uniform EventStream over `domain` identities
/// (seeded), shifted by the drift, key "id-n", value {"id":n,"seq":i}, partition n % partitions
/// (duplicates share a partition), timestamp = now. `per_second` records a
/// second in small flushed batches, until stop() or `limit` records.
class Feeder {
 public:
  struct Options {
    std::string topic = "in";
    int partitions = 4;
    std::uint64_t domain = 2000;
    int per_second = 400;
    std::uint64_t seed = 1;
    std::uint64_t limit = 0;        ///< 0 = until stop()
    std::size_t value_padding = 0;  ///< extra bytes in each value
    /// Identity of record i = floor(i * drift) + draw: with drift > 0 the
    /// domain slides, so new distinct identities keep arriving all along
    /// (every fault meets records whose fate the oracle can check) while an
    /// identity still repeats about 1 / drift times.
    double drift = 0.0;
    /// Partition of each record drawn at random (seeded) instead of
    /// identity % partitions: producers that do not key by the identity,
    /// so copies of one identity land in different partitions.
    bool random_partitioning = false;
  };
  Feeder(const std::string& bootstrap, Options options);
  ~Feeder();
  /// Stops producing, flushes, joins; true when every record was acknowledged.
  bool stop();
  /// Waits until `limit` records were produced (or the timeout).
  bool wait_done(std::chrono::milliseconds timeout);
  std::uint64_t produced() const { return produced_; }
  const std::string& error() const { return error_; }

 private:
  void run(std::string bootstrap);
  Options options_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> done_{false};
  std::atomic<std::uint64_t> produced_{0};
  bool ok_ = false;
  std::string error_;
  std::thread thread_;
};

/// Waits until `group`'s committed offsets on `topic` equal the high
/// watermarks; prints the lag left on timeout.
bool wait_committed_to_end(TestBroker& broker, const std::string& group, const std::string& topic,
                           std::chrono::milliseconds timeout);

/// Reads `input` and `output` completely and runs the verifier (identity:
/// the key; `fpp` 0 for the exact filter, else the filter's target: false
/// positives are counted and bounded, see VerifySpec). Prints the report.
/// Fails when a topic cannot be read or the input was truncated by the
/// broker (low watermark > 0).
Result<VerifyReport> verify_topics(TestBroker& broker, const std::string& input,
                                   const std::string& output, std::int64_t window_ms,
                                   double fpp = 0.0, bool refresh = false);
/// Reads `input` and `output` completely and judges the output against the
/// whole input, every partition together (verify_by_identity; exact filter).
/// `provenance`: the output's provenance headers, kOriginProvenance behind
/// the repartition stage, kSourceProvenance without it.
Result<VerifyReport> verify_topics_by_identity(TestBroker& broker, const std::string& input,
                                               const std::string& output, std::int64_t window_ms,
                                               const pipeline::ProvenanceNames& provenance);

/// The same with the window and filter of `settings` (the exact filter or
/// confirmed mode: fpp 0; others: settings.fpp, default 0.01).
Result<VerifyReport> verify_topics(TestBroker& broker, const RunSettings& settings);

/// Starts `instance`, feeds `feed.limit` records, waits until its group
/// committed the whole input and stops it with SIGTERM (exit 0 expected):
/// a graceful stop writes every partition's snapshot at the committed
/// offset. Fails with the instance's log tail.
[[nodiscard]] Status run_batch(TestBroker& broker, Instance& instance, Feeder::Options feed,
                               std::chrono::milliseconds timeout = std::chrono::seconds(60));

/// One partition's snapshot as `kdedup snapshot inspect --json` shows it.
struct InspectedSnapshot {
  std::string topic;
  std::int32_t partition = 0;
  std::string status;  ///< ok | verified | corrupt | ...
  std::int64_t next_offset = -1;
  std::uint64_t logical_bytes = 0;
};

/// Runs `kdedup snapshot inspect --state-dir DIR --json [--verify]`; the
/// rows and the exit code.
struct Inspection {
  int exit_code = -1;
  std::vector<InspectedSnapshot> snapshots;
  std::string text;  ///< stdout + stderr
};
Inspection inspect_snapshots(const std::string& state_dir, bool verify);

/// What the "recovery done (REASON) in S s, N records replayed" parts of a
/// log's lines say (alone after "P: ", or after the plan of a partition
/// with nothing to replay): partitions per reason word (restored, rebuild_from_window,
/// no_history, fresh_partition) and records replayed. Printed by the
/// tests; most assert on metrics instead.
struct RecoveryLines {
  std::map<std::string, int> by_reason;
  std::uint64_t replayed = 0;
  [[nodiscard]] std::string to_string() const;
};
RecoveryLines recovery_lines(const std::string& log);

/// The first line of `log` containing `what` (for printing what a test saw).
std::string first_line_with(const std::string& log, const std::string& what);
/// The first line of `log` containing every one of `words`; nullopt if none.
std::optional<std::string> line_with_all(const std::string& log,
                                         const std::vector<std::string>& words);

/// Seconds since `start`, for per-test timing lines.
double seconds_since(std::chrono::steady_clock::time_point start);

}  // namespace kdedup::testing
