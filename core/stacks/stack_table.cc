// Interns call stacks and writes each one's record once (stack_table.h).
#include "stack_table.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "event_format.h"
#include "native_frames.h"

namespace gpumem::stacks {

namespace {
// Mixes the frames into one 64-bit key (splitmix64 finaliser per word): cheap, and collisions are
// resolved by comparing the frames themselves.
template <typename F>
uint64_t mix(uint64_t h, F word) noexcept {
    h ^= word + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 27);
}
}  // namespace

void stack_table::init(python_frames::symbol_lookup lookup, stack_mode mode, size_t depth) noexcept {
    std::lock_guard<std::mutex> g(mu_);
    mode_ = mode;
    depth_ = depth == 0 ? 1 : (depth > k_max_depth ? k_max_depth : depth);
    if (mode == stack_mode::python || mode == stack_mode::all) py_.init(lookup);
    ready_.store(true, std::memory_order_release);
}

uint32_t stack_table::capture() noexcept {
    if (!ready_.load(std::memory_order_acquire) || mode_ == stack_mode::off) return 0;
    // Python stacks in a process without a usable interpreter (a CUDA C++ program): nothing to walk.
    if (mode_ == stack_mode::python && !py_.active()) return 0;
    // Native and Python frames have a limit of depth_ each: with one shared limit the native
    // frames (about 30 from cudaMalloc up to the interpreter in a PyTorch program, more per
    // nn.Module level) filled it and `all` kept no Python frame.  8 KiB of keys and 2 KiB of return
    // addresses on the caller's stack, not zeroed (py_frame has no initializers): fine for any
    // thread that calls CUDA.
    raw_frame buf[2 * k_max_depth];
    size_t n = 0, n_native = 0;
    if (mode_ == stack_mode::native || mode_ == stack_mode::all) {
        uint64_t pcs[k_max_depth];
        size_t m = capture_native(pcs, depth_);
        for (size_t i = 0; i < m; ++i) buf[n++] = raw_frame{pcs[i], -1, 0};
        n_native = n;
    }
    bool refused = false;
    if ((mode_ == stack_mode::python || mode_ == stack_mode::all) && py_.active())
        n += py_.capture(buf + n, depth_, &refused);
    if (n == 0) {
        // Python frames there but unread, and no native ones kept instead: a stack lost.
        if (refused) lost_.fetch_add(1, std::memory_order_relaxed);
        return 0;
    }
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    for (size_t i = 0; i < n; ++i)
        h = mix(h, buf[i].code ^ (uint64_t(uint32_t(buf[i].offset)) << 40) ^ (uint64_t(buf[i].ident) << 20));
    try {
        {
            std::lock_guard<std::mutex> g(mu_);
            if (n_native == 0) return intern_locked(buf, n, h, nullptr);
            if (uint32_t id = find_locked(buf, n, h)) return id;
            if (full_locked(n)) {  // full: no module lookups for a stack not kept
                lost_.fetch_add(1, std::memory_order_relaxed);
                return 0;
            }
        }
        // A new stack: its native frames' modules are looked up before mu_ is taken again, because
        // dladdr1 takes the loader's lock, which a thread in a library's constructor holds while
        // its own allocation waits for mu_ (two such threads deadlocked with GPUMEM_STACKS=native).
        std::vector<native_place> places(n_native);
        for (size_t i = 0; i < n_native; ++i)
            if (!describe_native(buf[i].code, places[i].module, places[i].offset)) {
                places[i].module.assign(1, '?');  // (= "?" trips GCC 12's -Wrestrict)
                places[i].offset = buf[i].code;
            }
        std::lock_guard<std::mutex> g(mu_);
        return intern_locked(buf, n, h, places.data());
    } catch (...) {  // allocation failure: record no stack rather than fail the program's call
        return 0;
    }
}

uint32_t stack_table::find_locked(const raw_frame* f, size_t n, uint64_t hash) const {
    auto same = [](const raw_frame& a, const raw_frame& b) {
        return a.code == b.code && a.offset == b.offset && a.ident == b.ident;
    };
    auto range = by_key_.equal_range(hash);
    for (auto it = range.first; it != range.second; ++it) {
        const key_entry& k = key_entries_[it->second];
        if (k.count == n && std::equal(f, f + n, keys_.begin() + k.first, same)) return k.id;
    }
    return 0;
}

// Another thread may have interned the same capture since find_locked: looked up again.
uint32_t stack_table::intern_locked(const raw_frame* f, size_t n, uint64_t hash, const native_place* places) {
    if (uint32_t id = find_locked(f, n, hash)) return id;
    if (full_locked(n)) {
        lost_.fetch_add(1, std::memory_order_relaxed);
        return 0;
    }
    uint32_t id = describe_locked(f, n, places);
    if (id == 0) return 0;
    key_entries_.push_back(key_entry{uint32_t(keys_.size()), uint32_t(n), id});
    keys_.insert(keys_.end(), f, f + n);
    by_key_.emplace(hash, uint32_t(key_entries_.size() - 1));
    return id;
}

