// exit() from a timer's signal handler while the main thread allocates and frees through the CUDA runtime: does the process end?
//
// Many C programs end from a SIGINT/SIGTERM handler with exit(); the handler may land inside
// cudaMalloc/cudaFree, where gpumem's pool holds its lock.  On the emulated device that hung at
// exit under gpumem (2026-12-05, fixed): tests/gpu/exit_in_handler.sh counts hangs bare and under
// gpumem on the real driver, whose own locks may hang it bare too.
#include <cuda_runtime.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>

#include <atomic>

static std::atomic<int> ticks{0};  // lock-free: safe in a handler

int main() {
    void* warm = nullptr;
    if (cudaMalloc(&warm, 4096) != cudaSuccess) return 3;  // the runtime starts, registers its exit handler
    signal(SIGALRM, [](int) {
        if (++ticks == 50) exit(0);
    });
    itimerval it{{0, 200}, {0, 200}};
    setitimer(ITIMER_REAL, &it, nullptr);
    for (long i = 0;; ++i) {
        void* p = nullptr;
        if (cudaMalloc(&p, 512 + size_t(i * 4099) % (8 << 20)) == cudaSuccess) cudaFree(p);
    }
}
