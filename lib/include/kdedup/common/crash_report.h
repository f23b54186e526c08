#pragma once
// A report on stderr when the process dies of a fatal signal (SIGSEGV,
// SIGBUS, SIGFPE, SIGILL, SIGABRT): the signal, the thread and the return
// addresses of its stack, as `kdedup(+0x...)` offsets that `addr2line -f -C
// -e kdedup` resolves on the same build. The process then dies of the same
// signal, so its exit status (128 + the signal) and any core dump are what
// they would be without the report. Not installed in sanitizer builds,
// whose own handlers report more.
//
// Threading: install once, from main(), before other threads start.

namespace kdedup {

/// Installs the handlers (idempotent).
void install_crash_report() noexcept;

}  // namespace kdedup
