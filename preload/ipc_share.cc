// Legacy IPC for pooled blocks: cuIpcGetMemHandle hands out a gpumem handle, and an importer under gpumem opens it through a unix socket the exporter serves.
//
// Why: a pooled block is not a driver allocation of its own.  On virtual memory it has no legacy
// handle at all (cuMemCreate memory), and in a shared cuMemAlloc segment the real handle names the
// segment, whose base the importer would get.  So PyTorch multiprocessing with CUDA tensors, or
// CUDA-aware MPI, would fail under the pool where they run without it.  The fallback (docs/pool.md,
// "Sharing memory between processes"):
// - export: the 64-byte handle carries a magic, the exporter's pid and random token (its socket's
//   name) and a random export id; the block is remembered until the program frees it;
// - the exporter's server thread (started at the first export, never before) answers a request
//   for that id from a process of the same user: for a virtual-memory block, every chunk under it
//   exported as a file descriptor (cuMemExportToShareableHandle) and passed with SCM_RIGHTS, in
//   batches made under the pool's lock so that no free releases a chunk meanwhile; for a block in
//   a cuMemAlloc segment, the segment's real legacy handle and the block's offset;
// - import (cuIpcOpenMemHandle in a process that also runs under gpumem): the chunks mapped into
//   fresh address space (cuMemImportFromShareableHandle, cuMemMap, cuMemSetAccess), or the real
//   handle opened, and the block's address returned; cuIpcCloseMemHandle undoes it.
// A handle that is not gpumem's passes through both ways untouched.  An importer without gpumem
// gets the driver's error for an invalid handle.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "core/pool/block_pool.h"
#include "core/pool/critical_section.h"
#include "diag.h"
#include "driver_backend.h"
#include "gpumem_preload.h"

