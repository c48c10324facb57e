// observer.cpp: the live runtime's C++ observer. A global RecordFunction callback sees every ATen op on every
// thread (user threads, the autograd engine's threads) before its kernels are queued, and after it returned;
// for each op that a TorchDispatchMode would see and that launches a kernel, it pushes one run of records into
// a lock-free ring (uvmobs.h): op id, execution id, phase, FLOPs, and the (address, length, read/write) ranges
// of its tensor arguments and outputs. The planner thread (uvmprefetch/runtime/planner.py) drains the ring.
//
// What "an op a TorchDispatchMode would see" means here (the Python recorder, trace/recorder.py, is the
// reference, and tests/unit/test_native_observer.py holds the two to the same events):
// - RecordFunction fires for every dispatcher call, nested ones included; the dispatch mode sees the calls
//   that reach the Python dispatch key. A CompositeImplicitAutograd op decomposes above that key (its parts
//   are seen, not itself), and so does an op's autocast wrapper (the casts and the inner call are seen);
//   everything called from inside a kernel below the key is not seen. So: an op is "mode-level" when no
//   mode-level op is running on this thread and it is not one of those pass-through wrappers.
// - Kernel-launching: not a view, not an allocation-only or metadata op (NO_KERNEL, handed over from Python),
//   not in a marker namespace.
// - The shape key and its execution id follow the dispatch mode's arguments: positional arguments up to the
//   last one that differs from its default, then keyword-only ones that differ from their defaults
//   (torch/csrc/autograd/python_variable.cpp, parseIValuesToPyArgsKwargs); dtype/layout/memory-format ints are
//   not ints there. The id is blake2b-64 of "<name>|<repr(key)>", as trace.format.exec_id_of computes it.
// - Phase: optimizer between the optimizer-step hooks (a flag set from Python), backward while the autograd
//   engine evaluates a node (torch::autograd::get_current_node(), what torch._C._current_autograd_node()
//   returns; a BACKWARD_FUNCTION-scope callback would miss the gradient accumulation the engine runs outside
//   the node's own scope), forward otherwise.
// - Rules kept here because they only filter: ops with no tensor on the observed device are dropped, and in
//   the optimizer phase ops on 0-dim tensors only (AdamW's step counters: host work in a GPU run).
//
// Nothing here may change what an op computes or kill the program: every callback body is wrapped; an
// exception switches the observer off (uvmobs_error says why) and the op goes on untouched.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/function.h>  // get_current_node (a shared_ptr before 2.13, an intrusive_ptr since)
#include <torch/version.h>

#include <chrono>
#include <thread>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "blake2b.h"
#include "uvmobs.h"
#include "uvmring.h"


#define UVM_EXPORT extern "C" __attribute__((visibility("default")))

// The Python name of a dtype (str(torch.<dtype>)[6:]): execution ids hash it.
const char* uvm_py_dtype_name(c10::ScalarType t);

namespace {

using uvm::OpRec;
constexpr int kAbi = 1;
constexpr size_t kMaxKey = 4096;  // key entries per op beyond which the execution id is not cached

uvm::Ring<OpRec, 17> g_ring;  // 131072 records (5 MiB)

enum State : int { kOff = 0, kDormant = 1, kActive = 2, kFailed = 3 };
std::atomic<int> g_state{kOff};
std::atomic<bool> g_optimizer{false};
std::thread::id g_main_thread;  // the thread that started the observer (the training loop's, in most programs)
std::atomic<bool> g_timing{false};
std::atomic<int64_t> g_fail_after{-1};  // tests: throw inside the callback once this many ops were recorded
c10::DeviceType g_dev = c10::DeviceType::CPU;
at::CallbackHandle g_full = 0;
std::mutex g_mu;  // start/stop/switch, the op table's insertions, the error text
std::string g_error;
std::unordered_set<std::string> g_no_kernel, g_skip_ns;

std::atomic<uint64_t> g_recorded{0};     // op runs pushed (or dropped by a full ring)
std::atomic<uint64_t> g_callback_ns{0};  // time inside the active callbacks (with timing on)
std::atomic<uint64_t> g_gate_late{0}, g_gate_fault{0}, g_gate_waits{0};

// The planner's turn (uvmobs_turn). A Python thread that lets the GIL go gets it back only when the thread that
// holds it next lets go and it wins the race; a training loop of small ops lets go and takes it again around every
// op (the bindings release it around the dispatcher call) and nearly always wins, so a planner thread waits for the
// GIL for milliseconds after each call that released it (its policy's nogil kernels included) and plans almost
// nothing, while each hand-over it does win costs the training thread a wait for the scheduler. So the planner
// asks for a turn: while it is set, the training thread (the one that started the observer) parks in the start
// and end callbacks, where it holds no GIL, until the planner gives the turn back or the turn is kTurnMax old (a
// burst that runs long, the first one loading the policy's kernels, then holds the training thread back no
// further: it races for the GIL as without turns; 5 ms made the moves case of bench/runtime_overhead.py slower:
// the training thread then raced the planner's longer bursts for the GIL). The planner gets
// the GIL at once, plans a burst, gives the turn back and rests; the parked time is counted (the training
// thread's whole wait on the planner) and paces the planner's rests.
std::atomic<int> g_turn{0};
std::atomic<uint64_t> g_parked_ns{0}, g_parks{0};
std::atomic<int> g_parked_now{0};  // threads parked right now
constexpr int64_t kTurnMax = 20'000'000;  // ns
std::atomic<int64_t> g_turn_since{0};      // steady-clock ns when the turn was taken

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}
at::CallbackHandle g_light = 0;  // a callback without inputs: the turn only, while the full one is off

void park() {
    if (g_turn.load(std::memory_order_acquire) == 0 || std::this_thread::get_id() != g_main_thread) return;
    const int64_t end = g_turn_since.load(std::memory_order_relaxed) + kTurnMax;
    const int64_t t0 = now_ns();
    if (t0 >= end) return;
    g_parked_now.fetch_add(1);
    int64_t t = t0;
    while (g_turn.load(std::memory_order_acquire) != 0 && t < end) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
        t = now_ns();
    }
    g_parked_ns.fetch_add(uint64_t(t - t0), std::memory_order_relaxed);
    g_parks.fetch_add(1, std::memory_order_relaxed);
    g_parked_now.fetch_sub(1);
}

