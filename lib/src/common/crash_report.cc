#include "kdedup/common/crash_report.h"

#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cstddef>
#include <cstring>

// Sanitizer builds keep their own handlers, which report more.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KDEDUP_CRASH_REPORT 0
#else
#define KDEDUP_CRASH_REPORT 1
#endif

namespace kdedup {

#if KDEDUP_CRASH_REPORT
namespace {

// Only async-signal-safe calls from here on: write(), backtrace() (loaded
// before any signal by install_crash_report()), raise().

void put(const char* text) {
  const std::size_t n = std::strlen(text);
  if (write(STDERR_FILENO, text, n) < 0) return;  // nothing left to tell
}

void put_number(long value) {
  std::array<char, 24> digits{};
  std::size_t at = digits.size() - 1;  // a terminating 0 at the end
  const bool negative = value < 0;
  unsigned long v = negative ? 0UL - static_cast<unsigned long>(value) : value;
  do {
    digits[--at] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0 && at > 1);
  if (negative) digits[--at] = '-';
  put(digits.data() + at);
}

const char* name_of(int sig) {
  switch (sig) {
    case SIGSEGV:
      return "SIGSEGV (invalid memory access)";
    case SIGBUS:
      return "SIGBUS (bus error)";
    case SIGFPE:
      return "SIGFPE (arithmetic error)";
    case SIGILL:
      return "SIGILL (illegal instruction)";
    case SIGABRT:
      return "SIGABRT (aborted)";
    default:
      return "signal";
  }
}

void on_fatal_signal(int sig) {
  put("kdedup: fatal signal ");
  put_number(sig);
  put(" ");
  put(name_of(sig));
  put(" in thread ");
  put_number(static_cast<long>(syscall(SYS_gettid)));
  put("; backtrace (resolve with addr2line -f -C -e <the kdedup binary> <offset>):\n");
  std::array<void*, 64> frames{};
  const int n = backtrace(frames.data(), static_cast<int>(frames.size()));
  backtrace_symbols_fd(frames.data(), n, STDERR_FILENO);
  // SA_RESETHAND restored the default action: die of the same signal.
  raise(sig);
}

}  // namespace
#endif

void install_crash_report() noexcept {
#if KDEDUP_CRASH_REPORT
  static bool installed = false;
  if (installed) return;
  installed = true;
  // backtrace() loads libgcc on its first call, which may allocate: do it
  // now, not in the handler.
  std::array<void*, 2> warm{};
  (void)backtrace(warm.data(), static_cast<int>(warm.size()));
  // A stack of its own for the handler (a stack overflow leaves none).
  static std::array<char, 64 * 1024> alternate{};
  stack_t ss{};
  ss.ss_sp = alternate.data();
  ss.ss_size = alternate.size();
  (void)sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_ONSTACK;
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) (void)sigaction(sig, &sa, nullptr);
#endif
}

}  // namespace kdedup
