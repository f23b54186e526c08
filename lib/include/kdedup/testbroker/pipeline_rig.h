#pragma once
// PipelineRig: a complete local deployment for the demo and the pipeline
// benchmark: one `kdedup testbroker` process with input, output and
// dead-letter topics, and N `kdedup run` processes consuming the input as one
// consumer group. It reports how far the group has committed, notices an
// instance that died (with the tail of its log), and stops everything it
// started: SIGTERM to every instance, then the broker.
//
// Owned by one thread; not thread-safe.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kdedup/common/result.h"
#include "kdedup/testbroker/broker_process.h"
#include "kdedup/testbroker/child_process.h"

namespace kdedup::testbroker {

struct RigOptions {
  std::string kdedup_binary;
  /// Started for each instance with kdedup's `run` command line; empty =
  /// kdedup_binary (a benchmark's yardstick takes kdedup's place here).
  std::string instance_binary;
  std::string config_path;             ///< YAML given to `kdedup run --config`
  std::vector<std::string> overrides;  ///< extra `--set key=value` for every instance
  std::string work_dir;                ///< logs and per-instance state dirs go here
  int brokers = 3;
  int partitions = 4;
  int instances = 2;
  std::string input_topic = "clicks";
  std::string output_topic = "clicks-distinct";
  std::string dlq_topic = "clicks-dlq";
  std::string group = "kdedup-demo";
  /// Non-empty: the instances run the repartition stage into this internal
  /// topic (`partitions` partitions, created by kdedup) and progress() follows
  /// both stages.
  std::string repartition_topic;
};

struct GroupProgress {
  std::int64_t committed = 0;  ///< sum of committed offsets over input partitions
  std::int64_t end = 0;        ///< sum of high watermarks
  bool caught_up = false;      ///< every partition committed up to its end
};

class PipelineRig {
 public:
  /// Starts the broker and the instances (does not wait for them to join).
  [[nodiscard]] static Result<std::unique_ptr<PipelineRig>> start(const RigOptions& options);
  ~PipelineRig();

  [[nodiscard]] const std::string& bootstrap() const { return broker_->bootstrap(); }
  [[nodiscard]] const RigOptions& options() const { return options_; }
  [[nodiscard]] BrokerProcess& broker() { return *broker_; }

  /// Starts one more instance (the group rebalances) with `overrides` after
  /// the rig's own; returns its index.
  [[nodiscard]] Result<int> add_instance(const std::vector<std::string>& overrides = {});

  /// Fails naming the instance, its exit status and its log tail if any
  /// instance has exited.
  [[nodiscard]] Status check_instances();

  /// Committed offsets of the group against the input's high watermarks;
  /// with a repartition stage, caught up once the stage's group committed
  /// the whole input and the dedup group the whole internal topic
  /// (`committed` counts the latter).
  [[nodiscard]] Result<GroupProgress> progress();

  /// SIGTERM every instance, wait (up to `grace`); returns an error naming
  /// each instance that did not exit with status 0.
  [[nodiscard]] Status stop_instances(std::chrono::milliseconds grace = std::chrono::seconds(20));

  /// Stops instances (if still running) and the broker.
  void stop();

  /// Path of instance i's log file.
  [[nodiscard]] std::string instance_log(int i) const;

  /// Process id of instance i (to read its memory from /proc).
  [[nodiscard]] pid_t instance_pid(int i) const { return instances_.at(i)->pid(); }

 private:
  PipelineRig() = default;
  [[nodiscard]] Result<GroupProgress> progress_of(const std::string& group,
                                                  const std::string& topic);
  RigOptions options_;
  std::unique_ptr<BrokerProcess> broker_;
  std::vector<std::unique_ptr<ChildProcess>> instances_;
};

/// The last `lines` lines of a text file ("" if unreadable).
[[nodiscard]] std::string file_tail(const std::string& path, int lines);

/// A free TCP port on 127.0.0.1 (bound and released; racy but fine locally).
[[nodiscard]] Result<int> free_loopback_port();

}  // namespace kdedup::testbroker