void fail(const char* where, const char* what) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_error.empty()) g_error = std::string(where) + ": " + what;
    g_state.store(kFailed, std::memory_order_relaxed);
    g_turn.store(0);
}

// ------------------------------------------------------------------------------------------------ op facts
struct ArgInfo {
    bool write = false;     // alias_info()->isWrite(): the op writes this argument
    bool enum_int = false;  // ScalarType / Layout / MemoryFormat (or Optional of one): not an int in Python
    bool has_default = false;
    c10::IValue def;
};

enum FlopKind : uint8_t { kNoFlops, kMm, kAddmm, kBmm, kBaddbmm, kScaledMm, kConv, kConvBackward, kSdpa, kSdpaBwd };

struct OpInfo {
    const char* key = nullptr;  // fn.name() of this op: the schema's own string, stable while it is registered
    std::string base;           // "aten::add" (to check the key on a hit)
    std::string name;           // "aten::add.Tensor" (OpOverload.name())
    uint32_t id = 0;
    bool launches = false;      // not a view / allocation-only / metadata op
    bool decomposes = false;    // CompositeImplicitAutograd for the observed backend
    bool autocast = false;      // has an autocast kernel for the observed device
    int kwarg_only_start = 0;
    std::vector<ArgInfo> args;
    FlopKind flop = kNoFlops;
};

constexpr size_t kTable = 1 << 14;
std::atomic<OpInfo*> g_table[kTable];
std::vector<OpInfo*> g_ops;  // by id (under g_mu)

size_t slot_of(const void* p) { return (reinterpret_cast<uintptr_t>(p) >> 4) * 0x9E3779B97F4A7C15ULL >> 50; }

FlopKind flop_kind(const std::string& base) {
    static const std::unordered_map<std::string, FlopKind> kinds = {
        {"aten::mm", kMm}, {"aten::addmm", kAddmm}, {"aten::bmm", kBmm}, {"aten::baddbmm", kBaddbmm},
        {"aten::_scaled_mm", kScaledMm}, {"aten::convolution", kConv}, {"aten::_convolution", kConv},
        {"aten::cudnn_convolution", kConv}, {"aten::convolution_overrideable", kConv},
        {"aten::convolution_backward", kConvBackward},
        {"aten::_scaled_dot_product_efficient_attention", kSdpa},
        {"aten::_scaled_dot_product_flash_attention", kSdpa}, {"aten::_scaled_dot_product_cudnn_attention", kSdpa},
        {"aten::_scaled_dot_product_efficient_attention_backward", kSdpaBwd},
        {"aten::_scaled_dot_product_flash_attention_backward", kSdpaBwd},
        {"aten::_scaled_dot_product_cudnn_attention_backward", kSdpaBwd}};
    auto it = kinds.find(base);
    return it == kinds.end() ? kNoFlops : it->second;
}

OpInfo* make_info(const char* key, const c10::OperatorName& opname) {
    auto handle = c10::Dispatcher::singleton().findSchema(opname);
    if (!handle) return nullptr;
    const c10::FunctionSchema& schema = handle->schema();
    auto* info = new OpInfo();
    info->key = key;
    info->base = opname.name;
    info->name = opname.name + (opname.overload_name.empty() ? "" : "." + opname.overload_name);
    // OpOverload.is_view: some argument is aliased, and none written
    int aliased = 0;
    bool written = false;
    for (const auto& a : schema.arguments()) {
        ArgInfo ai;
        if (const auto* al = a.alias_info()) {
            ++aliased;
            ai.write = al->isWrite();
            written = written || al->isWrite();
        }
        auto is_enum = [](const c10::TypePtr& t) {
            auto k = t->kind();
            return k == c10::TypeKind::ScalarTypeType || k == c10::TypeKind::LayoutType ||
                   k == c10::TypeKind::MemoryFormatType;
        };
        const auto& t = a.real_type();
        ai.enum_int = is_enum(t);
        if (auto opt = t->cast<c10::OptionalType>()) ai.enum_int = ai.enum_int || is_enum(opt->getElementType());
        if (a.default_value()) {
            ai.has_default = true;
            ai.def = *a.default_value();
        }
        info->args.push_back(std::move(ai));
    }
    int kos = int(schema.arguments().size());
    while (kos > 0 && schema.arguments()[kos - 1].kwarg_only()) --kos;
    info->kwarg_only_start = kos;
    const bool is_view = aliased > 0 && !written;
    const std::string ns = opname.name.substr(0, opname.name.find("::"));
    info->launches = !is_view && !g_no_kernel.count(info->name) && !g_skip_ns.count(ns);
    const bool cuda = g_dev == c10::DeviceType::CUDA;
    using K = c10::DispatchKey;
    const K backend = cuda ? K::CUDA : K::CPU, autograd = cuda ? K::AutogradCUDA : K::AutogradCPU;
    // The dispatcher's rule for an autograd key (OperatorEntry::computeDispatchTableEntryWithDebug): a kernel
    // registered to it directly, else the CompositeImplicitAutograd one unless the op has a kernel for the
    // backend or a CompositeExplicitAutograd one. (Checked against torch._C._dispatch_dump_table for every
    // registered op: tests/unit/test_native_observer.py.)
    info->decomposes = handle->hasKernelForDispatchKey(K::CompositeImplicitAutograd) &&
                       !handle->hasKernelForDispatchKey(backend) && !handle->hasKernelForDispatchKey(autograd) &&
                       !handle->hasKernelForDispatchKey(K::CompositeExplicitAutograd);
    info->autocast = handle->hasKernelForDispatchKey(cuda ? K::AutocastCUDA : K::AutocastCPU);
    info->flop = flop_kind(info->base);
    return info;
}

