/* Internal: a training stage's parameters kept on its device. The flat
 * buffers of pippin/params.h (weights and gradients) have a copy in device
 * memory, and so has the state of the optimizer last stepped there; each
 * of the three remembers which side is current. Runs read the weights
 * there, W adds the gradients there, the update runs there; the host
 * copies are brought up to date only when asked (pp_stage_params: a
 * checkpoint, a read of the parameters), so a step's copies are the
 * stage's boundary values alone. */
#ifndef PIPPIN_STAGES_DEVICE_PARAMS_H
#define PIPPIN_STAGES_DEVICE_PARAMS_H

#include "pippin/device.h"
#include "pippin/optim.h"
#include "pippin/params.h"

typedef struct pp_device_params pp_device_params;

/* fp (borrowed; it must outlive the result) on dev, which must keep
 * parameters (pp_device_keeps_params). Nothing crosses yet: the host's
 * copies are current. */
pp_status pp_device_params_new(pp_device *dev, pp_flat_params *fp, pp_device_params **out);
void pp_device_params_free(pp_device_params *dp);

/* Parameter i on the device (a view of the device's weights; borrowed). */
pp_tensor *pp_device_params_view(const pp_device_params *dp, int i);
/* Before a run: the device's weights are current (one upload of the whole
 * buffer when the host's changed since). */
pp_status pp_device_params_ready(pp_device_params *dp);
/* Gradient i += g on the device (g uploaded first when it is on the host). */
pp_status pp_device_params_accumulate(pp_device_params *dp, int i, const pp_tensor *g);
/* Every gradient zero, on both sides. */
void pp_device_params_zero_grad(pp_device_params *dp);
/* One update of o (made for fp->total elements) on the device. o's state
 * is uploaded first unless the device holds it from o's last step here;
 * afterwards the device holds it: o must stay alive until the next
 * pp_device_params_to_host(dp, 1) or the end of dp. */
pp_status pp_device_params_step(pp_device_params *dp, pp_optim *o);
/* The host's copies current (downloads where the device's are newer): the
 * weights, the gradients and the state of the optimizer last stepped
 * here. writable: the caller may change them, so the device takes the
 * host's again before it next uses them. */
pp_status pp_device_params_to_host(pp_device_params *dp, int writable);
/* The host's gradients current and writable (the device takes them again
 * before it next uses them); the weights and the optimizer state stay. */
pp_status pp_device_params_grads_to_host(pp_device_params *dp);
/* Parameter i's weights (grad 0) or gradient (grad 1) as a new host
 * tensor, downloading that range only when only the device has it. */
pp_status pp_device_params_copy(pp_device_params *dp, int i, int grad, pp_tensor **out);
/* Sets gradient i on both sides. */
pp_status pp_device_params_set_grad(pp_device_params *dp, int i, const pp_tensor *g);

#endif
