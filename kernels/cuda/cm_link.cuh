// What a user's kernel needs to call cm_malloc / cm_free from its own module:
// the declarations. Compile the module with relocatable device code
// (nvcc -ptx -rdc=true) and load it linked with kernels/ptx/cm_link.ptx
// (ctx: CudaContext::link_ptx). Blocks are 16-byte aligned; NULL when the
// heap is out (the host grows it between launches) or the request is 0 or
// more than 1 MiB.
#pragma once

extern "C" __device__ void *cm_malloc(unsigned long long bytes);
extern "C" __device__ void cm_free(void *ptr);
