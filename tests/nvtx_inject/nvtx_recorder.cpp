// memplan_nvtx_recorder: an NVTX injection library that writes every range and mark to a file.
//
// Lets tests check NVTX ranges without a GPU or Nsight. Use:
//   NVTX_INJECTION64_PATH=/path/to/libmemplan_nvtx_recorder.so MEMPLAN_NVTX_LOG=/tmp/nvtx.log prog
// NVTX3 (in the program) dlopens this library on its first NVTX call and calls
// InitializeInjectionNvtx2; we point its CORE and CORE2 callback tables at our recorders.
//
// Log format: one line per event, appended and flushed as it happens, fields separated by one
// space, the name running to the end of the line:
//   push <domain> <name>      nvtxDomainRangePushEx / nvtxRangePushA / nvtxRangePushEx
//   pop <domain>              nvtxDomainRangePop / nvtxRangePop
//   mark <domain> <name>      nvtxDomainMarkEx / nvtxMarkA / nvtxMarkEx
//   start <domain> <name>     nvtxDomainRangeStartEx / nvtxRangeStartA / nvtxRangeStartEx
//   end <domain>              nvtxDomainRangeEnd / nvtxRangeEnd
// <domain> is the name given to nvtxDomainCreateA, or "default" for the global domain. In names,
// a newline is written as "\n" and a backslash as "\\"; wide (unicode) messages as "<unicode>".
// Lines from several threads are whole (one mutex) but their order across threads is as it
// happened. If MEMPLAN_NVTX_LOG is unset or cannot be opened, initialization fails (stderr says
// why) and NVTX turns every call into a no-op.
#define NVTX_NO_IMPL  // a tool: only the types, not NVTX's own implementation
#include <nvtx3/nvToolsExt.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace {

std::mutex g_mu;
FILE* g_log = nullptr;

// Handles we give out: NVTX treats them as opaque pointers.
struct Domain { std::string name; };
struct String { std::string text; };

const char* domain_name(nvtxDomainHandle_t d) {
  return d ? reinterpret_cast<Domain*>(d)->name.c_str() : "default";
}

std::string message(const nvtxEventAttributes_t* a) {
  if (a == nullptr) return "";
  switch (a->messageType) {
    case NVTX_MESSAGE_TYPE_ASCII: return a->message.ascii ? a->message.ascii : "";
    case NVTX_MESSAGE_TYPE_REGISTERED:
      return a->message.registered ? reinterpret_cast<String*>(a->message.registered)->text : "";
    case NVTX_MESSAGE_TYPE_UNICODE: return "<unicode>";
    default: return "";
  }
}

void record(const char* kind, const char* domain, const std::string* name) {
  std::string line = kind;
  line += ' ';
  line += domain;
  if (name) {
    line += ' ';
    for (char c : *name) {
      if (c == '\n') line += "\\n";
      else if (c == '\\') line += "\\\\";
      else line += c;
    }
  }
  line += '\n';
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_log) return;
  std::fwrite(line.data(), 1, line.size(), g_log);
  std::fflush(g_log);
}

// ---- CORE2: the domain API ----
nvtxDomainHandle_t NVTX_API domain_create(const char* name) {
  return reinterpret_cast<nvtxDomainHandle_t>(new Domain{name ? name : ""});
}
void NVTX_API domain_destroy(nvtxDomainHandle_t) {}  // keep it: later events may still name it
nvtxStringHandle_t NVTX_API register_string(nvtxDomainHandle_t, const char* s) {
  return reinterpret_cast<nvtxStringHandle_t>(new String{s ? s : ""});
}
int NVTX_API domain_push(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  const std::string m = message(a);
  record("push", domain_name(d), &m);
  return 0;
}
int NVTX_API domain_pop(nvtxDomainHandle_t d) {
  record("pop", domain_name(d), nullptr);
  return 0;
}
void NVTX_API domain_mark(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  const std::string m = message(a);
  record("mark", domain_name(d), &m);
}
nvtxRangeId_t NVTX_API domain_start(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  const std::string m = message(a);
  record("start", domain_name(d), &m);
  return 1;
}
void NVTX_API domain_end(nvtxDomainHandle_t d, nvtxRangeId_t) {
  record("end", domain_name(d), nullptr);
}

