/* pippin: pipeline-parallel stage executor. Including this header includes
 * every public module.
 *
 * Thread safety: each header says what holds for its module. */
#ifndef PIPPIN_H
#define PIPPIN_H

#include "pippin/status.h"
#include "pippin/log.h"
#include "pippin/tensor.h"
#include "pippin/npy.h"
#include "pippin/safetensors.h"
#include "pippin/graph.h"
#include "pippin/device.h"
#include "pippin/exec.h"
#include "pippin/optimize.h"
#include "pippin/onnx.h"
#include "pippin/autodiff.h"
#include "pippin/params.h"
#include "pippin/optim.h"
#include "pippin/trainer.h"
#include "pippin/microbatch.h"
#include "pippin/pipe.h"
#include "pippin/balance.h"
#include "pippin/stage.h"
#include "pippin/runner.h"
#include "pippin/schedule.h"
#include "pippin/sched_sim.h"
#include "pippin/sched_trace.h"
#include "pippin/transport.h"
#include "pippin/client.h"
#include "pippin/executor.h"
#include "pippin/checkpoint.h"
#include "pippin/config.h"
#include "pippin/version.h"
#include "pippin/worker.h"

#endif
