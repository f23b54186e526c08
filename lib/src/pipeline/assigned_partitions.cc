// The consumer thread's table of assigned partitions (assigned_partitions.h).

#include "assigned_partitions.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

namespace kdedup::pipeline {

std::vector<PartitionId> AssignedPartitions::ids() const {
  std::vector<PartitionId> ids;
  ids.reserve(map_.size());
  for (const auto& [id, a] : map_) ids.push_back(id);
  return ids;
}

Assigned& AssignedPartitions::insert(const PartitionId& id, Assigned a) {
  std::lock_guard guard(mu_);
  return map_.insert_or_assign(id, std::move(a)).first->second;
}

void AssignedPartitions::erase(const std::vector<PartitionId>& ids) {
  std::lock_guard guard(mu_);
  for (const auto& id : ids) map_.erase(id);
}

std::map<std::uint32_t, std::vector<PartitionId>> AssignedPartitions::by_worker(
    const std::vector<PartitionId>& ids) const {
  std::map<std::uint32_t, std::vector<PartitionId>> out;
  for (const auto& id : ids) {
    if (auto it = map_.find(id); it != map_.end()) out[it->second.worker].push_back(id);
  }
  return out;
}

void AssignedPartitions::confirm(const PartitionId& id, std::int64_t offset) {
  auto& c = confirmed_[id];
  c = std::max(c, offset);
  if (auto it = map_.find(id); it != map_.end()) {
    std::lock_guard guard(mu_);
    it->second.committed = std::max(it->second.committed, offset);
  }
}

bool AssignedPartitions::all_stored_confirmed() const {
  for (const auto& [id, a] : map_) {
    if (a.stored < 0) continue;
    auto it = confirmed_.find(id);
    if (it == confirmed_.end() || it->second < a.stored) return false;
  }
  return true;
}

std::uint64_t AssignedPartitions::in_flight(const std::vector<PartitionId>& ids) const {
  std::uint64_t n = 0;
  for (const auto& id : ids) {
    if (auto it = map_.find(id); it != map_.end()) n += it->second.tracker->in_flight();
  }
  return n;
}

void AssignedPartitions::wait_delivered(const std::vector<PartitionId>& ids,
                                        std::chrono::steady_clock::time_point deadline) const {
  for (;;) {
    const std::uint64_t n = in_flight(ids);
    if (n == 0) return;
    if (std::chrono::steady_clock::now() >= deadline) {
      spdlog::warn(
          "{} outputs still undelivered after shutdown_timeout; their input offsets "
          "stay uncommitted and will be read again",
          n);
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace kdedup::pipeline
