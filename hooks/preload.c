/* libmemplan.so: the LD_PRELOAD entry of the agent.
 *
 * Deliberately tiny and torch-free: LD_PRELOAD is inherited by every child (sh, git, nvidia-smi,
 * compilers), so this library must load anywhere, cost nothing, and do nothing outside Python.
 * In a Python process its constructor runs before the interpreter reads its environment, so it
 * can put the boot directory (whose sitecustomize.py loads the torch-side agent once torch is
 * imported) on PYTHONPATH. This is heaptrack's split: a preload stub plus an injected library.
 * The torch-side agent is boot/_memplan<EXT_SUFFIX> next to this file, loaded by Python itself.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <strings.h>
#include <unistd.h>

/* True only for the values the option table accepts as "on": a malformed value is the agent's
 * to report (one warning, then the default: enabled), so it must not silence the agent here. */
static int env_true(const char* name) {
  const char* v = getenv(name);
  if (!v || !*v) return 0;
  return strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0 || strcasecmp(v, "yes") == 0 ||
         strcasecmp(v, "on") == 0;
}

static int is_python_process(void) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return 0;
  exe[n] = '\0';
  const char* base = strrchr(exe, '/');
  base = base ? base + 1 : exe;
  return strncmp(base, "python", 6) == 0;
}

/* Prepends dir to the colon-separated variable unless it is already an entry. */
static void prepend_path(const char* var, const char* dir) {
  const char* old = getenv(var);
  if (old && *old) {
    size_t dl = strlen(dir);
    const char* p = old;
    while (p && *p) {
      if (strncmp(p, dir, dl) == 0 && (p[dl] == ':' || p[dl] == '\0')) return;
      p = strchr(p, ':');
      if (p) ++p;
    }
    size_t len = dl + 1 + strlen(old) + 1;
    char* joined = malloc(len);
    if (!joined) return;
    strcpy(joined, dir);
    strcat(joined, ":");
    strcat(joined, old);
    setenv(var, joined, 1);
    free(joined);
  } else {
    setenv(var, dir, 1);
  }
}

__attribute__((constructor)) static void memplan_preload_init(void) {
  if (env_true("MEMPLAN_DISABLE") || !is_python_process()) return;
  Dl_info info;
  if (!dladdr((void*)&memplan_preload_init, &info) || !info.dli_fname) return;
  char lib[PATH_MAX];
  if (!realpath(info.dli_fname, lib)) return;
  char* slash = strrchr(lib, '/');
  if (!slash) return;
  *slash = '\0';
  char boot[PATH_MAX];
  if ((size_t)snprintf(boot, sizeof boot, "%s/boot", lib) >= sizeof boot) return;
  if (access(boot, R_OK) != 0) return;
  prepend_path("PYTHONPATH", boot);
  setenv("MEMPLAN_BOOT_DIR", boot, 1);
}
