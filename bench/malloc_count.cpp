// LD_PRELOAD counter of glibc malloc calls, for bench/malloc_per_step.sh: a measurement tool, not
// part of memplan. At exit it writes to $MALLOC_COUNT_OUT the number of calls, and with
// MALLOC_COUNT_SAMPLE=N, for every Nth call from MALLOC_COUNT_FROM seconds after start (for
// MALLOC_COUNT_FOR seconds), its first three callers outside libc/libstdc++/libc10, by name:
// `sort | uniq -c | sort -rn` on those lines says who allocates.
//
// malloc forwards to __libc_malloc; a thread-local flag (initial-exec TLS, which itself never
// allocates) keeps backtrace() and the report from counting themselves.
#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" void* __libc_malloc(size_t);

namespace {
constexpr int kDepth = 10;
constexpr unsigned long kMaxSamples = 50000;
__thread int t_busy __attribute__((tls_model("initial-exec")));
std::atomic<unsigned long> g_calls{0};
std::atomic<bool> g_sampling{false};
unsigned long g_every = 0;
void* g_frames[kMaxSamples][kDepth];
int g_depth[kMaxSamples];
std::atomic<unsigned long> g_samples{0};

void* window(void*) {
  sleep(static_cast<unsigned>(atoi(getenv("MALLOC_COUNT_FROM") ?: "0")));
  g_sampling = true;
  sleep(static_cast<unsigned>(atoi(getenv("MALLOC_COUNT_FOR") ?: "1000000")));
  g_sampling = false;
  return nullptr;
}

bool ours(const char* file) {
  return file == nullptr || strstr(file, "libc.so") || strstr(file, "libstdc++") || strstr(file, "libc10.so") ||
         strstr(file, "malloc_count");
}

__attribute__((constructor)) void start() {
  if (const char* n = getenv("MALLOC_COUNT_SAMPLE")) g_every = strtoul(n, nullptr, 10);
  if (g_every > 0) {
    pthread_t t;
    pthread_create(&t, nullptr, window, nullptr);
    pthread_detach(t);
  }
}

__attribute__((destructor)) void report() {
  t_busy = 1;
  const char* path = getenv("MALLOC_COUNT_OUT");
  if (path == nullptr) return;
  FILE* out = fopen(path, "w");
  if (out == nullptr) return;
  fprintf(out, "calls %lu\n", g_calls.load());
  const unsigned long n = std::min(g_samples.load(), kMaxSamples);
  for (unsigned long i = 0; i < n; ++i) {
    int named = 0;
    for (int j = 1; j < g_depth[i] && named < 3; ++j) {
      Dl_info info;
      if (!dladdr(g_frames[i][j], &info) || (named == 0 && ours(info.dli_fname))) continue;
      const char* sym = info.dli_sname ? info.dli_sname : "?";
      int status = 0;
      char* name = abi::__cxa_demangle(sym, nullptr, nullptr, &status);
      fprintf(out, "%s%.160s", named ? " < " : "", name ? name : sym);
      free(name);
      ++named;
    }
    fputc('\n', out);
  }
  fclose(out);
}
}  // namespace

extern "C" void* malloc(size_t size) {
  void* p = __libc_malloc(size);
  if (t_busy) return p;
  const unsigned long k = g_calls.fetch_add(1, std::memory_order_relaxed) + 1;
  if (g_every > 0 && k % g_every == 0 && g_sampling.load(std::memory_order_relaxed)) {
    const unsigned long i = g_samples.fetch_add(1, std::memory_order_relaxed);
    if (i < kMaxSamples) {
      t_busy = 1;
      g_depth[i] = backtrace(g_frames[i], kDepth);
      t_busy = 0;
    }
  }
  return p;
}