namespace gpumem {

bool pool_exiting() noexcept;  // pool_hooks.cc: process exit has begun, the driver may be going away

namespace {

constexpr char k_magic[8] = {'g', 'p', 'u', 'm', 'e', 'm', 'I', 'P'};
constexpr uint32_t k_version = 1;
constexpr size_t k_batch = 64;  // chunk descriptors per message (SCM_RIGHTS carries at most 253)

// The 64 bytes of a CUipcMemHandle that gpumem hands out.
struct wire_handle {
    char magic[8];
    uint32_t version;
    uint32_t pid;    // the exporter
    uint64_t token;  // the exporter's random token, part of its socket's name
    uint64_t id;     // the export, a random number (a capability: guessing it is the only way in)
    uint64_t size;   // the block's size as the program asked for it
    uint8_t unused[24];
};
static_assert(sizeof(wire_handle) == sizeof(CUipcMemHandle), "a gpumem handle is a CUipcMemHandle");

enum : uint32_t { kind_chunks = 1, kind_legacy = 2 };

// The server's answer: one head, then (kind_chunks) batches of descriptors until `count`.
struct reply_head {
    uint32_t status;  // a CUresult: 0, or why the export cannot be opened
    uint32_t kind;
    uint64_t chunk;   // kind_chunks: bytes per chunk
    uint64_t offset;  // the block's offset in the first chunk, or in the segment (kind_legacy)
    uint64_t count;   // kind_chunks: chunks under the block
    CUipcMemHandle legacy;  // kind_legacy: the segment's real handle
};
struct reply_batch {
    uint32_t status;
    uint32_t n;  // descriptors attached
};

struct export_rec {
    uint64_t id, block, size;
    uint32_t kind;
    uint64_t offset;  // kind_legacy
    CUipcMemHandle legacy;
    const block_pool* pool;
    // The pool's backend: the server thread makes its context current to export the chunks, read
    // when it does (under the pool's lock), never at the export: a destroyed green context's pool
    // goes on in its primary context (pool_hooks.cc, primary_released_by), and the context the
    // export saw is dead then.
    const driver_backend* backend;
};

struct import_rec {
    uint64_t ptr, base, bytes, chunk;
    uint32_t kind;
};

// Every hold of the exporter's and the importer's lock is inside a critical_section, from before
// the lock until after it (as the pools' locks are): some are reached from hooks that take no
// guard (a context's end, a capture's end), and a signal handler that interrupts one and frees a
// pooled block (ipc_block_freed) or closes or opens an IPC handle finds its thread inside gpumem,
// so the pool defers the free and the IPC hooks pass the call to the driver, where it waited for
// the lock its own thread held.

// Exporter state.  Leaked, never destroyed: a free from a late destructor must find it.
struct exporter_state {
    std::mutex mu;
    std::unordered_map<uint64_t, export_rec> exports;  // by block address
    std::atomic<int> live{0};  // exports.size(), read without the lock by every pooled free
    pid_t server_pid = 0;      // the process whose thread serves `listen_fd`
    int listen_fd = -1;
    uint64_t token = 0;
};
exporter_state& ex() noexcept {
    alignas(exporter_state) static unsigned char storage[sizeof(exporter_state)];
    static exporter_state* s = new (storage) exporter_state();
    return *s;
}

bool export_alive(uint64_t block, uint64_t id) noexcept {
    critical_section in;
    std::lock_guard<std::mutex> lk(ex().mu);
    auto it = ex().exports.find(block);
    return it != ex().exports.end() && it->second.id == id;
}

// A real legacy handle open in this process, counted by who opened it: every inner block of one
// cuMemAlloc segment carries the segment's handle, and so may the program itself (for the
// segment's first block), but the driver opens a handle once per context.
struct real_open {
    CUipcMemHandle handle;
    CUcontext ctx;     // the driver opens a handle once per context: records are per context
    int device;
    uint64_t base;
    int gpumem_refs;   // gpumem handles opened on it
    int program_refs;  // the program's own opens of it
};

// The current context and its device (nullptr, -1 when there is none).
CUcontext current_ctx(int* device) noexcept {
    CUcontext c = nullptr;
    auto get = GPUMEM_REAL(cuCtxGetCurrent);
    auto get_device = GPUMEM_REAL(cuCtxGetDevice);
    CUdevice d = -1;
    if (!get || get(&c) != CUDA_SUCCESS) c = nullptr;
    if (!c || !get_device || get_device(&d) != CUDA_SUCCESS) d = -1;
    *device = int(d);
    return c;
}

struct importer_state {
    std::mutex mu;
    std::vector<import_rec> opened;
    std::vector<real_open> reals;
    std::vector<import_rec> closing;  // closed during a stream capture: unmapped once it ends
    std::atomic<int> live{0};  // opened.size() + reals.size() + closing.size()
};
importer_state& im() noexcept {
    alignas(importer_state) static unsigned char storage[sizeof(importer_state)];
    static importer_state* s = new (storage) importer_state();
    return *s;
}
void count_live(importer_state& s) noexcept {
    s.live.store(int(s.opened.size() + s.reals.size() + s.closing.size()), std::memory_order_release);
}

// Opens a real legacy handle, sharing an open that exists already when gpumem is party to it.
// abi: the driver's open the program called (its first ABI or _v2), for the program's own opens;
// gpumem's own use the _v2.  im().mu held.
CUresult open_real(const CUipcMemHandle& h, unsigned flags, bool by_program, drv abi, uint64_t* base) noexcept {
    importer_state& s = im();
    int device = -1;
    const CUcontext ctx = current_ctx(&device);
    for (real_open& r : s.reals)
        if (r.ctx == ctx && !memcmp(&r.handle, &h, sizeof h) && (r.gpumem_refs > 0 || !by_program)) {
            ++(by_program ? r.program_refs : r.gpumem_refs);
            *base = r.base;
            return CUDA_SUCCESS;
        }
    auto open = real<CUresult (*)(CUdeviceptr*, CUipcMemHandle, unsigned int)>(by_program ? abi : drv::cuIpcOpenMemHandle_v2);
    if (!open) return CUDA_ERROR_NOT_INITIALIZED;
    CUdeviceptr p = 0;
    CUresult rc = open(&p, h, flags);
    if (rc != CUDA_SUCCESS) return rc;
    *base = uint64_t(p);
    for (real_open& r : s.reals)
        if (r.ctx == ctx && r.base == *base) {  // the driver counted a second open of the program's itself
            ++(by_program ? r.program_refs : r.gpumem_refs);
            return rc;
        }
    try {
        s.reals.push_back(real_open{h, ctx, device, *base, by_program ? 0 : 1, by_program ? 1 : 0});
    } catch (...) {
        if (!by_program) {  // without a record the close could not find it
            if (auto close_fn = GPUMEM_REAL(cuIpcCloseMemHandle)) close_fn(p);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    count_live(s);
    return rc;
}

// Closes one open of real handle `base`; the driver's close once nobody holds it.  False when no
// open of it is known (the caller passes the call through).  im().mu held.
bool close_real(uint64_t base, bool by_program, CUresult* rc) noexcept {
    importer_state& s = im();
    for (size_t i = 0; i < s.reals.size(); ++i) {
        real_open& r = s.reals[i];
        if (r.base != base) continue;
        int& mine = by_program ? r.program_refs : r.gpumem_refs;
        if (mine == 0) return false;
        --mine;
        *rc = CUDA_SUCCESS;
        // The program's own opens are the driver's to count, unless gpumem shares the mapping.
        const bool last = r.gpumem_refs == 0 && r.program_refs == 0;
        if (last || (by_program && r.gpumem_refs == 0)) {
            auto close_fn = GPUMEM_REAL(cuIpcCloseMemHandle);
            *rc = close_fn ? close_fn(CUdeviceptr(base)) : CUDA_ERROR_NOT_INITIALIZED;
        }
        if (last) {
            s.reals[i] = s.reals.back();
            s.reals.pop_back();
        }
        count_live(s);
        return true;
    }
    return false;
}

uint64_t random_u64() noexcept {
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != ssize_t(sizeof v)) {
        struct timespec ts{};
        clock_gettime(CLOCK_MONOTONIC, &ts);
        v = (uint64_t(ts.tv_nsec) << 32) ^ uint64_t(ts.tv_sec) ^ (uint64_t(getpid()) << 48) ^ uint64_t(uintptr_t(&v));
    }
    return v ? v : 1;
}

// The abstract socket name of exporter (pid, token): nothing on the file system to clean up.
socklen_t socket_name(sockaddr_un* a, uint32_t pid, uint64_t token) noexcept {
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "gpumem-ipc/%u/%016llx", pid,
                     static_cast<unsigned long long>(token));
    return socklen_t(offsetof(sockaddr_un, sun_path) + 1 + size_t(n));
}

void set_timeouts(int fd, int seconds) noexcept {
    timeval tv{};
    tv.tv_sec = seconds;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

bool send_msg(int sock, const void* data, size_t n, const int* fds, size_t nfds) noexcept {
    iovec iov{const_cast<void*>(data), n};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * k_batch)];
    if (nfds) {
        m.msg_control = ctl;
        m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        cmsghdr* c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
    }
    ssize_t r;
    do r = sendmsg(sock, &m, MSG_NOSIGNAL);
    while (r < 0 && errno == EINTR);
    return r == ssize_t(n);
}

// Receives one message of exactly n bytes; its descriptors (at most k_batch) go to fds/nfds.
bool recv_msg(int sock, void* data, size_t n, int* fds, size_t* nfds) noexcept {
    iovec iov{data, n};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * k_batch)];
    memset(ctl, 0, sizeof ctl);
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    ssize_t r;
    do r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
    while (r < 0 && errno == EINTR);
    size_t got = 0;
    if (nfds) *nfds = 0;
    // On an error (a timeout, a reset) the kernel writes neither the control length nor the
    // flags: parsing then would read stale bytes as descriptors, and close someone else's.
    if (r < 0) return false;
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; ++i) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (fds && got < k_batch) fds[got++] = fd;
            else close(fd);
        }
    }
    if (nfds) *nfds = got;
    return r == ssize_t(n) && !(m.msg_flags & (MSG_TRUNC | MSG_CTRUNC));
}