// The facts of the op `fn` runs (nullptr: not a dispatcher op). Lock-free on a hit.
const OpInfo* op_info(const at::RecordFunction& fn) {
    const char* key = fn.name();
    size_t i = slot_of(key);
    for (size_t probe = 0; probe < 64; ++probe, i = (i + 1) & (kTable - 1)) {
        OpInfo* p = g_table[i].load(std::memory_order_acquire);
        if (p == nullptr) break;
        if (p->key == key && std::strcmp(p->base.c_str(), key) == 0) return p;
    }
    auto opname = fn.operator_name();  // a copy: only on a miss
    if (!opname) return nullptr;       // a named range (not an op): its name is not stable, never cached
    std::lock_guard<std::mutex> lk(g_mu);
    OpInfo* info = make_info(key, *opname);
    if (!info) return nullptr;
    info->id = uint32_t(g_ops.size());
    g_ops.push_back(info);
    i = slot_of(key);
    for (size_t probe = 0; probe < 64; ++probe, i = (i + 1) & (kTable - 1)) {
        OpInfo* p = g_table[i].load(std::memory_order_relaxed);
        if (p == nullptr) {
            g_table[i].store(info, std::memory_order_release);
            break;
        }
        if (p->key == key) {  // a stale entry for a deregistered op at the same address: replace it
            g_table[i].store(info, std::memory_order_release);
            break;
        }
    }
    return info;  // a full neighbourhood: correct, just not cached
}

// An op the dispatch mode would not see itself, although its parts may be: see the file's head.
bool passes_through(const OpInfo* info) {
    using c10::impl::tls_is_dispatch_key_excluded;
    const bool cuda = g_dev == c10::DeviceType::CUDA;
    using K = c10::DispatchKey;
    if (info->decomposes && !tls_is_dispatch_key_excluded(cuda ? K::AutogradCUDA : K::AutogradCPU)) return true;
    return info->autocast && !tls_is_dispatch_key_excluded(cuda ? K::AutocastCUDA : K::AutocastCPU);
}

// A tensor subclass with __torch_dispatch__ (DTensor: FSDP2's parameters, gradients and optimizer states) owns
// no memory of its own; its handler runs the op on its inner tensors, and those calls are what touch memory. So an
// op with such an argument is not taken as the launch: the calls its handler makes are (the Python observer
// instead flattens the subclass into its inner tensors and records one launch).
bool has_python_subclass(c10::ArrayRef<const c10::IValue> in) {
    for (const auto& v : in) {
        if (v.isTensor()) {
            const auto& t = v.toTensor();
            if (t.defined() && t.key_set().has(c10::DispatchKey::Python)) return true;
        } else if (v.isList()) {
            for (const auto& e : v.toListRef())
                if (e.isTensor() && e.toTensor().defined() && e.toTensor().key_set().has(c10::DispatchKey::Python))
                    return true;
        }
    }
    return false;
}

uint8_t current_phase() {
    if (g_optimizer.load(std::memory_order_relaxed)) return uvm::kOptimizer;
    // backward: while the engine evaluates a node, and while a backward pass runs on this thread outside any node
    // (its final callbacks: DDP's and FSDP2's gradient reductions)
    return bool(torch::autograd::get_current_node()) || torch::autograd::get_current_graph_task_id() != -1
               ? uvm::kBackward
               : uvm::kForward;
}

// --------------------------------------------------------------------------------------- the op in progress
// Key entries (the dispatch mode's shape key, flattened): a tag, then its payload.
enum KeyTag : int64_t { kTensorTag = -0x7fff0001, kIntTag = -0x7fff0002, kBoolTag = -0x7fff0003 };

struct Range {
    uint64_t base, off, len, storage;
    uint8_t mode, flags;
};

struct Pending {
    const at::RecordFunction* owner = nullptr;  // the mode-level op running on this thread
    const OpInfo* info = nullptr;
    bool record = false;
    bool any_acc = false, all_zero_dim = true;
    uint8_t phase = 0;
    int flop_dtype = -1;
    int device = -1;
    void* stream = nullptr;  // CUDA: the op's stream
    uvm::GateResult gate;
    bool gated = false;  // gate_check ran for this op: its end is reported (gate_op_end)
    std::vector<int64_t> key;
    std::vector<Range> ranges;
    std::vector<std::vector<int64_t>> in_shapes;  // tensor inputs by schema position (FLOPs)
    std::vector<int64_t> flop_args;               // transposed flag, output mask (FLOPs)
    std::vector<OpRec> out;
    std::chrono::steady_clock::time_point t0;
    uint64_t ns = 0;
};
thread_local Pending t_p;

int dtype_code(c10::ScalarType t) {  // trace.recorder._DTYPE_NAMES: fp32 (float32/64 and the rest), bf16, fp16
    return t == c10::ScalarType::BFloat16 ? 1 : t == c10::ScalarType::Half ? 2 : 0;
}

