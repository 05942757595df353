// Whether a block exported by cuIpcGetMemHandle opens in another process through the driver's first ABI of cuIpcOpenMemHandle (the unversioned symbol, and what cuGetProcAddress hands out below version 11000).
//
// `ipc_first_abi`: allocates 64 MiB with cuMemAlloc (a pooled block under gpumem), fills it, exports it,
// and runs itself as `ipc_first_abi open HEX` for each of three routes: the unversioned symbol, the
// pointer cuGetProcAddress gives at 10000, the one it gives at 12000.  Each child prints which library
// and symbol its pointer resolves to (dladdr) and the open's result, then checks the bytes.  Under
// gpumem every route must open the block (docs/pool.md, IPC); alone, the driver's own answers.
#include <cuda.h>
#include <dlfcn.h>
#include <unistd.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using open_fn = CUresult (*)(CUdeviceptr*, CUipcMemHandle, unsigned int);
static const size_t kBytes = size_t(64) << 20;

static void where(const char* what, void* p) {
    Dl_info info{};
    if (p && dladdr(p, &info))
        printf("%s: %s %s\n", what, info.dli_fname ? info.dli_fname : "?", info.dli_sname ? info.dli_sname : "?");
    else
        printf("%s: %p (no dladdr)\n", what, p);
}

static open_fn route(const char* name) {
    if (!strcmp(name, "symbol")) return (open_fn)dlsym(RTLD_DEFAULT, "cuIpcOpenMemHandle");
    int version = !strcmp(name, "proc10000") ? 10000 : 12000;
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status{};
    CUresult r = cuGetProcAddress("cuIpcOpenMemHandle", &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status);
    printf("cuGetProcAddress(%d): %d status %d\n", version, int(r), int(status));
    return (open_fn)fn;
}

static int open_child(const char* how, const char* hex) {
    CUipcMemHandle h{};
    for (size_t i = 0; i < sizeof(h.reserved); ++i) sscanf(hex + 2 * i, "%2hhx", (unsigned char*)&h.reserved[i]);
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) return 10;
    open_fn fn = route(how);
    where(how, (void*)fn);
    if (!fn) return 11;
    CUdeviceptr p = 0;
    CUresult r = fn(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    printf("%s open: %d\n", how, int(r));
    if (r) return 12;
    std::vector<unsigned char> back(kBytes);
    if (cuMemcpyDtoH(back.data(), p, kBytes)) return 13;
    size_t wrong = 0;
    for (size_t i = 0; i < kBytes; ++i) wrong += back[i] != 0x5a;
    printf("%s bytes wrong: %zu\n", how, wrong);
    auto close_fn = (CUresult(*)(CUdeviceptr))dlsym(RTLD_DEFAULT, "cuIpcCloseMemHandle");
    printf("%s close: %d\n", how, close_fn ? int(close_fn(p)) : -1);
    return wrong ? 14 : 0;
}

int main(int argc, char** argv) {
    if (argc == 4 && !strcmp(argv[1], "open")) return open_child(argv[2], argv[3]);
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) return 1;
    where("cuIpcOpenMemHandle (global)", dlsym(RTLD_DEFAULT, "cuIpcOpenMemHandle"));
    where("cuIpcOpenMemHandle_v2 (global)", dlsym(RTLD_DEFAULT, "cuIpcOpenMemHandle_v2"));
    CUdeviceptr a = 0;
    if (cuMemAlloc(&a, kBytes) || cuMemsetD8(a, 0x5a, kBytes) || cuCtxSynchronize()) return 2;
    CUipcMemHandle h{};
    CUresult r = cuIpcGetMemHandle(&h, a);
    printf("export: %d\n", int(r));
    if (r) return 3;
    std::string hex;
    char two[3];
    for (size_t i = 0; i < sizeof(h.reserved); ++i) {
        snprintf(two, sizeof two, "%02x", (unsigned char)h.reserved[i]);
        hex += two;
    }
    int failed = 0;
    for (const char* how : {"symbol", "proc10000", "proc12000"}) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            execl("/proc/self/exe", argv[0], "open", how, hex.c_str(), (char*)nullptr);
            _exit(127);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        printf("child %s: exit %d\n", how, code);
        failed += code != 0;
    }
    printf("free: %d\n", int(cuMemFree(a)));
    printf("routes failed: %d\n", failed);
    return failed ? 4 : 0;
}