// ---------------------------------------------------------------------------------------------
// The exporter's server.

struct batch_ctx {
    int fds[k_batch];
    size_t n = 0;
    CUresult err = CUDA_SUCCESS;
    uint64_t id = 0;  // the export being served (0: ipc_export's own probe)
    uint64_t block = 0;
    const driver_backend* backend = nullptr;  // the server's: its context current for the batch
};

// The pool's context current on the server thread for one batch (pushed, popped at the end), read
// under the pool's lock, which a green context's pool holds from before the driver's destruction
// until it works in the primary context: before, the context recorded at the export was pushed,
// the destroyed green context's own (emu_pool_app green-ipc-late: dead_green_made_current 1).
struct pool_context_current {
    bool on = false;
    explicit pool_context_current(const driver_backend* backend) noexcept {
        auto push = GPUMEM_REAL(cuCtxPushCurrent_v2);
        const CUcontext c = backend ? backend->context() : nullptr;
        on = c && push && GPUMEM_REAL(cuCtxPopCurrent_v2) && push(c) == CUDA_SUCCESS;
    }
    ~pool_context_current() {
        CUcontext c = nullptr;
        if (on) GPUMEM_REAL(cuCtxPopCurrent_v2)(&c);
    }
};

// Runs under the owning pool's lock: the chunks cannot be released while they are exported.
bool export_batch(void* ctx, const uint64_t* handles, size_t n) {
    auto* b = static_cast<batch_ctx*>(ctx);
    // The export must still be the one asked for: a free ends it before the pool can hand the
    // address out again, and the pool's lock, held here, keeps it so for this batch.
    if (b->id && !export_alive(b->block, b->id)) {
        b->err = CUDA_ERROR_INVALID_VALUE;
        return false;
    }
    auto exp = GPUMEM_REAL(cuMemExportToShareableHandle);
    if (!exp) {
        b->err = CUDA_ERROR_NOT_SUPPORTED;
        return false;
    }
    const pool_context_current in_pool_context(b->backend);
    for (size_t i = 0; i < n; ++i) {
        int fd = -1;
        CUresult r = exp(&fd, CUmemGenericAllocationHandle(handles[i]), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (r != CUDA_SUCCESS) {
            b->err = r;
            for (size_t k = 0; k < b->n; ++k) close(b->fds[k]);
            b->n = 0;
            return false;
        }
        fcntl(fd, F_SETFD, FD_CLOEXEC);  // an exec meanwhile must not carry GPU memory away
        b->fds[b->n++] = fd;
    }
    return true;
}

void serve_one(int c) noexcept {
    set_timeouts(c, 10);  // a stuck importer must not stop the server for good
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return;
    if (cred.uid != geteuid() && cred.uid != 0) return;  // only the program's own user (or root)
    uint64_t id = 0;
    if (!recv_msg(c, &id, sizeof id, nullptr, nullptr)) return;
    export_rec rec{};
    bool found = false;
    if (pool_exiting()) return;  // the driver may be going away: no call into it now
    {
        critical_section in;
        std::lock_guard<std::mutex> lk(ex().mu);
        for (const auto& [block, e] : ex().exports)
            if (e.id == id) {
                rec = e;
                found = true;
                break;
            }
    }
    reply_head head{};
    if (!found) {
        head.status = CUDA_ERROR_INVALID_VALUE;  // freed since, or never exported
        send_msg(c, &head, sizeof head, nullptr, 0);
        return;
    }
    head.kind = rec.kind;
    if (rec.kind == kind_legacy) {
        head.offset = rec.offset;
        head.legacy = rec.legacy;
        send_msg(c, &head, sizeof head, nullptr, 0);
        return;
    }
    block_pool::chunk_view view{};
    for (size_t from = 0;; ) {
        batch_ctx b;
        b.id = rec.id;
        b.block = rec.block;
        b.backend = rec.backend;  // its context current for each batch (export_batch)
        const bool ok = !pool_exiting() && rec.pool->visit_block_chunks(rec.block, from, k_batch, &view, export_batch, &b);
        if (from == 0) {
            head.status = ok ? CUDA_SUCCESS : (b.err ? b.err : CUDA_ERROR_INVALID_VALUE);
            head.chunk = view.chunk;
            head.offset = view.offset;
            head.count = view.count;
            if (!send_msg(c, &head, sizeof head, nullptr, 0) || !ok) {
                for (size_t k = 0; k < b.n; ++k) close(b.fds[k]);
                return;
            }
        }
        reply_batch rb{ok ? 0u : uint32_t(b.err ? b.err : CUDA_ERROR_INVALID_VALUE), uint32_t(b.n)};
        const bool sent = send_msg(c, &rb, sizeof rb, b.fds, b.n);
        for (size_t k = 0; k < b.n; ++k) close(b.fds[k]);  // the importer holds its own copies now
        if (!sent || !ok) return;
        from += b.n;
        if (from >= view.count) return;
    }
}

void* serve(void* arg) {
    const int lfd = int(reinterpret_cast<intptr_t>(arg));
    for (;;) {
        int c = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EBADF || errno == EINVAL || errno == ENOTSOCK) return nullptr;  // closed (after fork)
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) usleep(10000);
            continue;
        }
        serve_one(c);
        close(c);
    }
}

