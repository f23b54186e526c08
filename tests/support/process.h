#pragma once
// Running programs from tests: the kdedup binary with arguments and stdin,
// capturing exit code, stdout and stderr. Used by e2e tests.

#include <string>
#include <vector>

namespace kdedup::testing {

struct ProcessResult {
  int exit_code = -1;  ///< exit status, or 128 + signal
  std::string out;
  std::string err;
};

/// Runs `argv` (argv[0] is a path) with `input` on stdin and waits for it.
ProcessResult run_process(const std::vector<std::string>& argv, const std::string& input = "");

/// Runs the kdedup binary under test with the given arguments.
ProcessResult run_kdedup(const std::vector<std::string>& args, const std::string& input = "");

/// A fresh directory under $TMPDIR (or /tmp), removed with its contents when
/// the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& content);

}  // namespace kdedup::testing