void add_tensor(Pending& p, const at::Tensor& t, uint8_t mode, bool input) {
    if (!t.defined()) return;  // None in Python
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
        // A Python scalar the dispatcher wrapped (x.add_(1)): the dispatch mode gets the scalar back
        // (torch::jit::toPyObject), an int or bool in the key, a float in none; never an access.
        if (!input) return;
        if (t.scalar_type() == c10::ScalarType::Long) {
            p.key.push_back(kIntTag);
            p.key.push_back(*t.const_data_ptr<int64_t>());
        } else if (t.scalar_type() == c10::ScalarType::Bool) {
            p.key.push_back(kBoolTag);
            p.key.push_back(*t.const_data_ptr<bool>());
        }
        return;
    }
    if (input) {
        p.key.push_back(kTensorTag);
        p.key.push_back(t.dim());
        for (int64_t s : t.sizes()) p.key.push_back(s);
        p.key.push_back(int64_t(t.scalar_type()));
    }
    if (t.layout() != c10::kStrided || t.device().type() != g_dev) return;
    p.any_acc = true;
    if (t.dim() != 0) p.all_zero_dim = false;
    if (p.flop_dtype < 0 && t.is_floating_point()) p.flop_dtype = dtype_code(t.scalar_type());
    if (p.device < 0) p.device = t.device().index();
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    if (!impl->has_storage()) return;
    const c10::Storage& st = impl->storage();
    const int64_t nb = int64_t(st.nbytes());
    if (nb <= 0) return;
    const int64_t es = int64_t(t.element_size());
    int64_t off, len;
    if (t.is_contiguous()) {
        off = t.storage_offset() * es;
        len = t.numel() * es;
    } else if (t.numel() == 0) {
        return;
    } else {  // trace.recorder.tensor_extent: everything between the first and the last element
        int64_t lo = 0, hi = 0;
        auto sizes = t.sizes();
        auto strides = t.strides();
        for (size_t d = 0; d < sizes.size(); ++d) {
            if (strides[d] >= 0) hi += (sizes[d] - 1) * strides[d];
            else lo += (sizes[d] - 1) * strides[d];
        }
        off = (t.storage_offset() + lo) * es;
        len = (hi - lo + 1) * es;
    }
    len = std::min(len, nb - off);
    if (len <= 0) return;
    const uint64_t base = reinterpret_cast<uintptr_t>(st.data());
    const uint8_t flags = (t.requires_grad() && t.is_leaf()) ? uvm::kLeafGrad : 0;
    for (auto& r : p.ranges) {  // the same range named twice (in-place ops): one access, modes joined
        if (r.base == base && r.off == uint64_t(off) && r.len == uint64_t(len)) {
            r.mode |= mode;
            r.flags |= flags;
            return;
        }
    }
    p.ranges.push_back(Range{base, uint64_t(off), uint64_t(len), uint64_t(nb), mode, flags});
}

void visit(Pending& p, const c10::IValue& v, const ArgInfo* a, uint8_t mode, bool input) {
    if (v.isTensor()) {
        add_tensor(p, v.toTensor(), mode, input);
    } else if (v.isInt()) {
        if (input && !(a && a->enum_int)) {
            p.key.push_back(kIntTag);
            p.key.push_back(v.toInt());
        }
    } else if (v.isBool()) {
        if (input) {
            p.key.push_back(kBoolTag);
            p.key.push_back(v.toBool());
        }
    } else if (v.isList()) {  // int[], bool[], Tensor[], Tensor?[] ...: their elements, in order
        for (const c10::IValue& e : v.toListRef()) visit(p, e, nullptr, mode, input);
    } else if (v.isTuple()) {
        for (const c10::IValue& e : v.toTupleRef().elements()) visit(p, e, nullptr, mode, input);
    }
}

bool is_default(const ArgInfo& a, const c10::IValue& v) { return a.has_default && a.def == v; }

void note_flop_inputs(Pending& p, const OpInfo* info, c10::ArrayRef<const c10::IValue> in) {
    if (info->flop == kNoFlops) return;
    const size_t want = info->flop == kSdpaBwd || info->flop == kConvBackward ? 4 : 3;
    for (size_t i = 0; i < want && i < in.size(); ++i) {
        p.in_shapes.emplace_back();
        if (in[i].isTensor() && in[i].toTensor().defined()) {
            auto s = in[i].toTensor().sizes();
            p.in_shapes.back().assign(s.begin(), s.end());
        }
    }
    auto flag = [&](size_t i) { return int64_t(i < in.size() && in[i].isBool() && in[i].toBool()); };
    if (info->flop == kConv) p.flop_args = {in.size() > 6 ? flag(6) : -1};
    if (info->flop == kConvBackward) {
        p.flop_args = {flag(7), 0, 0, 0};
        if (in.size() > 10 && in[10].isBoolList()) {
            auto m = in[10].toBoolList();
            for (size_t i = 0; i < 3 && i < m.size(); ++i) p.flop_args[1 + i] = m.get(i);
        }
    }
}

// The op's stream: the current CUDA stream of its device (no CUDA headers needed: c10's device guard interface).
void* current_stream(int device) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
    const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    return impl->getStream(c10::Device(c10::DeviceType::CUDA, c10::DeviceIndex(device < 0 ? 0 : device))).native_handle();
#else
    (void)device;
    return nullptr;  // before 2.3 c10::Stream has no native handle: the gate waits on the legacy default stream
#endif
}

void begin(Pending& p, const at::RecordFunction& fn) {
    const OpInfo* info = p.info;
    p.key.clear();
    p.ranges.clear();
    p.in_shapes.clear();
    p.flop_args.clear();
    p.any_acc = false;
    p.all_zero_dim = true;
    p.flop_dtype = -1;
    p.device = -1;
    p.gate = uvm::GateResult{};
    p.phase = current_phase();
    c10::ArrayRef<const c10::IValue> in = fn.inputs();
    const auto& args = info->args;
    const uint8_t R = uvm::kRead, RW = uvm::kRead | uvm::kWrite;
    if (in.size() == args.size()) {
        const int n = int(in.size()), kos = info->kwarg_only_start;
        int pds = kos;
        while (pds > 0 && is_default(args[pds - 1], in[pds - 1])) --pds;
        for (int i = 0; i < pds; ++i) visit(p, in[i], &args[i], args[i].write ? RW : R, true);
        for (int i = kos; i < n; ++i)
            if (!is_default(args[i], in[i])) visit(p, in[i], &args[i], args[i].write ? RW : R, true);
    } else {  // not the schema's arity (should not happen): every argument, read
        for (const auto& v : in) visit(p, v, nullptr, R, true);
    }
    note_flop_inputs(p, info, in);
    p.stream = nullptr;
    if (g_dev == c10::DeviceType::CUDA && p.any_acc) {
        p.stream = current_stream(p.device);
        if (uvm::stream_capturing(p.stream)) {  // a CUDA graph being captured: no moves around its ops
            p.record = false;
            return;
        }
    }
    if (g_dev == c10::DeviceType::CUDA && !p.ranges.empty() && uvm::gate_armed()) {
        std::vector<uint64_t> starts, lens;
        for (const auto& r : p.ranges) {
            starts.push_back(r.base + r.off);
            lens.push_back(r.len);
        }
        uvm::gate_check(starts.data(), lens.data(), starts.size(), p.stream, p.gate);
        p.gated = true;
    }
}