// Starts this process's server if it has none (a fork child inherits the flag, not the thread).
// ex().mu held.
bool ensure_server() noexcept {
    exporter_state& s = ex();
    if (s.server_pid == getpid() && s.listen_fd >= 0) return true;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    const uint64_t token = random_u64();
    sockaddr_un a;
    socklen_t alen = socket_name(&a, uint32_t(getpid()), token);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), alen) != 0 || listen(fd, 64) != 0) {
        close(fd);
        return false;
    }
    // The thread takes no signal meant for the program: it blocks all of them.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 << 10);
    pthread_t t;
    const int rc = pthread_create(&t, &attr, serve, reinterpret_cast<void*>(intptr_t(fd)));
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (rc != 0) {
        close(fd);
        return false;
    }
    s.listen_fd = fd;
    s.server_pid = getpid();
    s.token = token;
    return true;
}

// ---------------------------------------------------------------------------------------------
// The importer.

int connect_to(const wire_handle& w) noexcept {
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    set_timeouts(fd, 30);
    sockaddr_un a;
    socklen_t alen = socket_name(&a, w.pid, w.token);
    int r;
    do r = connect(fd, reinterpret_cast<sockaddr*>(&a), alen);
    while (r < 0 && errno == EINTR);
    if (r != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

// Unmaps chunks [0, mapped) of an imported range and frees its address space.
void unmap_import(uint64_t base, uint64_t chunk, uint64_t mapped, uint64_t reserved) noexcept {
    auto unmap = GPUMEM_REAL(cuMemUnmap);
    auto va_free = GPUMEM_REAL(cuMemAddressFree);
    for (uint64_t i = 0; unmap && i < mapped; ++i) unmap(CUdeviceptr(base + i * chunk), size_t(chunk));
    if (va_free && reserved) va_free(CUdeviceptr(base), size_t(reserved));
}

// Maps the exported chunks, batch by batch as they arrive.  0 and *base, or a CUresult.
CUresult import_chunks(int sock, const reply_head& head, uint64_t* base_out) noexcept {
    auto reserve = GPUMEM_REAL(cuMemAddressReserve);
    auto import_fd = GPUMEM_REAL(cuMemImportFromShareableHandle);
    auto map = GPUMEM_REAL(cuMemMap);
    auto release = GPUMEM_REAL(cuMemRelease);
    auto set_access = GPUMEM_REAL(cuMemSetAccess);
    auto get_device = GPUMEM_REAL(cuCtxGetDevice);
    if (!reserve || !import_fd || !map || !release || !set_access || !get_device) return CUDA_ERROR_NOT_SUPPORTED;
    if (!head.chunk || !head.count || head.count > (uint64_t(1) << 40) / head.chunk) return CUDA_ERROR_INVALID_VALUE;
    CUdevice dev = 0;
    if (CUresult r = get_device(&dev)) return r;
    const uint64_t bytes = head.count * head.chunk;
    CUdeviceptr base = 0;
    // Aligned to the largest power of two dividing the chunk: cuMemAddressReserve takes only a
    // power of two, and a GPUMEM_POOL_CHUNK chunk is whole granules (20 MiB: ten), so this is
    // still a multiple of the granularity that cuMemMap needs.
    const uint64_t align = head.chunk & (~head.chunk + 1);
    if (CUresult r = reserve(&base, size_t(bytes), size_t(align), 0, 0)) return r;
    uint64_t mapped = 0;
    CUresult err = CUDA_SUCCESS;
    while (mapped < head.count && err == CUDA_SUCCESS) {
        reply_batch rb{};
        int fds[k_batch];
        size_t nfds = 0;
        if (!recv_msg(sock, &rb, sizeof rb, fds, &nfds) || rb.status != 0 || rb.n != nfds || nfds == 0 ||
            mapped + nfds > head.count) {
            err = rb.status ? CUresult(rb.status) : CUDA_ERROR_INVALID_VALUE;
            for (size_t k = 0; k < nfds; ++k) close(fds[k]);
            break;
        }
        for (size_t k = 0; k < nfds; ++k) {
            if (err == CUDA_SUCCESS) {
                CUmemGenericAllocationHandle h = 0;
                err = import_fd(&h, reinterpret_cast<void*>(uintptr_t(fds[k])), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
                if (err == CUDA_SUCCESS) {
                    err = map(base + mapped * head.chunk, size_t(head.chunk), 0, h, 0);
                    release(h);  // the mapping keeps the memory; nothing else needs the handle
                    if (err == CUDA_SUCCESS) ++mapped;
                }
            }
            close(fds[k]);
        }
    }
    if (err == CUDA_SUCCESS) {
        const CUmemAccessDesc access = rw_access(int(dev));
        err = set_access(base, size_t(bytes), &access, 1);
    }
    if (err != CUDA_SUCCESS) {
        unmap_import(uint64_t(base), head.chunk, mapped, bytes);
        return err;
    }
    *base_out = uint64_t(base);
    return CUDA_SUCCESS;
}

// Closes imported chunk mappings for good.  cuMemUnmap does not wait for device work, as the
// driver's close of a legacy mapping does: the work this process queued on them finishes first.
void unmap_imports(const import_rec* recs, size_t n) noexcept {
    if (n == 0) return;
    if (auto sync = GPUMEM_REAL(cuCtxSynchronize)) sync();
    for (size_t i = 0; i < n; ++i) unmap_import(recs[i].base, recs[i].chunk, recs[i].bytes / recs[i].chunk, recs[i].bytes);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Called by pool_hooks.cc.

// cuIpcGetMemHandle of an allocated pooled block (any address inside it names it, as a driver
// allocation's does) that the real handle cannot name.
CUresult ipc_export(CUipcMemHandle* h, const block_pool& pool, const driver_backend& backend, const block_pool::block_info& bi) noexcept {
    static std::atomic<bool> said{false};
    export_rec rec{};
    rec.block = bi.block;
    rec.size = bi.requested;
    rec.pool = &pool;
    rec.backend = &backend;
    exporter_state& s = ex();
    auto fill = [&](const export_rec& e) {
        wire_handle w{};
        memcpy(w.magic, k_magic, sizeof k_magic);
        w.version = k_version;
        w.pid = uint32_t(getpid());
        w.token = s.token;
        w.id = e.id;
        w.size = e.size;
        memcpy(h, &w, sizeof w);
    };
    {
        // Exported before (PyTorch asks at every send): the same handle, without trying the chunks again.
        critical_section in;
        std::lock_guard<std::mutex> lk(s.mu);
        auto it = s.exports.find(rec.block);
        if (it != s.exports.end() && it->second.size == rec.size && s.server_pid == getpid()) {
            fill(it->second);
            return CUDA_SUCCESS;
        }
    }
    if (bi.vmm) {
        // Only chunks made with a shareable handle type can be exported (a driver that refused
        // the type once gets plain chunks from then on): try every chunk under the block now, so
        // the program learns from this call, not from the importer's, when it cannot be shared.
        block_pool::chunk_view view{};
        for (size_t from = 0;;) {
            batch_ctx b;
            const bool ok = pool.visit_block_chunks(bi.block, from, k_batch, &view, export_batch, &b);
            for (size_t k = 0; k < b.n; ++k) close(b.fds[k]);
            if (!ok) {
                GPUMEM_WARN_ONCE(said, "cuIpcGetMemHandle on a pooled block of virtual memory: the driver cannot export "
                                "its chunks ({}); run with GPUMEM_POOL_VMM=off to share memory between processes",
                          int(b.err));
                return CUDA_ERROR_INVALID_VALUE;
            }
            from += b.n;
            if (from >= view.count) break;
        }
        rec.kind = kind_chunks;
    } else {
        auto get = GPUMEM_REAL(cuIpcGetMemHandle);
        if (!get) return CUDA_ERROR_NOT_INITIALIZED;
        if (CUresult r = get(&rec.legacy, CUdeviceptr(bi.segment))) return r;
        rec.kind = kind_legacy;
        rec.offset = bi.block - bi.segment;
    }
    critical_section in;
    std::lock_guard<std::mutex> lk(s.mu);
    if (!ensure_server()) {
        GPUMEM_WARN_ONCE(said, "cuIpcGetMemHandle on a pooled block: no socket to share it through ({})", errno);
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    const export_rec* known = nullptr;
    if (auto it = s.exports.find(rec.block); it != s.exports.end()) known = &it->second;  // the same handle again
    if (!known) {
        rec.id = random_u64();
        try {
            known = &s.exports.emplace(rec.block, rec).first->second;
        } catch (...) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        s.live.store(int(s.exports.size()), std::memory_order_release);
    }
    fill(*known);
    return CUDA_SUCCESS;
}

// A pooled block was freed: its export, if any, ends (an importer that asks later gets an error).
void ipc_block_freed(uint64_t block) noexcept {
    exporter_state& s = ex();
    if (s.live.load(std::memory_order_acquire) == 0) return;
    critical_section in;
    std::lock_guard<std::mutex> lk(s.mu);
    s.exports.erase(block);
    s.live.store(int(s.exports.size()), std::memory_order_release);
}

// cuIpcOpenMemHandle, by either ABI (abi: the one called).  *handled false: not a gpumem handle,
// the driver's call.
CUresult ipc_open(CUdeviceptr* p, const CUipcMemHandle& h, unsigned flags, drv abi, bool* handled) noexcept {
    static std::atomic<bool> said{false};
    wire_handle w;
    memcpy(&w, &h, sizeof w);
    *handled = true;
    if (memcmp(w.magic, k_magic, sizeof k_magic) != 0) {
        // The driver's own handle: the driver's open, counted only so that a gpumem handle naming
        // the same segment later shares it.
        if (!p) return CUDA_ERROR_INVALID_VALUE;
        critical_section in;
        std::lock_guard<std::mutex> lk(im().mu);
        uint64_t base = 0;
        CUresult rc = open_real(h, flags, true, abi, &base);
        if (rc == CUDA_SUCCESS) *p = CUdeviceptr(base);
        return rc;
    }
    if (!p || w.version != k_version) return CUDA_ERROR_INVALID_VALUE;
    const int sock = connect_to(w);
    if (sock < 0) {
        GPUMEM_WARN_ONCE(said, "cuIpcOpenMemHandle of a gpumem handle: its exporter cannot be reached, exited? ({})", errno);
        return CUDA_ERROR_INVALID_VALUE;
    }
    reply_head head{};
    CUresult r = CUDA_SUCCESS;
    if (!send_msg(sock, &w.id, sizeof w.id, nullptr, 0) || !recv_msg(sock, &head, sizeof head, nullptr, nullptr))
        r = CUDA_ERROR_INVALID_VALUE;
    else if (head.status)
        r = CUresult(head.status);
    import_rec rec{};
    rec.kind = head.kind;
    if (r == CUDA_SUCCESS && head.kind == kind_legacy) {
        critical_section in;
        std::lock_guard<std::mutex> lk(im().mu);
        r = open_real(head.legacy, flags, false, abi, &rec.base);
        rec.ptr = rec.base + head.offset;
    } else if (r == CUDA_SUCCESS && head.kind == kind_chunks) {
        r = import_chunks(sock, head, &rec.base);
        rec.ptr = rec.base + head.offset;
        rec.bytes = head.count * head.chunk;
        rec.chunk = head.chunk;
    } else if (r == CUDA_SUCCESS) {
        r = CUDA_ERROR_INVALID_VALUE;
    }
    close(sock);
    if (r != CUDA_SUCCESS) {
        GPUMEM_WARN_ONCE(said, "cuIpcOpenMemHandle of a gpumem handle failed ({})", int(r));
        return r;
    }
    importer_state& s = im();
    critical_section in;
    std::lock_guard<std::mutex> lk(s.mu);
    try {
        s.opened.push_back(rec);
    } catch (...) {
        // Without a record the close could not undo it: undo it now.
        CUresult ignored;
        if (rec.kind == kind_chunks) unmap_import(rec.base, rec.chunk, rec.bytes / rec.chunk, rec.bytes);
        else close_real(rec.base, false, &ignored);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    count_live(s);
    *p = CUdeviceptr(rec.ptr);
    return CUDA_SUCCESS;
}

// cuIpcCloseMemHandle.  *handled false: not a pointer gpumem opened or counted, the driver's call.
CUresult ipc_close(CUdeviceptr p, bool* handled) noexcept {
    importer_state& s = im();
    *handled = false;
    if (s.live.load(std::memory_order_acquire) == 0) return CUDA_SUCCESS;
    critical_section in;
    std::unique_lock<std::mutex> lk(s.mu);
    import_rec rec{};
    for (size_t i = 0; i < s.opened.size(); ++i)
        if (s.opened[i].ptr == uint64_t(p)) {
            rec = s.opened[i];
            s.opened[i] = s.opened.back();
            s.opened.pop_back();
            *handled = true;
            if (rec.kind == kind_chunks && capture_active()) {
                // The unmap must wait for this process's work first, which a capture forbids: it
                // happens when the capture ends (ipc_capture_ended).  The mapping stays until then.
                try {
                    s.closing.push_back(rec);
                } catch (...) {
                    s.opened.push_back(rec);  // capacity it had a moment ago: cannot throw
                    count_live(s);
                    return CUDA_ERROR_OUT_OF_MEMORY;
                }
                count_live(s);
                return CUDA_SUCCESS;
            }
            break;
        }
    CUresult rc = CUDA_SUCCESS;
    if (!*handled) {
        *handled = close_real(uint64_t(p), true, &rc);  // the program's own open of a real handle
        count_live(s);
        return rc;
    }
    if (rec.kind == kind_legacy) {
        if (!close_real(rec.base, false, &rc)) rc = CUDA_ERROR_INVALID_VALUE;
        count_live(s);
        return rc;
    }
    count_live(s);
    lk.unlock();
    unmap_imports(&rec, 1);
    return CUDA_SUCCESS;
}

// The last capture ended: the unmaps of closes made during it.
void ipc_capture_ended() noexcept {
    importer_state& s = im();
    // A capture ended by a signal handler inside a gpumem lock: the lock may be this thread's, so
    // the unmaps wait for the next capture's end.
    if (s.live.load(std::memory_order_acquire) == 0 || critical_section::active()) return;
    std::vector<import_rec> todo;
    {
        critical_section in;
        std::lock_guard<std::mutex> lk(s.mu);
        if (s.closing.empty() || capture_active()) return;
        todo.swap(s.closing);
        count_live(s);
    }
    unmap_imports(todo.data(), todo.size());
}

// A context died (ctx), or a device's primary context was reset (ctx null, device): what was
// opened in it went with it.  Forgotten, never closed: the driver has already let go.
void ipc_context_gone(CUcontext ctx, int device) noexcept {
    importer_state& s = im();
    if (s.live.load(std::memory_order_acquire) == 0) return;
    critical_section in;
    std::lock_guard<std::mutex> lk(s.mu);
    for (size_t i = 0; i < s.reals.size();)
        if (ctx ? s.reals[i].ctx == ctx : s.reals[i].device == device) {
            const uint64_t base = s.reals[i].base;
            for (size_t k = 0; k < s.opened.size();)  // gpumem handles opened on that real handle
                if (s.opened[k].kind == kind_legacy && s.opened[k].base == base) {
                    s.opened[k] = s.opened.back();
                    s.opened.pop_back();
                } else {
                    ++k;
                }
            s.reals[i] = s.reals.back();
            s.reals.pop_back();
        } else {
            ++i;
        }
    count_live(s);
}

// The pool of a context that died: its blocks' exports end with it (a later block at the same
// address is another allocation).
void ipc_pool_dropped(const block_pool* pool) noexcept {
    exporter_state& s = ex();
    if (s.live.load(std::memory_order_acquire) == 0) return;
    critical_section in;
    std::lock_guard<std::mutex> lk(s.mu);
    for (auto it = s.exports.begin(); it != s.exports.end();)
        it = it->second.pool == pool ? s.exports.erase(it) : std::next(it);
    s.live.store(int(s.exports.size()), std::memory_order_release);
}

// A fork child: the server thread is the parent's, and so are the exports (the child's pool
// forgets the parent's blocks).  The child starts its own server at its first export.
void ipc_after_fork() noexcept {
    // A parent thread may have held a lock, or been inside a container, at the fork: fresh locks
    // and fresh containers, the old ones leaked rather than walked.
    exporter_state& s = ex();
    new (&s.mu) std::mutex();
    if (s.listen_fd >= 0) close(s.listen_fd);
    s.listen_fd = -1;
    s.server_pid = 0;
    new (&s.exports) std::unordered_map<uint64_t, export_rec>();
    s.live.store(0);
    importer_state& i = im();  // the parent's mappings are not the child's
    new (&i.mu) std::mutex();
    new (&i.opened) std::vector<import_rec>();
    new (&i.reals) std::vector<real_open>();
    new (&i.closing) std::vector<import_rec>();
    i.live.store(0);
}

}  // namespace gpumem
