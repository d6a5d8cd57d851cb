/* libFuzzer target: .npy parsing. */
#include <stddef.h>
#include <stdint.h>

#include "pippin/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pp_tensor *t = NULL;
    if (pp_npy_parse(data, size, "fuzz.npy", &t) == PP_OK) pp_tensor_free(t);
    return 0;
}