// ---------------------------------------------------------------------------------------- execution ids
std::string key_text(const OpInfo* info, const std::vector<int64_t>& key) {
    std::string s = info->name + "|(";
    size_t items = 0;
    for (size_t i = 0; i < key.size();) {
        if (items++) s += ", ";
        const int64_t tag = key[i++];
        if (tag == kTensorTag) {
            const int64_t nd = key[i++];
            s += "((";
            for (int64_t d = 0; d < nd; ++d) {
                if (d) s += ", ";
                s += std::to_string(key[i++]);
            }
            if (nd == 1) s += ",";
            s += "), '";
            s += uvm_py_dtype_name(c10::ScalarType(key[i++]));
            s += "')";
        } else if (tag == kIntTag) {
            s += std::to_string(key[i++]);
        } else {
            s += key[i++] ? "True" : "False";
        }
    }
    if (items == 1) s += ",";
    s += ")";
    return s;
}

struct IdEntry {
    uint32_t op;
    std::vector<int64_t> key;
    uint64_t id;
};
thread_local std::unordered_map<uint64_t, std::vector<IdEntry>> t_ids;
thread_local size_t t_ids_n = 0;

uint64_t exec_id(const OpInfo* info, const std::vector<int64_t>& key) {
    uint64_t h = 0xcbf29ce484222325ULL ^ info->id;
    for (int64_t v : key) h = (h ^ uint64_t(v)) * 0x100000001b3ULL;
    auto& bucket = t_ids[h];
    for (const auto& e : bucket)
        if (e.op == info->id && e.key == key) return e.id;
    const std::string text = key_text(info, key);
    const uint64_t id = uvm::blake2b_64(text.data(), text.size());
    if (t_ids_n < (1u << 16) && key.size() < kMaxKey) {  // as trace.recorder's _CACHE_MAX
        bucket.push_back(IdEntry{info->id, key, id});
        ++t_ids_n;
    }
    return id;
}

// ------------------------------------------------------------------------------------------------- FLOPs
// torch.utils.flop_counter's formulas for the ops whose counts read shapes only; an op the counter would
// reject (mismatched shapes) counts 0, as flops_of returns for a counter that raises.
int64_t bmm_flops(int64_t b, int64_t m, int64_t k, int64_t n) { return b * m * n * 2 * k; }

int64_t prod(const std::vector<int64_t>& v, size_t from) {
    int64_t r = 1;
    for (size_t i = from; i < v.size(); ++i) r *= v[i];
    return r;
}

int64_t conv_flops(const std::vector<int64_t>& x, const std::vector<int64_t>& w, const std::vector<int64_t>& out,
                   bool transposed) {
    if (x.size() < 2 || w.size() < 2) return 0;
    const auto& conv = transposed ? x : out;
    if (conv.size() < 2) return 0;
    return prod(conv, 2) * prod(w, 2) * x[0] * w[0] * w[1] * 2;
}

std::vector<int64_t> tr(const std::vector<int64_t>& s) {
    std::vector<int64_t> r = s;
    if (r.size() >= 2) std::swap(r[0], r[1]);
    return r;
}

double flops(const Pending& p, const std::vector<c10::IValue>& outs) {
    const auto& s = p.in_shapes;
    auto shape_of_out = [&](size_t i) {
        std::vector<int64_t> r;
        if (i < outs.size() && outs[i].isTensor() && outs[i].toTensor().defined()) {
            auto z = outs[i].toTensor().sizes();
            r.assign(z.begin(), z.end());
        }
        return r;
    };
    auto mm = [](const std::vector<int64_t>& a, const std::vector<int64_t>& b) -> int64_t {
        if (a.size() != 2 || b.size() != 2 || a[1] != b[0]) return 0;
        return a[0] * b[1] * 2 * a[1];
    };
    auto bmm = [](const std::vector<int64_t>& a, const std::vector<int64_t>& b) -> int64_t {
        if (a.size() != 3 || b.size() != 3 || a[0] != b[0] || a[2] != b[1]) return 0;
        return bmm_flops(a[0], a[1], a[2], b[2]);
    };
    switch (p.info->flop) {
        case kMm:
        case kScaledMm:
            return s.size() >= 2 ? double(mm(s[0], s[1])) : 0.0;
        case kAddmm:
            return s.size() >= 3 ? double(mm(s[1], s[2])) : 0.0;
        case kBmm:
            return s.size() >= 2 ? double(bmm(s[0], s[1])) : 0.0;
        case kBaddbmm:
            return s.size() >= 3 ? double(bmm(s[1], s[2])) : 0.0;
        case kConv:
            if (s.size() < 2 || p.flop_args.empty() || p.flop_args[0] < 0) return 0.0;
            return double(conv_flops(s[0], s[1], shape_of_out(0), p.flop_args[0] != 0));
        case kConvBackward: {
            if (s.size() < 3 || p.flop_args.size() < 4) return 0.0;
            const bool transposed = p.flop_args[0] != 0;
            int64_t f = 0;
            if (p.flop_args[1]) f += conv_flops(s[0], s[2], shape_of_out(0), !transposed);
            if (p.flop_args[2]) {
                if (transposed) f += conv_flops(tr(s[0]), tr(s[1]), tr(shape_of_out(1)), false);
                else f += conv_flops(tr(s[1]), tr(s[0]), tr(shape_of_out(1)), false);
            }
            return double(f);
        }
        case kSdpa: {
            if (s.size() < 3 || s[0].size() != 4 || s[1].size() != 4 || s[2].size() != 4) return 0.0;
            const auto &q = s[0], &k = s[1], &v = s[2];
            const int64_t b = q[0], hq = q[1], sq = q[2], dq = q[3], hkv = k[1], sk = k[2], dv = v[3];
            if (!(b == k[0] && b == v[0] && hkv == v[1] && dq == k[3] && sk == v[2])) return 0.0;
            if (hq < hkv || hkv == 0 || hq % hkv != 0) return 0.0;
            return double(bmm_flops(b * hq, sq, dq, sk) + bmm_flops(b * hq, sq, sk, dv));
        }
        case kSdpaBwd: {
            if (s.size() < 4) return 0.0;
            for (size_t i = 0; i < 4; ++i)
                if (s[i].size() != 4) return 0.0;
            const auto &g = s[0], &q = s[1], &k = s[2], &v = s[3];
            const int64_t b = q[0], hq = q[1], sq = q[2], dq = q[3], hkv = k[1], sk = k[2], dv = v[3];
            if (!(b == k[0] && b == v[0] && b == g[0] && hkv == v[1] && hq == g[1])) return 0.0;
            if (hq < hkv || hkv == 0 || hq % hkv != 0) return 0.0;
            if (!(dq == k[3] && dv == g[3] && sk == v[2] && sq == g[2])) return 0.0;
            return double(bmm_flops(b * hq, sq, dq, sk) + bmm_flops(b * hq, sq, dv, sk) +
                          bmm_flops(b * hq, sk, sq, dv) + bmm_flops(b * hq, sq, sk, dq) +
                          bmm_flops(b * hq, dq, sq, sk));
        }
        default:
            return 0.0;
    }
}

