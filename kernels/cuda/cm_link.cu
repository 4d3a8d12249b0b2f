// cm_malloc / cm_free as a library module: compiled with relocatable device
// code (-rdc=true), it defines the extern "C" functions cm_malloc and
// cm_free and the heap variable cm_heap. A user's module that declares them
// (cm_link.cuh) and is compiled with -rdc=true too is linked with this one
// by ctx (CudaContext::link_ptx); the host binds the heap to the linked
// module as to any other (DeviceHeap::bind).
#define CM_LINK_LIBRARY
#include "cm_alloc.cuh"
