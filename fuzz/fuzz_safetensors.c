/* libFuzzer target: safetensors parsing (checkpoint files). */
#include <stddef.h>
#include <stdint.h>

#include "pippin/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pp_safetensors *st = NULL;
    if (pp_safetensors_parse(data, size, "fuzz.safetensors", &st) == PP_OK) {
        for (int i = 0; i < st->n; i++) (void)pp_safetensors_find(st, st->names[i]);
        (void)pp_safetensors_meta(st, "pippin.step");
        pp_safetensors_free(st);
    }
    return 0;
}