// ---- CORE: the global-domain API ----
int NVTX_API push_ex(const nvtxEventAttributes_t* a) { return domain_push(nullptr, a); }
int NVTX_API push_a(const char* s) {
  const std::string m = s ? s : "";
  record("push", "default", &m);
  return 0;
}
int NVTX_API pop() { return domain_pop(nullptr); }
void NVTX_API mark_ex(const nvtxEventAttributes_t* a) { domain_mark(nullptr, a); }
void NVTX_API mark_a(const char* s) {
  const std::string m = s ? s : "";
  record("mark", "default", &m);
}
nvtxRangeId_t NVTX_API start_ex(const nvtxEventAttributes_t* a) { return domain_start(nullptr, a); }
nvtxRangeId_t NVTX_API start_a(const char* s) {
  const std::string m = s ? s : "";
  record("start", "default", &m);
  return 1;
}
void NVTX_API end(nvtxRangeId_t id) { domain_end(nullptr, id); }

template <class F>
void set(NvtxFunctionTable table, unsigned size, unsigned id, F fn) {
  if (table && id <= size && table[id]) *table[id] = reinterpret_cast<NvtxFunctionPointer>(fn);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    NvtxGetExportTableFunc_t get_export_table) {
  const char* path = std::getenv("MEMPLAN_NVTX_LOG");
  if (path == nullptr || *path == '\0') {
    std::fprintf(stderr, "memplan_nvtx_recorder: MEMPLAN_NVTX_LOG is not set; not recording\n");
    return 0;
  }
  g_log = std::fopen(path, "a");
  if (g_log == nullptr) {
    std::fprintf(stderr, "memplan_nvtx_recorder: cannot open %s: %s\n", path, std::strerror(errno));
    return 0;
  }
  const auto* cb = static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (cb == nullptr || cb->struct_size < sizeof(NvtxExportTableCallbacks)) return 0;

  NvtxFunctionTable core = nullptr, core2 = nullptr;
  unsigned core_n = 0, core2_n = 0;
  if (!cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &core, &core_n) ||
      !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &core2, &core2_n)) {
    return 0;
  }
  set(core, core_n, NVTX_CBID_CORE_MarkEx, mark_ex);
  set(core, core_n, NVTX_CBID_CORE_MarkA, mark_a);
  set(core, core_n, NVTX_CBID_CORE_RangeStartEx, start_ex);
  set(core, core_n, NVTX_CBID_CORE_RangeStartA, start_a);
  set(core, core_n, NVTX_CBID_CORE_RangeEnd, end);
  set(core, core_n, NVTX_CBID_CORE_RangePushEx, push_ex);
  set(core, core_n, NVTX_CBID_CORE_RangePushA, push_a);
  set(core, core_n, NVTX_CBID_CORE_RangePop, pop);
  set(core2, core2_n, NVTX_CBID_CORE2_DomainMarkEx, domain_mark);
  set(core2, core2_n, NVTX_CBID_CORE2_DomainRangeStartEx, domain_start);
  set(core2, core2_n, NVTX_CBID_CORE2_DomainRangeEnd, domain_end);
  set(core2, core2_n, NVTX_CBID_CORE2_DomainRangePushEx, domain_push);
  set(core2, core2_n, NVTX_CBID_CORE2_DomainRangePop, domain_pop);
  set(core2, core2_n, NVTX_CBID_CORE2_DomainRegisterStringA, register_string);
  set(core2, core2_n, NVTX_CBID_CORE2_DomainCreateA, domain_create);
  set(core2, core2_n, NVTX_CBID_CORE2_DomainDestroy, domain_destroy);
  return 1;
}
