// plugin.cpp — a stand-in for a Python extension that includes the header library (C++), built
// twice with different EPF_MAX_RANKS (tests/capi/CMakeLists.txt). Its exported entry points say
// which copy of the inline header functions it actually runs.
#include "epfuse/host.h"

extern "C" __attribute__((visibility("default"))) int plugin_max_ranks(void) { return EPF_TEST_PLUGIN_RANKS; }

// The signature of the build whose epf_build_signature this plugin's code calls (an interposed
// definition would return the other plugin's).
extern "C" __attribute__((visibility("default"))) unsigned long long plugin_build_signature(void) {
  return (unsigned long long)epf_build_signature();
}

// epf_plan_compute through this plugin: the header region's size depends on EPF_MAX_RANKS.
extern "C" __attribute__((visibility("default"))) unsigned long long plugin_first_region_offset(int nranks) {
  epf_config_t c = EPF_CONFIG_INIT;
  epf_plan_t p;
  c.nranks = nranks;
  c.num_experts = 8 * nranks;
  c.top_k = 2;
  c.hidden = 256;
  c.max_tokens_per_rank = 16;
  if (epf_plan_compute(&c, &p) != EPF_OK) return 0;
  return (unsigned long long)p.region[1].offset;
}

// plan_check of a plan made by the caller (possibly another build)
extern "C" __attribute__((visibility("default"))) int plugin_plan_check(const epf_plan_t* p) { return (int)epf_plan_check(p); }
