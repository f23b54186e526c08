#include "kdedup/pipeline/snapshotter.h"

namespace kdedup::pipeline {

namespace {

PartitionId partition_of(const state::PartitionKey& key) {
  return PartitionId{key.topic, key.partition};
}

}  // namespace

Snapshotter::Snapshotter(Submit submit, Written written)
    : submit_(std::move(submit)), written_(std::move(written)) {}

bool Snapshotter::busy(const PartitionId& partition) const {
  std::lock_guard lock(mu_);
  return waiting_.count(partition) != 0 || in_flight_.count(partition) != 0;
}

std::optional<state::SnapshotCapture> Snapshotter::take_ready(const PartitionId& partition) {
  auto it = waiting_.find(partition);
  if (it == waiting_.end() || in_flight_.count(partition)) return std::nullopt;
  const auto committed = gate_.committed_offset(partition);
  if (!committed || it->second.next_offset > *committed) return std::nullopt;
  state::SnapshotCapture c = std::move(it->second);
  waiting_.erase(it);
  in_flight_.insert(partition);
  ++counts_.submitted;
  return c;
}

void Snapshotter::offer(state::SnapshotCapture capture) {
  const PartitionId id = partition_of(capture.key);
  std::optional<state::SnapshotCapture> ready;
  {
    std::lock_guard lock(mu_);
    auto [it, inserted] = waiting_.try_emplace(id);
    if (!inserted) ++counts_.replaced;
    it->second = std::move(capture);
    ready = take_ready(id);
  }
  if (ready) submit(std::move(*ready));
}

void Snapshotter::committed(const PartitionId& partition, std::int64_t offset) {
  gate_.committed(partition, offset);
  std::optional<state::SnapshotCapture> ready;
  {
    std::lock_guard lock(mu_);
    ready = take_ready(partition);
  }
  if (ready) submit(std::move(*ready));
}

void Snapshotter::reset(const PartitionId& partition, std::optional<std::int64_t> committed) {
  gate_.forget(partition);
  if (committed) gate_.committed(partition, *committed);
  drop(partition);
}

void Snapshotter::drop(const PartitionId& partition) {
  std::lock_guard lock(mu_);
  if (waiting_.erase(partition) != 0) ++counts_.dropped;
}

void Snapshotter::submit(state::SnapshotCapture capture) {
  const PartitionId id = partition_of(capture.key);
  submit_(std::move(capture),
          [this, id](Result<state::WriteReport> result) { finished(id, result); });
}

void Snapshotter::finished(const PartitionId& partition, const Result<state::WriteReport>& result) {
  // Metrics and error handling first: once in_flight_ is empty, wait_idle()
  // returns and the owner may go away.
  if (written_) written_(partition, result);
  std::optional<state::SnapshotCapture> ready;
  {
    std::lock_guard lock(mu_);
    in_flight_.erase(partition);
    ++(result ? counts_.written : counts_.failed);
    // A failed write leaves the waiting capture alone: the owner stops the
    // service on a write error, and a later success needs no special case.
    ready = take_ready(partition);
    if (in_flight_.empty() && !ready) idle_.notify_all();
  }
  if (ready) submit(std::move(*ready));
}

bool Snapshotter::wait_idle(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return idle_.wait_for(lock, timeout, [this] { return in_flight_.empty(); });
}

Snapshotter::Counts Snapshotter::counts() const {
  std::lock_guard lock(mu_);
  Counts c = counts_;
  c.waiting = waiting_.size();
  return c;
}

}  // namespace kdedup::pipeline
