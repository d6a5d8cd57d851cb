/* Built without CUDA (-Dcuda=disabled): asking for a CUDA device says so. */
#include "device_backend.h"

#include "status_internal.h"

pp_status pp_cuda_device_open(pp_device *dev, int ordinal) {
    return pp_error(PP_ERR_UNSUPPORTED,
                    "no CUDA device: this pippin was built without CUDA (meson setup -Dcuda=enabled)");
}