// ----------------------------------------------------------------------------------------------- finish
void finish(Pending& p, const at::RecordFunction& fn) {
    const std::vector<c10::IValue>& outs = fn.outputs();
    for (const auto& v : outs) visit(p, v, nullptr, uvm::kWrite, false);
    if (!p.any_acc) return;  // nothing on the observed device: no launch there
    if (p.phase == uvm::kOptimizer && p.all_zero_dim) return;  // AdamW's step counters: host work on a GPU
    const double f = flops(p, outs);
    uint64_t nbytes = 0;
    for (const auto& r : p.ranges) nbytes += r.len * (r.mode == (uvm::kRead | uvm::kWrite) ? 2 : 1);
    auto& out = p.out;
    const size_t nl = std::min<size_t>(p.gate.late, uvm::GateResult::kListMax);
    const size_t nf = std::min<size_t>(p.gate.fault, uvm::GateResult::kListMax);
    out.resize(2 + p.ranges.size() + nl + nf);
    uint64_t fbits;
    std::memcpy(&fbits, &f, sizeof f);
    out[0] = OpRec{uvm::next_seq(), exec_id(p.info, p.key),
                   uint64_t(p.info->id) | uint64_t(p.phase) << 32 | uint64_t(nl + nf) << 40 |
                       uint64_t(std::this_thread::get_id() != g_main_thread) << 48 | uint64_t(uvm::kHead) << 56,
                   p.ranges.size() + nl + nf};
    out[1] = OpRec{fbits, nbytes, uint64_t(p.flop_dtype < 0 ? 0 : p.flop_dtype) | uint64_t(uvm::kHead2) << 56,
                   uint64_t(p.gate.late) | uint64_t(p.gate.fault) << 32};
    for (size_t i = 0; i < p.ranges.size(); ++i) {
        const Range& r = p.ranges[i];
        out[2 + i] = OpRec{r.base, r.off,
                           (r.len & ((uint64_t(1) << 48) - 1)) | uint64_t(r.mode) << 48 | uint64_t(r.flags) << 52 |
                               uint64_t(uvm::kRange) << 56,
                           r.storage};
    }
    size_t k = 2 + p.ranges.size();
    for (size_t i = 0; i < nl; ++i) out[k++] = OpRec{p.gate.late_blocks[i], 1, uint64_t(uvm::kGate) << 56, 0};
    for (size_t i = 0; i < nf; ++i) out[k++] = OpRec{p.gate.fault_blocks[i], 2, uint64_t(uvm::kGate) << 56, 0};
    g_ring.push(out.data(), out.size());
    g_recorded.fetch_add(1, std::memory_order_relaxed);
    if (p.stream != nullptr) uvm::progress_note(out[0].a, p.stream);
    if (p.gate.late) g_gate_late.fetch_add(p.gate.late, std::memory_order_relaxed);
    if (p.gate.fault) g_gate_fault.fetch_add(p.gate.fault, std::memory_order_relaxed);
    if (p.gate.waits) g_gate_waits.fetch_add(p.gate.waits, std::memory_order_relaxed);
}

// ------------------------------------------------------------------------------------------- callbacks
std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    Pending& p = t_p;
    if (p.owner != nullptr || g_state.load(std::memory_order_relaxed) != kActive) return nullptr;
    park();
    try {
        const OpInfo* info = op_info(fn);
        if (info == nullptr || passes_through(info) || has_python_subclass(fn.inputs())) return nullptr;
        p.owner = &fn;
        p.info = info;
        // With the Python key excluded (torch.tensor(data) builds its tensor so, no_dispatch()) a dispatch mode
        // sees neither the op nor anything it calls.
        p.record = info->launches && !c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::Python);
        if (!p.record) return nullptr;
        const bool timing = g_timing.load(std::memory_order_relaxed);
        if (timing) p.t0 = std::chrono::steady_clock::now();
        const int64_t left = g_fail_after.load(std::memory_order_relaxed);
        if (left >= 0 && int64_t(g_recorded.load(std::memory_order_relaxed)) >= left)
            throw std::runtime_error("injected observer failure (UVMPREFETCH_TEST_FAIL=observer)");
        begin(p, fn);
        if (!p.record) return nullptr;
        if (timing) p.ns = uint64_t((std::chrono::steady_clock::now() - p.t0).count());
    } catch (const std::exception& e) {
        p.record = false;
        fail("observer", e.what());
    } catch (...) {
        p.record = false;
        fail("observer", "unknown exception");
    }
    return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
    park();  // also after an op: a training thread that would take the GIL back mid-burst waits here instead
    Pending& p = t_p;
    if (p.owner != &fn) return;
    p.owner = nullptr;
    if (p.gated) {  // the op's kernels are queued: a copy-out waiting for ops past the gate may go on
        p.gated = false;
        uvm::gate_op_end();
    }
    if (!p.record || g_state.load(std::memory_order_relaxed) != kActive) return;
    if (std::uncaught_exceptions() > 0) return;  // the op raised: the dispatch mode never sees it return
    try {
        const bool timing = g_timing.load(std::memory_order_relaxed);
        auto t1 = timing ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
        finish(p, fn);
        if (timing)
            g_callback_ns.fetch_add(p.ns + uint64_t((std::chrono::steady_clock::now() - t1).count()),
                                    std::memory_order_relaxed);
    } catch (const std::exception& e) {
        fail("observer", e.what());
    } catch (...) {
        fail("observer", "unknown exception");
    }
}

