// A kdedup process that dies of a fatal signal leaves a report on stderr
// (common/crash_report.h) and still dies of that signal: exit status 128 +
// the signal, as an orchestrator expects of a crash.

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <string>

#include "kdedup/testbroker/child_process.h"
#include "process.h"
#include "sanitizer.h"

namespace kdedup::testing {
namespace {

using namespace std::chrono_literals;
using testbroker::ChildProcess;

TEST(CrashReport, AFatalSignalLeavesABacktraceAndTheSameExitStatus) {
  if (kSanitizerBuild) {
    GTEST_SKIP() << "sanitizer builds report fatal signals with their own handlers";
  }
  TempDir dir;
  for (int sig : {SIGSEGV, SIGABRT}) {
    SCOPED_TRACE(sig);
    testbroker::ChildOptions o;
    o.pipe_stdout = true;
    o.stderr_file = dir.file("broker-" + std::to_string(sig) + ".log");
    auto p = ChildProcess::spawn({KDEDUP_BINARY, "testbroker", "--brokers", "1"}, o);
    ASSERT_TRUE(p) << p.error().message;
    auto bootstrap = (*p)->read_line(30s);  // up and serving
    ASSERT_TRUE(bootstrap) << bootstrap.error().message << read_file(o.stderr_file);
    (*p)->signal(sig);
    EXPECT_EQ((*p)->wait(30s), 128 + sig);
    const std::string err = read_file(o.stderr_file);
    EXPECT_NE(err.find("kdedup: fatal signal " + std::to_string(sig) + " SIG"), std::string::npos)
        << err;
    EXPECT_NE(err.find("backtrace"), std::string::npos) << err;
    // At least one frame in the kdedup binary itself.
    EXPECT_NE(err.find("kdedup("), std::string::npos) << err;
  }
}

}  // namespace
}  // namespace kdedup::testing