stack_table::frame_info stack_table::describe_frame_locked(const raw_frame& f, const native_place* place) {
    if (native(f)) {
        const std::string& module = place->module;
        const uint64_t offset = place->offset;
        auto it = module_ids_.find(module);
        uint32_t idx;
        if (it != module_ids_.end()) idx = it->second;
        else {
            modules_.push_back(module);
            idx = uint32_t(modules_.size() - 1);
            module_ids_.emplace(module, idx);
        }
        return frame_info{idx, -1, offset};
    }
    auto it = code_ids_.find({f.code, f.ident});
    uint32_t idx;
    if (it != code_ids_.end()) idx = it->second;
    else {
        py_code_info info;
        if (!py_.describe_code(f.code, info)) info = {"?", "?"};
        codes_.push_back(std::move(info));
        idx = uint32_t(codes_.size() - 1);
        code_ids_.emplace(std::make_pair(f.code, f.ident), idx);
    }
    // PyCode_Addr2Line answers -1 for an instruction without a line (CPython 3.11+): that is line
    // 0, "unknown", since a negative line marks a native frame (format_record would take the
    // frame for one and index modules_ with a code's index).
    int line = py_.line_of(f);
    return frame_info{idx, line < 0 ? 0 : line, 0};
}

// A capture not seen before: describe its frames now, while the capturing thread's frames keep
// their code objects alive, and find or make the stack with that description.
uint32_t stack_table::describe_locked(const raw_frame* f, size_t n, const native_place* places) {
    uint32_t first = uint32_t(frames_.size());
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    for (size_t i = 0; i < n; ++i) {
        frame_info fi = describe_frame_locked(f[i], native(f[i]) ? &places[i] : nullptr);
        frames_.push_back(fi);
        h = mix(h, (uint64_t(fi.text) << 32 | uint32_t(fi.line)) ^ fi.address);
    }
    auto range = by_text_.equal_range(h);
    for (auto it = range.first; it != range.second; ++it) {
        const stack_entry& s = stacks_[it->second - 1];
        if (s.count == n && std::equal(frames_.begin() + first, frames_.end(), frames_.begin() + s.first)) {
            frames_.resize(first);  // already described under that id
            return it->second;
        }
    }
    if (stacks_.size() >= max_stacks_) {
        frames_.resize(first);
        lost_.fetch_add(1, std::memory_order_relaxed);
        return 0;
    }
    stacks_.push_back(stack_entry{first, uint32_t(n)});
    uint32_t id = uint32_t(stacks_.size());
    by_text_.emplace(h, id);
    return id;
}

bool stack_table::format_record(uint32_t id, std::string& out) const noexcept {
    try {
        std::lock_guard<std::mutex> g(mu_);
        if (id == 0 || id > stacks_.size()) return false;
        const stack_entry& e = stacks_[id - 1];
        out += "{\"ev\":\"stack\",\"id\":";
        out += std::to_string(id);
        out += ",\"frames\":[";
        for (uint32_t i = 0; i < e.count; ++i) {
            const frame_info& fr = frames_[e.first + i];
            if (i) out += ',';
            // An index outside its table (a frame mislabelled, as the line -1 of a Python frame once
            // was) writes an unknown frame: this runs inside the program's own CUDA call.
            if (fr.line < 0 ? fr.text >= modules_.size() : fr.text >= codes_.size()) {
                out += "{\"function\":\"?\",\"file\":\"?\",\"line\":0}";
                continue;
            }
            if (fr.line < 0) {
                const std::string& m = modules_[fr.text];
                char hex[24];
                std::snprintf(hex, sizeof hex, "\"0x%llx\"", static_cast<unsigned long long>(fr.address));
                out += "{\"module\":";
                append_json_string(out, m.data(), m.size());
                out += ",\"address\":";
                out += hex;
                out += '}';
                continue;
            }
            const py_code_info& c = codes_[fr.text];
            out += "{\"function\":";
            append_json_string(out, c.function.data(), c.function.size());
            out += ",\"file\":";
            append_json_string(out, c.file.data(), c.file.size());
            out += ",\"line\":";
            out += std::to_string(fr.line);
            out += '}';
        }
        out += "]}\n";
        return true;
    } catch (...) {
        return false;
    }
}

size_t stack_table::size() const noexcept {
    std::lock_guard<std::mutex> g(mu_);
    return stacks_.size();
}


}  // namespace gpumem::stacks