std::unique_ptr<at::ObserverContext> on_start_light(const at::RecordFunction&) {
    if (g_state.load(std::memory_order_relaxed) != kFailed) park();
    return nullptr;
}

void on_end_light(const at::RecordFunction&, at::ObserverContext*) {
    if (g_state.load(std::memory_order_relaxed) != kFailed) park();
}

void split_lines(const char* text, std::unordered_set<std::string>& into) {
    into.clear();
    if (!text) return;
    std::string s(text);
    size_t i = 0;
    while (i <= s.size()) {
        size_t j = s.find('\n', i);
        if (j == std::string::npos) j = s.size();
        if (j > i) into.insert(s.substr(i, j - i));
        i = j + 1;
    }
}

}  // namespace

const char* uvm_py_dtype_name(c10::ScalarType t) {
    using S = c10::ScalarType;
    switch (t) {
        case S::Byte: return "uint8";
        case S::Char: return "int8";
        case S::Short: return "int16";
        case S::Int: return "int32";
        case S::Long: return "int64";
        case S::Half: return "float16";
        case S::Float: return "float32";
        case S::Double: return "float64";
        case S::ComplexHalf: return "complex32";
        case S::ComplexFloat: return "complex64";
        case S::ComplexDouble: return "complex128";
        case S::Bool: return "bool";
        case S::BFloat16: return "bfloat16";
        default: break;
    }
    // the rest (qint8, float8_e4m3fn, uint16, bits8, ...): Python's name is c10's, lower-cased
    thread_local std::string s;
    s = c10::toString(t);
    for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s.c_str();
}

// ------------------------------------------------------------------------------------------------ C ABI
UVM_EXPORT int uvmobs_abi() { return kAbi; }

UVM_EXPORT const char* uvmobs_torch_version() { return TORCH_VERSION; }

// The recorder's op rules, from Python (trace/recorder.py keeps the one list): newline-separated names.
UVM_EXPORT void uvmobs_set_rules(const char* no_kernel, const char* skip_namespaces) {
    std::lock_guard<std::mutex> lk(g_mu);
    split_lines(no_kernel, g_no_kernel);
    split_lines(skip_namespaces, g_skip_ns);
}

UVM_EXPORT int uvmobs_set_active(int on);

// Is this thread inside an op the observer records (between its start and end callbacks)? The shim asks at each
// kernel launch while the copy path holds mirrors: a launch outside such an op is one nobody observed.
UVM_EXPORT int uvmobs_thread_in_op() { return t_p.owner != nullptr && t_p.record; }

// The shim's count of unknown kernels (uvmshim_set_observer): 1 while this thread is inside an op the observer
// records, 0 while the observer records ops and this thread is in none (a launch now is one no recorded op accounts
// for), -1 while it records nothing (dormant, stopped, failed: a launch then tells nothing). The state is read first:
// a stopped observer never touches the thread's record.
UVM_EXPORT int uvmobs_launch_attribution() {
    if (g_state.load(std::memory_order_relaxed) != kActive) return -1;
    return t_p.owner != nullptr && t_p.record ? 1 : 0;
}

// Register the callbacks (once) for `device_type` (0 CPU, 1 CUDA); `active`: full observation, else dormant.
UVM_EXPORT int uvmobs_start(int device_type, int active) {
    try {
        {
            std::lock_guard<std::mutex> lk(g_mu);
            if (g_state.load() == kFailed) {  // a failure ends one run's observation; a new run starts clean
                g_error.clear();
                g_state.store(g_full ? kDormant : kOff);
            }
            g_dev = device_type == 1 ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
            g_main_thread = std::this_thread::get_id();
            if (g_full == 0) {
                g_full = at::addGlobalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                                   .needsInputs(true)
                                                   .needsOutputs(true)
                                                   .scopes({at::RecordScope::FUNCTION}));
                g_state.store(kDormant);
                at::disableCallback(g_full);
            }
            if (g_light == 0) {
                g_light = at::addGlobalCallback(
                    at::RecordFunctionCallback(&on_start_light, &on_end_light).scopes({at::RecordScope::FUNCTION}));
                at::disableCallback(g_light);
            }
        }
        uvmobs_set_active(active);
        return g_state.load() == kFailed ? -2 : 0;
    } catch (const std::exception& e) {
        fail("start", e.what());
        return -1;
    }
}

// Switch between dormant (the callback disabled: the dispatcher runs no RecordFunction for us at all) and active
// (full records). Returns the new state.
UVM_EXPORT int uvmobs_set_active(int on) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_full == 0 || g_state.load() == kFailed) return g_state.load();
    try {
        if (on) {
            at::reenableCallback(g_full);
            g_state.store(kActive);
        } else {
            at::disableCallback(g_full);
            g_state.store(kDormant);
        }
    } catch (const std::exception& e) {
        g_error = std::string("switch: ") + e.what();
        g_state.store(kFailed);
    }
    return g_state.load();
}

// Remove the callbacks (the program goes on unobserved).
UVM_EXPORT void uvmobs_stop() {
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_state.load() != kFailed) g_state.store(kOff);
    g_turn.store(0);
    try {
        if (g_full) at::removeCallback(g_full);
        // The light callback stays registered, disabled, for the next start. (Removing and adding it again works
        // too: RecordFunction's per-thread cache is rebuilt whenever the global callbacks' version moves, and
        // add, remove, enable and disable each move it. Turns that seemed not to reach it were turns in which the
        // training thread waited for the GIL, not at a callback: see uvmobs_turn_wait.)
        if (g_light) at::disableCallback(g_light);
    } catch (...) {
    }
    g_full = 0;
}

UVM_EXPORT int uvmobs_state() { return g_state.load(); }

