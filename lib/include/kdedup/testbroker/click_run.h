#pragma once
// ClickRun: a generated click stream through a PipelineRig, the run that
// `kdedup demo` and bench/pipeline_bench are made of: produce the stream into
// the rig's input topic (keyed, or spread over the partitions without regard
// to the key), wait until the group committed all of it (output is delivered
// before offsets are committed), check that the test broker kept every
// record (it keeps ~5 MiB per partition), and read input and output back for
// the output oracle (output_oracle.h).
//
// Owned by one thread; the rig outlives it. close() (or the destructor)
// before the rig stops: no client of ours may outlive the broker.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kdedup/common/result.h"
#include "kdedup/testbroker/click_stream.h"
#include "kdedup/testbroker/kafka_io.h"
#include "kdedup/testbroker/output_oracle.h"
#include "kdedup/testbroker/pipeline_rig.h"

namespace kdedup::testbroker {

struct ClickRunOptions {
  std::uint64_t records = 100'000;  ///< the whole stream (all produce() calls together)
  std::uint64_t seed = 1;
  /// The clicks' timestamps span this, ending 200 s before the run starts:
  /// every record is in the past, so no clock is capped.
  std::int64_t span_ms = 300'000;
  /// Partition by record number (a fixed, identity-blind spread: copies of
  /// a click land in different partitions) instead of by key.
  bool unkeyed = false;
  KafkaProperties producer_properties;
};

/// How many clicks of each kind were produced.
struct ClickCounts {
  std::uint64_t produced = 0, retries = 0, reposts = 0, fraud = 0;
};

/// What read_back() found: the input the dedup stage read and its output.
struct RunOutput {
  std::vector<InputRecord> input;
  std::vector<OutputRecord> output;
  std::int64_t dead_letters = 0;  ///< records in the dead-letter topic
};

class ClickRun {
 public:
  [[nodiscard]] static Result<std::unique_ptr<ClickRun>> start(PipelineRig& rig,
                                                               const ClickRunOptions& options);
  ~ClickRun() { close(); }
  ClickRun(const ClickRun&) = delete;
  ClickRun& operator=(const ClickRun&) = delete;

  /// Produces the next `n` clicks (fewer at the stream's end) and waits for
  /// their acknowledgements. `every_1024` (may be empty) runs after every
  /// 1,024 records with the count so far; an error it returns stops the run.
  [[nodiscard]] Status produce(std::uint64_t n,
                               const std::function<Status(std::uint64_t)>& every_1024 = {});

  /// Waits until the group committed every input offset, polling every
  /// 50 ms; `on_progress` (may be empty) sees each reading and may stop the
  /// wait with an error. Fails when an instance died (with its log tail) or
  /// after `limit`, saying how far the group got and where the logs are.
  [[nodiscard]] Status wait_caught_up(
      std::chrono::milliseconds limit,
      const std::function<Status(const GroupProgress&)>& on_progress = {});

  /// Every record produced is still in the input: no low watermark moved,
  /// the high watermarks add up to what was produced.
  [[nodiscard]] Status check_input_kept() const;
  /// Records in the output topic; fails when the broker truncated it.
  [[nodiscard]] Result<std::int64_t> output_records() const;

  /// The input and the output read back with an independent consumer
  /// (identity = the record key). With a repartition stage the input is
  /// the internal topic, checked to hold every produced record.
  [[nodiscard]] Result<RunOutput> read_back() const;

  [[nodiscard]] const ClickCounts& counts() const noexcept { return counts_; }
  /// Drops the producer (idempotent).
  void close() { producer_.reset(); }

 private:
  ClickRun(PipelineRig& rig, const ClickRunOptions& options,
           std::unique_ptr<RecordProducer> producer);
  [[nodiscard]] Result<std::vector<InputRecord>> internal_topic_input() const;

  PipelineRig& rig_;
  ClickRunOptions options_;
  std::unique_ptr<RecordProducer> producer_;
  ClickStream stream_;
  ClickCounts counts_;
};

}  // namespace kdedup::testbroker
