#include "kdedup/testbroker/click_run.h"

#include <fmt/format.h>

#include <set>
#include <thread>
#include <utility>

#include "kdedup/pipeline/provenance.h"

namespace kdedup::testbroker {

namespace {

using Clock = std::chrono::steady_clock;

ClickStreamOptions stream_options(const ClickRunOptions& o) {
  const auto wall_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  ClickStreamOptions so;
  so.records = o.records;
  so.seed = o.seed;
  so.span_ms = o.span_ms;
  so.start_ms = wall_ms - o.span_ms - 200'000;  // every timestamp is in the past
  return so;
}

/// Fails naming the first partition of `topic` whose records the broker
/// dropped (its low watermark moved); returns the sum of high watermarks.
Result<std::int64_t> untruncated_records(const std::string& bootstrap, const std::string& topic,
                                         const char* what) {
  auto marks = query_watermarks(bootstrap, topic);
  if (!marks) return tl::unexpected(marks.error());
  std::int64_t stored = 0;
  for (const auto& m : *marks) {
    if (m.low != 0) {
      return fail(
          fmt::format("{} partition {} was truncated by the test broker (low watermark {}); use "
                      "fewer records or more partitions",
                      what, m.partition, m.low));
    }
    stored += m.high;
  }
  return stored;
}

}  // namespace

ClickRun::ClickRun(PipelineRig& rig, const ClickRunOptions& options,
                   std::unique_ptr<RecordProducer> producer)
    : rig_(rig),
      options_(options),
      producer_(std::move(producer)),
      stream_(stream_options(options)) {}

Result<std::unique_ptr<ClickRun>> ClickRun::start(PipelineRig& rig,
                                                  const ClickRunOptions& options) {
  auto producer = RecordProducer::create(rig.bootstrap(), options.producer_properties);
  if (!producer) return tl::unexpected(producer.error());
  return std::unique_ptr<ClickRun>(new ClickRun(rig, options, std::move(*producer)));
}

Status ClickRun::produce(std::uint64_t n, const std::function<Status(std::uint64_t)>& every_1024) {
  const std::string& topic = rig_.options().input_topic;
  const auto partitions = static_cast<std::uint64_t>(rig_.options().partitions);
  Click click;
  for (std::uint64_t i = 0; i < n && stream_.next(click); ++i) {
    counts_.retries += click.kind == Click::Kind::kRetry;
    counts_.reposts += click.kind == Click::Kind::kRepost;
    counts_.fraud += click.kind == Click::Kind::kFraud;
    // Unkeyed: record number times a large odd constant, mod partitions:
    // the same spread every run, unrelated to the identity.
    const std::int32_t partition =
        options_.unkeyed
            ? static_cast<std::int32_t>((counts_.produced * 2654435761ULL) % partitions)
            : -1;  // the producer's partitioner on the key
    if (auto ok = producer_->produce(topic, partition, click.key, click.value, click.timestamp_ms);
        !ok) {
      return ok;
    }
    ++counts_.produced;
    if (every_1024 && counts_.produced % 1024 == 0) {
      if (auto ok = every_1024(counts_.produced); !ok) return ok;
    }
  }
  return producer_->flush(std::chrono::seconds(60));
}

Status ClickRun::wait_caught_up(std::chrono::milliseconds limit,
                                const std::function<Status(const GroupProgress&)>& on_progress) {
  const auto deadline = Clock::now() + limit;
  GroupProgress last;
  for (;;) {
    if (auto ok = rig_.check_instances(); !ok) return ok;
    if (auto p = rig_.progress()) {
      last = *p;
      if (on_progress) {
        if (auto ok = on_progress(last); !ok) return ok;
      }
      if (last.caught_up) return {};
    }
    if (Clock::now() > deadline) {
      return fail(fmt::format("the group committed {} of {} records within {} s; logs in {}",
                              last.committed, last.end,
                              std::chrono::duration_cast<std::chrono::seconds>(limit).count(),
                              rig_.options().work_dir));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Status ClickRun::check_input_kept() const {
  auto stored = untruncated_records(rig_.bootstrap(), rig_.options().input_topic, "input");
  if (!stored) return tl::unexpected(stored.error());
  if (static_cast<std::uint64_t>(*stored) != counts_.produced) {
    return fail(
        fmt::format("produced {} records but the input holds {}", counts_.produced, *stored));
  }
  return {};
}

Result<std::int64_t> ClickRun::output_records() const {
  return untruncated_records(rig_.bootstrap(), rig_.options().output_topic, "output");
}

Result<RunOutput> ClickRun::read_back() const {
  const RigOptions& ro = rig_.options();
  if (auto kept = output_records(); !kept) return tl::unexpected(kept.error());
  RunOutput run;
  auto output = read_topic(rig_.bootstrap(), ro.output_topic, std::chrono::seconds(60));
  if (!output) return tl::unexpected(output.error());
  run.output = to_output_records(*output);
  if (!ro.repartition_topic.empty()) {
    auto input = internal_topic_input();
    if (!input) return tl::unexpected(input.error());
    run.input = std::move(*input);
  } else {
    auto input = read_topic(rig_.bootstrap(), ro.input_topic, std::chrono::seconds(60));
    if (!input) return tl::unexpected(input.error());
    auto records = to_input_records(*input, "key");
    if (!records) return tl::unexpected(records.error());
    run.input = std::move(*records);
  }
  if (auto dlq = query_watermarks(rig_.bootstrap(), ro.dlq_topic)) {
    for (const auto& m : *dlq) run.dead_letters += m.high - m.low;
  }
  return run;
}

/// With a repartition stage the dedup stage read the internal topic: its
/// records are the oracle's input (identities are partitioned by H_S
/// there, so the per-partition oracle is the exact semantics over the whole
/// input), once it is checked to hold every produced record
/// (kdedup-origin-*).
Result<std::vector<InputRecord>> ClickRun::internal_topic_input() const {
  const std::string& topic = rig_.options().repartition_topic;
  auto internal = read_topic(rig_.bootstrap(), topic, std::chrono::seconds(60));
  if (!internal) return tl::unexpected(internal.error());
  std::set<std::pair<std::string, std::string>> origins;
  for (const auto& rec : *internal) {
    auto p = rec.header(pipeline::kOriginPartitionHeader);
    auto off = rec.header(pipeline::kOriginOffsetHeader);
    if (!p || !off) {
      return fail(fmt::format("internal topic record {}[{}]@{} has no origin headers", topic,
                              rec.partition, rec.offset));
    }
    origins.emplace(*p, *off);
  }
  if (origins.size() != counts_.produced) {
    return fail(fmt::format(
        "the internal topic holds {} of the {} input records: the repartition stage lost some",
        origins.size(), counts_.produced));
  }
  return to_input_records(*internal, "key");
}

}  // namespace kdedup::testbroker
