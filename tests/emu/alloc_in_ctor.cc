// A library whose constructor sleeps, then allocates device memory: while a thread loads it, that
// thread holds the dynamic loader's lock (tests/emu/emu_app.cc "stacks-in-dlopen").
#include <cuda.h>
#include <unistd.h>

__attribute__((constructor)) static void alloc_in_ctor() {
    usleep(300000);  // the main thread's allocation comes meanwhile
    CUdeviceptr p = 0;
    if (cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS) cuMemFree_v2(p);
}
