#include "metrics_doc.h"

#include <fstream>
#include <sstream>

namespace kdedup::testing {

namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

MetricsDoc read_metrics_doc(const std::string& path) {
  MetricsDoc doc;
  std::ifstream in(path);
  if (!in) {
    doc.problems.push_back(path + ": cannot be read");
    return doc;
  }
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| `kdedup_", 0) != 0) continue;
    std::vector<std::string> cells;
    std::stringstream row(line.substr(1));
    std::string cell;
    while (std::getline(row, cell, '|')) cells.push_back(trim(cell));
    if (cells.size() < 6) {
      doc.problems.push_back("short row: " + line);
      if (cells.size() < 2) continue;
    }
    const std::string name = cells[0].substr(1, cells[0].find('`', 1) - 1);
    if (doc.types.count(name)) doc.problems.push_back(name + " is documented twice");
    doc.types[name] = cells[1];
  }
  return doc;
}

std::map<std::string, std::string> exposition_types(const std::string& text) {
  std::map<std::string, std::string> out;
  std::stringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) != 0) continue;
    std::stringstream fields(line.substr(7));
    std::string name, type;
    fields >> name >> type;
    if (!name.empty()) out[name] = type;
  }
  return out;
}

}  // namespace kdedup::testing