// In a forked child: record nothing from now on, without taking a lock (the parent's other threads may have held
// one at the fork). The callbacks stay registered and return at once.
UVM_EXPORT void uvmobs_quiet() {
    if (g_state.load() != kFailed) g_state.store(kOff);
    g_turn.store(0);
}

// The planner's turn (see g_turn): 1 parks the training thread at its next op until 0 (or kTurnMax). Returns
// how many threads were parked when it was called (giving the turn back: did the training thread wait for it?).
UVM_EXPORT int uvmobs_turn(int on) {
    const int parked = g_parked_now.load();
    if (on) g_turn_since.store(now_ns(), std::memory_order_relaxed);
    g_turn.store(on != 0 ? 1 : 0, std::memory_order_release);
    return parked;
}

// Take the turn and wait (ctypes releases the GIL around this call) until the training thread is parked in a
// callback, or `timeout_us` passed (it is in a long op, or runs no ops). Without the wait the planner, back from
// uvmobs_turn(1), mostly re-took the GIL at once while the training thread was still waiting for it after its
// last op: the training thread then waited for the whole burst in the GIL, not at a callback (2-6 parks in 25-45
// turns while shedding), and the planner, seeing no park, never rested. Returns the threads parked (0: timed
// out; the turn stays taken either way, until uvmobs_turn(0)).
UVM_EXPORT int uvmobs_turn_wait(int timeout_us) {
    uvmobs_turn(1);
    const int64_t end = now_ns() + int64_t(timeout_us) * 1000;
    int parked = g_parked_now.load();
    while (parked == 0 && now_ns() < end && g_turn.load(std::memory_order_acquire) != 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(10));
        parked = g_parked_now.load();
    }
    return parked;
}

// [parks, parked ns]: how often and how long the training thread waited for the planner's turns.
UVM_EXPORT void uvmobs_parked(uint64_t* out) {
    out[0] = g_parks.load();
    out[1] = g_parked_ns.load();
}

// The callback that only parks (no inputs: the dispatcher boxes nothing for it), on while the full one is off
// and the planner works through a backlog (shedding).
UVM_EXPORT int uvmobs_set_light(int on) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_light == 0) return -1;
    try {
        if (on) at::reenableCallback(g_light);
        else at::disableCallback(g_light);
    } catch (const std::exception& e) {
        return -1;
    }
    return 0;
}

UVM_EXPORT void uvmobs_set_optimizer(int on) { g_optimizer.store(on != 0, std::memory_order_relaxed); }

UVM_EXPORT void uvmobs_set_timing(int on) { g_timing.store(on != 0); }

// A mark in the op stream (optimizer step begin / end), in order with the ops: returns its seq.
UVM_EXPORT uint64_t uvmobs_mark(uint32_t code, uint64_t value) {
    OpRec r{uvm::next_seq(), value, uint64_t(code) | uint64_t(uvm::kMark) << 56, 0};
    g_ring.push(r);
    return r.a;
}

// Planner side (one thread; ctypes releases the GIL around it).
UVM_EXPORT size_t uvmobs_drain(OpRec* out, size_t max) { return g_ring.drain(out, max); }

UVM_EXPORT uint64_t uvmobs_dropped() { return g_ring.dropped(); }

// The process-wide record sequence now (ops, marks, allocator events): the planner's "did the training thread
// publish anything since I last looked?".
UVM_EXPORT uint64_t uvmobs_seq() { return uvm::seq_counter().load(std::memory_order_relaxed); }

// counters: [recorded runs, dropped records, callback ns, gate late, gate fault, gate waits, op ids]
UVM_EXPORT size_t uvmobs_counters(uint64_t* out, size_t n) {
    uint64_t v[7] = {g_recorded.load(), g_ring.dropped(), g_callback_ns.load(), g_gate_late.load(),
                     g_gate_fault.load(), g_gate_waits.load(), 0};
    {
        std::lock_guard<std::mutex> lk(g_mu);
        v[6] = g_ops.size();
    }
    for (size_t i = 0; i < n && i < 7; ++i) out[i] = v[i];
    return 7;
}

// The name of op `id` ("aten::add.Tensor") into buf; returns its length (0: unknown id).
UVM_EXPORT size_t uvmobs_op_name(uint32_t id, char* buf, size_t n) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (id >= g_ops.size() || n == 0) return 0;
    const std::string& s = g_ops[id]->name;
    size_t k = std::min(n - 1, s.size());
    std::memcpy(buf, s.data(), k);
    buf[k] = 0;
    return s.size();
}

// The first error that switched the observer off ("" if none).
UVM_EXPORT size_t uvmobs_error(char* buf, size_t n) {
    std::lock_guard<std::mutex> lk(g_mu);
    if (n == 0) return g_error.size();
    size_t k = std::min(n - 1, g_error.size());
    std::memcpy(buf, g_error.data(), k);
    buf[k] = 0;
    return g_error.size();
}

// Tests: the callback throws once this many op runs were recorded (-1: never).
UVM_EXPORT void uvmobs_test_fail_after(int64_t n) { g_fail_after.store(n); }

// Tests: what the observer concludes about an op for device type `device_type` (0 CPU, 1 CUDA):
// out = [found, launches a kernel, decomposes (CompositeImplicitAutograd), has an autocast kernel].
UVM_EXPORT void uvmobs_op_facts(const char* name, const char* overload, int device_type, int* out) {
    std::lock_guard<std::mutex> lk(g_mu);
    const c10::DeviceType saved = g_dev;
    g_dev = device_type == 1 ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
    OpInfo* info = nullptr;
    try {
        info = make_info(nullptr, c10::OperatorName(name, overload));
    } catch (...) {
    }
    g_dev = saved;
    out[0] = info != nullptr;
    out[1] = info && info->launches;
    out[2] = info && info->decomposes;
    out[3] = info && info->autocast;
    delete info;
}

// Tests: the Python name the execution id hashes for ScalarType `code`.
UVM_EXPORT const char* uvmobs_dtype_name(int code) { return uvm_py_dtype_name(c10::ScalarType(code)); }
