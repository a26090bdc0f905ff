#include <stdio.h>

#include <epfuse/host.h>

int main(void) {
  epf_config_t cfg = EPF_CONFIG_INIT;
  epf_plan_t plan;
  epf_status_t st;
  cfg.nranks = 8;
  st = epf_plan_compute(&cfg, &plan);
  if (st != EPF_OK) {
    printf("%s\n", epf_status_message(st));
    return 1;
  }
  printf("plan ok: %llu bytes per rank (epfuse %s)\n", (unsigned long long)plan.total_bytes,
         EPF_VERSION_STRING);
  return 0;
}
