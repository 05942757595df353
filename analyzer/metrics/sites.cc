// Call sites: a log's stacks by id, and live bytes per stack at any moment (sites.h).
#include "metrics/sites.h"

#include "log_reader.h"
#include "report_model.h"
#include "stacks/stack_table.h"
#include "symbolize.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>

namespace gpumem::analysis {

static_assert(k_max_stack_frames >= gpumem::stacks::stack_table::k_max_depth, "the reader keeps what a recorder writes");

bool stack_store::add(uint32_t id, std::vector<frame_view> frames) {
    if (id == 0) return false;
    // Ids are dense in a well-formed log; a hostile id far beyond the stacks seen so far must not
    // make the analyzer allocate for it.
    if (id > by_id_.size() + (size_t(1) << 20)) return false;
    if (id > by_id_.size()) {
        by_id_.resize(id);
        defined_.resize(id, false);
    }
    if (defined_[id - 1]) return false;
    defined_[id - 1] = true;
    by_id_[id - 1] = std::move(frames);
    ++count_;
    return true;
}

const std::vector<frame_view>* stack_store::find(uint32_t id) const {
    if (id == 0 || id > by_id_.size() || !defined_[id - 1]) return nullptr;
    return &by_id_[id - 1];
}

site_tracker::moments& site_tracker::of(int dev) {
    if (last_dev_ < devs_.size() && devs_[last_dev_].dev == dev) return devs_[last_dev_];
    for (last_dev_ = 0; last_dev_ < devs_.size(); ++last_dev_)
        if (devs_[last_dev_].dev == dev) return devs_[last_dev_];
    devs_.emplace_back();
    devs_.back().dev = dev;
    return devs_.back();
}

bool site_tracker::wanted(const lifetime& l, const moments& m) const {
    if (m.peak_seq == std::numeric_limits<uint64_t>::max()) return true;  // the peak is not known: kept
    // The report asks at the device's final peak, which is the peak so far or an event after this
    // free: inside [alloc_seq, free_seq) only when the peak so far is.
    if (l.alloc_seq <= m.peak_seq && m.peak_seq < l.free_seq) return true;
    // And at each OOM listed, all of them before this free.
    auto o = std::lower_bound(m.ooms.begin(), m.ooms.end(), l.alloc_seq);
    return o != m.ooms.end() && *o < l.free_seq;
}

void site_tracker::close(size_t i, int dev, uint64_t seq, uint64_t peak_seq) {
    lifetime& l = all_[i];
    l.free_seq = seq;
    moments& m = of(l.dev);
    if (l.dev == dev) m.peak_seq = peak_seq;  // else a device 128 apart (key()): its peak is not this one
    // The last lifetime, as an allocation freed soon after it was made is: dropped at once.
    if (i + 1 == all_.size() && !wanted(l, m)) all_.pop_back();
}

void site_tracker::compact() {
    // Kept between compactions: a new buffer each time cost a fresh mapping and its page faults
    // (an 11 GB log: 10 s more system time).
    std::vector<size_t>& moved = moved_;
    moved.assign(all_.size(), SIZE_MAX);
    size_t n = 0;
    for (size_t i = 0; i < all_.size(); ++i) {
        const lifetime& l = all_[i];
        if (l.free_seq != std::numeric_limits<uint64_t>::max() && !wanted(l, of(l.dev))) continue;
        moved[i] = n;
        all_[n++] = l;
    }
    all_.resize(n);
    if (all_.capacity() > 4 * std::max(size_t(1) << 16, n)) {  // after a burst of live ones
        all_.shrink_to_fit();
        moved.clear();
        moved.shrink_to_fit();
    }
    for (auto& [k, i] : open_) i = moved[i];  // open lifetimes are always kept
    compact_at_ = std::max(size_t(1) << 16, 2 * n);
}

void site_tracker::on_alloc(uint64_t seq, int dev, uint64_t ptr, bool vmm, uint64_t size, uint32_t stack,
                            uint64_t peak_seq) {
    if (stack) any_stack_ = true;
    uint64_t k = key(dev, ptr, vmm);
    // A second allocation at a live address (a missing free; the rebuild warns): the first ends here.
    if (const size_t* old = open_.find(k)) {
        const size_t at = *old;
        open_.erase(k);  // before close(), which may drop it, and compact(), which renumbers what is open
        close(at, dev, seq, peak_seq);
    }
    if (all_.size() >= compact_at_) compact();
    all_.push_back(lifetime{seq, std::numeric_limits<uint64_t>::max(), size, stack, dev});
    open_.insert_or_assign(k, all_.size() - 1);
    of(dev).peak_seq = peak_seq;
}

void site_tracker::on_free(uint64_t seq, int dev, uint64_t ptr, bool vmm, uint64_t peak_seq) {
    uint64_t k = key(dev, ptr, vmm);
    const size_t* i = open_.find(k);
    if (!i) return;  // a free of something never seen allocated: the rebuild warns about it
    const size_t at = *i;
    open_.erase(k);
    close(at, dev, seq, peak_seq);
}

void site_tracker::on_oom(int dev, uint64_t seq) {
    std::vector<uint64_t>& o = of(dev).ooms;
    if (o.empty() || o.back() < seq) o.push_back(seq);
}

std::vector<site_row> site_tracker::live_at(int dev, uint64_t seq, size_t top) const {
    u64_map<site_row> by_stack;
    for (const lifetime& l : all_) {
        if (l.dev != dev || l.alloc_seq > seq || l.free_seq <= seq) continue;
        site_row& r = by_stack[l.stack];
        r.stack = l.stack;
        r.bytes = l.size > UINT64_MAX - r.bytes ? UINT64_MAX : r.bytes + l.size;  // hostile sizes saturate
        ++r.count;
    }
    std::vector<site_row> rows;
    rows.reserve(by_stack.size());
    for (const auto& e : by_stack) rows.push_back(e.second);
    std::sort(rows.begin(), rows.end(), [](const site_row& a, const site_row& b) {
        return a.bytes != b.bytes ? a.bytes > b.bytes : a.stack < b.stack;
    });
    if (rows.size() > top) rows.resize(top);
    return rows;
}

bool parse_stack_record(std::string_view line, uint32_t& id, std::vector<frame_view>& frames, std::string& error) {
    using json = nlohmann::json;
    json j = json::parse(line.begin(), line.end(), nullptr, false);
    if (j.is_discarded()) return error = "stack record is not valid JSON (an escape such as a lone \\ud800 surrogate?)", false;
    if (!j.is_object()) return error = "stack record is not a JSON object", false;
    auto it = j.find("id");
    if (it == j.end() || !it->is_number_unsigned() || it->get<uint64_t>() == 0 || it->get<uint64_t>() > UINT32_MAX)
        return error = "stack record without a valid \"id\" (an integer from 1)", false;
    id = uint32_t(it->get<uint64_t>());
    auto fr = j.find("frames");
    if (fr == j.end() || !fr->is_array()) return error = "stack record without a \"frames\" array", false;
    frames.clear();
    for (const json& f : *fr) {
        if (!f.is_object()) return error = "a frame of the stack record is not an object", false;
        frame_view v;
        auto str = [&](const char* k, std::string& out) {
            auto m = f.find(k);
            if (m != f.end() && m->is_string()) out = m->get<std::string>();
        };
        str("function", v.function);
        str("file", v.file);
        str("module", v.module);
        if (auto m = f.find("line"); m != f.end() && m->is_number_unsigned()) v.line = m->get<uint64_t>();
        if (auto m = f.find("address"); m != f.end()) {
            if (!m->is_string() || !parse_hex(m->get<std::string>(), v.address))
                return error = "a native frame's \"address\" is not a hex string", false;
        }
        if (v.function.empty() && v.file.empty() && v.module.empty())
            return error = "a frame names neither a function, a file nor a module", false;
        frames.push_back(std::move(v));
    }
    return true;
}

void summarize_sites(process_report& rep, const site_tracker& sites) {
    if (!sites.any_stack()) return;
    for (device_report& d : rep.devices) {
        if (d.requested.peak > 0) {
            d.peak_sites = sites.live_at(d.dev, d.requested.peak_seq, k_flame_stacks);
            d.top_sites.assign(d.peak_sites.begin(), d.peak_sites.begin() + std::ptrdiff_t(std::min(k_top_sites, d.peak_sites.size())));
        }
        d.end_sites = sites.live_at(d.dev, UINT64_MAX - 1, k_flame_stacks);
        d.leak_sites.assign(d.end_sites.begin(), d.end_sites.begin() + std::ptrdiff_t(std::min(k_top_sites, d.end_sites.size())));
        for (oom_report& o : d.ooms) o.sites = sites.live_at(d.dev, o.seq, k_top_sites);
    }
}

void symbolize_stacks(process_report& rep) {
    symbolizer sym;
    rep.stacks.for_each([&](uint32_t, std::vector<frame_view>& frames) {
        for (size_t i = 0; i < frames.size(); ++i) {
            frame_view& f = frames[i];
            if (!f.native() || !f.function.empty()) continue;
            // Every native frame but the innermost one is a return address (the capture leaves
            // gpumem's own frames out, so even the innermost one is a return address into the
            // program's call of the CUDA function).
            symbol_info s = sym.lookup(f.module, f.address, true);
            f.function = s.function;
            f.file = s.file;
            f.line = s.line;
        }
    });
}

}  // namespace gpumem::analysis
