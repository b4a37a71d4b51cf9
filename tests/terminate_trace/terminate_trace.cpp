// Test helper, preloaded into the two-rank tests' processes (MEMPLAN_TEST_TERMINATE_TRACE): on
// std::terminate, the stack of the thread that called it goes to stderr, then the handler that
// was there before runs (libstdc++'s: names the exception, aborts). Now and then, under load, a
// rank dies at exit with "terminate called without an active exception" (in plain runs as well
// as under memplan); this leaves the dying thread's stack in the test's output.
#include <execinfo.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

namespace {

std::terminate_handler g_previous = nullptr;

[[noreturn]] void on_terminate() {
  char head[96];
  const int n = std::snprintf(head, sizeof head, "memplan-test: std::terminate on thread %ld, pid %d:\n",
                              static_cast<long>(syscall(SYS_gettid)), static_cast<int>(getpid()));
  if (n > 0) (void)!write(2, head, static_cast<size_t>(n));
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
  if (g_previous != nullptr) g_previous();
  std::abort();
}

__attribute__((constructor)) void install() { g_previous = std::set_terminate(on_terminate); }

}  // namespace
