// Staged deliveries of one partition (confirm_staging.h).

#include "confirm_staging.h"

#include <algorithm>
#include <bit>

namespace kdedup::state {

std::size_t Staging::find_slot(const filter::Fingerprint& fp) const {
  if (slots_.empty()) return kNotFound;
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = home(fp, mask);; i = (i + 1) & mask) {
    const std::uint64_t s = slots_[i];
    if (s == 0) return kNotFound;
    const std::uint64_t seq = s - 1;
    // A stale slot (its delivery moved to disk) cannot be compared: probe on.
    if (seq >= base_ && entries_[seq - base_].fp == fp) return i;
  }
}

void Staging::index(const filter::Fingerprint& fp, std::uint64_t seq) {
  if ((used_ + 1) * 2 > slots_.size()) rebuild_index(entries_.size() + 1);
  const std::size_t mask = slots_.size() - 1;
  std::size_t reuse = kNotFound;
  for (std::size_t i = home(fp, mask);; i = (i + 1) & mask) {
    const std::uint64_t s = slots_[i];
    if (s == 0) {
      if (reuse == kNotFound) {
        reuse = i;
        ++used_;
      }
      break;
    }
    const std::uint64_t old = s - 1;
    if (old < base_) {
      if (reuse == kNotFound) reuse = i;
    } else if (entries_[old - base_].fp == fp) {
      reuse = i;  // the newer delivery replaces the older one's slot
      // A stale slot chosen earlier on the probe path stays as it was.
      break;
    }
  }
  slots_[reuse] = seq + 1;
}

void Staging::rebuild_index(std::size_t at_least) {
  std::size_t capacity = std::bit_ceil(std::max<std::size_t>(1024, 4 * at_least));
  slots_.assign(capacity, 0);
  used_ = 0;
  const std::size_t mask = capacity - 1;
  for (std::size_t j = 0; j < entries_.size(); ++j) {
    const filter::Fingerprint& fp = entries_[j].fp;
    for (std::size_t i = home(fp, mask);; i = (i + 1) & mask) {
      const std::uint64_t s = slots_[i];
      if (s == 0) {
        slots_[i] = base_ + j + 1;
        ++used_;
        break;
      }
      if (entries_[s - 1 - base_].fp == fp) {
        slots_[i] = base_ + j + 1;  // later entries are newer
        break;
      }
    }
  }
}

void Staging::lookup(std::span<const filter::Fingerprint> fps,
                     std::span<std::optional<filter::Tick>> ticks,
                     std::vector<std::size_t>& misses) const {
  std::lock_guard lock(mu_);
  for (std::size_t i = 0; i < fps.size(); ++i) {
    const std::size_t slot = find_slot(fps[i]);
    if (slot == kNotFound) {
      misses.push_back(i);
    } else {
      ticks[i] = entries_[slots_[slot] - 1 - base_].tick;
    }
  }
}

void Staging::append(std::span<const ConfirmWrite> writes) {
  std::lock_guard lock(mu_);
  for (const ConfirmWrite& w : writes) {
    if (!entries_.empty() && w.offset < entries_.back().offset) sorted_ = false;
    entries_.push_back(w);
    index(w.fp, base_ + entries_.size() - 1);
  }
}

std::vector<ConfirmWrite> Staging::copy_below(std::int64_t offset) const {
  std::lock_guard lock(mu_);
  std::vector<ConfirmWrite> out;
  for (const ConfirmWrite& w : entries_) {
    if (w.offset < offset) {
      out.push_back(w);
    } else if (sorted_) {
      break;
    }
  }
  return out;
}

void Staging::drop_below(std::int64_t offset) {
  std::lock_guard lock(mu_);
  if (sorted_) {
    const auto end = std::partition_point(entries_.begin(), entries_.end(),
                                          [&](const ConfirmWrite& w) { return w.offset < offset; });
    const auto n = static_cast<std::size_t>(end - entries_.begin());
    entries_.erase(entries_.begin(), end);
    base_ += n;
    // Mostly stale slots slow probing down: rebuild once they dominate.
    if (used_ > 4 * entries_.size() + 1024) rebuild_index(entries_.size());
    return;
  }
  // Out of order (never in kdedup's own use): keep the rest, renumber.
  std::erase_if(entries_, [&](const ConfirmWrite& w) { return w.offset < offset; });
  rebuild_index(entries_.size());  // every seq moved: index them all again
  sorted_ = std::is_sorted(
      entries_.begin(), entries_.end(),
      [](const ConfirmWrite& a, const ConfirmWrite& b) { return a.offset < b.offset; });
}

std::size_t Staging::bytes() const {
  std::lock_guard lock(mu_);
  return entries_.capacity() * sizeof(ConfirmWrite) + slots_.capacity() * sizeof(std::uint64_t);
}

std::size_t Staging::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace kdedup::state
