/* libFuzzer target: pipeline config (YAML) parsing and checking. */
#include <stddef.h>
#include <stdint.h>

#include "pippin/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pp_config *c = NULL;
    if (pp_config_parse((const char *)data, size, "fuzz.yaml", "cfg", &c) == PP_OK) pp_config_free(c);
    return 0;
}
