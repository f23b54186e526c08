#include "metrics_doc.h"

#include <cstdlib>
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

std::optional<double> exposition_sum(const std::string& text, const std::string& name,
                                     const std::vector<std::string>& labels) {
  std::optional<double> sum;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name, 0) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != '{' && next != ' ') continue;
    bool match = true;
    for (const auto& l : labels) match = match && line.find(l) != std::string::npos;
    const auto space = line.rfind(' ');
    if (!match || space == std::string::npos) continue;
    sum = sum.value_or(0.0) + std::strtod(line.c_str() + space + 1, nullptr);
  }
  return sum;
}

std::size_t exposition_series(const std::string& text, const std::string& name) {
  std::size_t n = 0;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) n += line.rfind(name + "{", 0) == 0;
  return n;
}

}  // namespace kdedup::testing
