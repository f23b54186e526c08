#include "kdedup/common/partitions.h"

#include <algorithm>

namespace kdedup {

std::string summarize_partitions(std::vector<std::pair<std::string, std::int32_t>> parts) {
  std::sort(parts.begin(), parts.end());
  parts.erase(std::unique(parts.begin(), parts.end()), parts.end());
  std::string out;
  for (std::size_t i = 0; i < parts.size();) {
    if (!out.empty()) out += ", ";
    const std::string& topic = parts[i].first;
    out += topic + "[";
    bool first = true;
    while (i < parts.size() && parts[i].first == topic) {
      std::size_t j = i;
      while (j + 1 < parts.size() && parts[j + 1].first == topic &&
             parts[j + 1].second == parts[j].second + 1) {
        ++j;
      }
      if (!first) out += ",";
      first = false;
      out += std::to_string(parts[i].second);
      if (j != i) out += "-" + std::to_string(parts[j].second);
      i = j + 1;
    }
    out += "]";
  }
  return out;
}

}  // namespace kdedup
