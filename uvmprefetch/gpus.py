"""GPU profiles: the numbers the roofline duration model (trace/) and the simulator (sim/) use.

Every number carries its source. A plain name (``h100-pcie``, the default; ``h100-sxm``; ``h200``) is the card with
the unified-memory costs measured on it by ``bench/gpu/calibrate.py`` (the ``calibrated`` field says which run);
``NAME-lit`` is the same card with the literature's link and fault numbers (docs/design.md §3), for comparison with
papers. Cards not measured yet (``a100-pcie``, ``v100-pcie``, ``gh200-c2c``) carry the literature numbers under both names.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from .errors import ConfigError

GB = 1e9
GiB = 1024**3
TFLOPS = 1e12


@dataclass(frozen=True)
class GpuProfile:
    """One GPU + host link. Bandwidths in bytes/s, latencies in seconds, compute in FLOP/s."""

    name: str
    memory_bytes: int
    hbm_bw: float
    flops: dict = field(default_factory=dict)  # dtype -> dense peak FLOP/s (fp32, tf32, bf16, fp16)
    link_htod_bw: float = 25 * GB  # achieved per direction, large transfers
    link_dtoh_bw: float = 25 * GB
    fault_batch_latency_s: float = 45e-6  # per far-fault batch (UVMSmart / G10 simulators)
    fault_batch_size: int = 256  # fault entries per batch (nvidia-uvm)
    fault_granule_bytes: int = 64 * 1024  # faults are widened to 64 KB big pages
    remote_access_bw: float = 0.0  # zero-copy (host-mapped) access bandwidth seen by kernels; 0 = link_htod_bw
    launch_overhead_s: float = 4e-6  # smallest kernel duration (launch + tail)
    matmul_efficiency: float = 0.70  # fraction of peak FLOP/s a large GEMM reaches
    memory_efficiency: float = 0.80  # fraction of HBM bandwidth a streaming kernel reaches
    # Optional third tier (docs/tiers.md): an NVMe SSD behind host memory. ssd_bw = 0 turns it off (the default:
    # every existing result is unchanged). host_capacity_bytes bounds the host memory that evicted GPU data may
    # occupy (0 = unlimited); data that does not fit there goes to the SSD.
    ssd_bw: float = 0.0  # SSD sequential read bandwidth, bytes/s
    ssd_write_bw: float = 0.0  # SSD sequential write bandwidth, bytes/s; 0 = ssd_bw
    ssd_latency_s: float = 0.0  # per SSD request batch (one Decision's or one fault batch's SSD reads/writes)
    host_capacity_bytes: int = 0  # host memory for evicted GPU data; 0 = unlimited
    # The copy path (docs/simulator.md "Eviction paths"): copy-out of GPU-resident managed memory into a pinned host
    # mirror + discard, and back by repopulate + copy-in, beside UVM's eviction. copy_dtoh_bw = 0 turns it off (the
    # default: the literature profiles' UVM eviction already runs at the link's speed). Each field names the entry
    # of bench/baselines/gpu.json ``microbench`` (bench/gpu/evict_microbench.py) that is to replace it.
    copy_dtoh_bw: float = 0.0  # pinned D2H copy from GPU-resident managed memory: evict/copy_out managed_to_pinned gb_s
    copy_htod_bw: float = 0.0  # pinned H2D copy into GPU-resident managed memory: evict/copy_out pinned_to_managed gb_s
    copy_call_s: float = 0.0  # GPU time per copy call beyond its bytes: evict/copy_out 2 MiB gpu_us - 2 MiB / bw
    discard_call_s: float = 0.0  # GPU time of one discard call: evict/discard ranges per_call_us
    discard_block_s: float = 0.0  # ... and per block it discards: evict/discard ranges per_block_us
    repopulate_call_s: float = 0.0  # prefetch to the GPU of a discarded range (no bytes move): evict/copy_in
    repopulate_block_s: float = 0.0  # ... per block (prefetch points' repopulate gpu_us against size, line fit)
    remote_write_bw: float = 0.0  # zero-copy writes of a PREFER_HOST block by a kernel; 0 = remote_access_bw's
    calibrated: str = ""  # "" = starting values from the literature; else date + script that measured them
    sources: str = ""

    def __post_init__(self) -> None:
        for f in ("memory_bytes", "hbm_bw", "link_htod_bw", "link_dtoh_bw", "fault_batch_size", "fault_granule_bytes"):
            if not getattr(self, f) > 0:
                raise ConfigError(f"gpu profile {self.name}: {f} must be positive, got {getattr(self, f)!r}")
        for f in ("fault_batch_latency_s", "launch_overhead_s", "remote_access_bw"):
            if getattr(self, f) < 0:
                raise ConfigError(f"gpu profile {self.name}: {f} must be >= 0, got {getattr(self, f)!r}")
        for f in ("ssd_bw", "ssd_write_bw", "ssd_latency_s", "host_capacity_bytes", "remote_write_bw", "copy_dtoh_bw",
                  "copy_htod_bw", "copy_call_s", "discard_call_s", "discard_block_s", "repopulate_call_s",
                  "repopulate_block_s"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"gpu profile {self.name}: {f} must be a finite number >= 0, got {v!r}")
        if self.ssd_bw == 0:
            on = [f for f in ("ssd_write_bw", "ssd_latency_s", "host_capacity_bytes") if getattr(self, f)]
            if on:
                raise ConfigError(f"gpu profile {self.name}: {', '.join(on)} set but ssd_bw is 0 (the SSD tier is "
                                  f"off); set ssd_bw too, e.g. --gpu-set ssd_bw=7e9 or --ssd pcie4-nvme")
        if (self.copy_dtoh_bw > 0) != (self.copy_htod_bw > 0):
            raise ConfigError(f"gpu profile {self.name}: the copy path needs both copy_dtoh_bw and copy_htod_bw "
                              f"(got {self.copy_dtoh_bw!r} and {self.copy_htod_bw!r}; 0 for both turns it off)")
        for f in ("matmul_efficiency", "memory_efficiency"):
            if not 0 < getattr(self, f) <= 1:
                raise ConfigError(f"gpu profile {self.name}: {f} must be in (0, 1], got {getattr(self, f)!r}")
        if not self.flops or any(v <= 0 for v in self.flops.values()):
            raise ConfigError(f"gpu profile {self.name}: flops must map dtypes to positive FLOP/s")

    @property
    def copy_path(self) -> bool:
        """True when the profile models the copy path (``copy_dtoh_bw > 0``)."""
        return self.copy_dtoh_bw > 0

    @property
    def populates(self) -> bool:
        """True when the profile has a cost for mapping memory on the GPU without data (``repopulate_*``): it models
        populates and the zero-filled first touch of memory no processor has used (docs/simulator.md "Populates")."""
        return self.repopulate_call_s > 0 or self.repopulate_block_s > 0

    @property
    def ssd_tier(self) -> bool:
        """True when the profile has an SSD tier (``ssd_bw > 0``)."""
        return self.ssd_bw > 0

    def peak_flops(self, dtype: str) -> float:
        """Dense peak for ``dtype`` ('fp32', 'tf32', 'bf16', 'fp16'); unknown dtypes fall back to fp32."""
        return self.flops.get(dtype, self.flops["fp32"])

    def transfer_bw(self, nbytes: float, direction: str = "htod") -> float:
        """Achieved link bandwidth for one transfer of ``nbytes`` (UVMSmart fit: bw = 2a/pi * atan(0.0729 * KB))."""
        a = self.link_htod_bw if direction == "htod" else self.link_dtoh_bw
        kb = max(nbytes, 1) / 1024.0
        return a * (2.0 / math.pi) * math.atan(0.0729 * kb)

    def transfer_time(self, nbytes: float, direction: str = "htod") -> float:
        """Seconds to move ``nbytes`` in one transfer."""
        return nbytes / self.transfer_bw(nbytes, direction) if nbytes > 0 else 0.0

    def with_overrides(self, **kv) -> "GpuProfile":
        """A copy with some fields replaced (``--gpu-set link_htod_bw=20e9``); unknown fields are an error."""
        names = {f.name for f in dataclasses.fields(self)}
        bad = sorted(set(kv) - names)
        if bad:
            raise ConfigError(f"unknown gpu profile field(s) {', '.join(bad)}; valid: {', '.join(sorted(names))}")
        return dataclasses.replace(self, **kv)


# The literature profiles (``NAME-lit``): datasheet compute and the link and fault numbers simulators usually assume
# (docs/design.md §3: 45 us per 256-entry fault batch, the link's bandwidth both ways). Kept for comparison with papers;
# where a card's unified-memory costs were measured, its plain name is the calibrated profile (below).
PROFILES: dict[str, GpuProfile] = {
    p.name: p
    for p in [
        GpuProfile(
            name="h100-pcie-lit", memory_bytes=80 * GiB, hbm_bw=2.0e12,
            flops={"fp32": 51 * TFLOPS, "tf32": 378 * TFLOPS, "bf16": 756 * TFLOPS, "fp16": 756 * TFLOPS},
            link_htod_bw=52 * GB, link_dtoh_bw=52 * GB,
            sources="NVIDIA H100 datasheet (PCIe, dense); PCIe 5 x16 achieved 50-55 GB/s (docs/design.md §3)",
        ),
        GpuProfile(
            name="h100-sxm-lit", memory_bytes=80 * GiB, hbm_bw=3.35e12,
            flops={"fp32": 67 * TFLOPS, "tf32": 494 * TFLOPS, "bf16": 989 * TFLOPS, "fp16": 989 * TFLOPS},
            link_htod_bw=52 * GB, link_dtoh_bw=52 * GB,
            sources="NVIDIA H100 datasheet (SXM5, dense); host link is PCIe 5 x16 (docs/design.md §3)",
        ),
        GpuProfile(
            name="a100-pcie-lit", memory_bytes=80 * GiB, hbm_bw=1.935e12,
            flops={"fp32": 19.5 * TFLOPS, "tf32": 156 * TFLOPS, "bf16": 312 * TFLOPS, "fp16": 312 * TFLOPS},
            link_htod_bw=25 * GB, link_dtoh_bw=25 * GB,
            sources="NVIDIA A100 80GB PCIe datasheet (dense); PCIe 4 x16 achieved ~25 GB/s (docs/design.md §3)",
        ),
        GpuProfile(
            name="v100-pcie-lit", memory_bytes=32 * GiB, hbm_bw=0.9e12,
            flops={"fp32": 14 * TFLOPS, "tf32": 14 * TFLOPS, "bf16": 14 * TFLOPS, "fp16": 112 * TFLOPS},
            link_htod_bw=12 * GB, link_dtoh_bw=12 * GB,
            sources="NVIDIA V100 PCIe 32GB datasheet (no bf16 tensor cores: bf16 runs at fp32 rate); PCIe 3 ~12 GB/s",
        ),
        GpuProfile(
            name="gh200-c2c-lit", memory_bytes=96 * GiB, hbm_bw=4.0e12,
            flops={"fp32": 67 * TFLOPS, "tf32": 494 * TFLOPS, "bf16": 989 * TFLOPS, "fp16": 989 * TFLOPS},
            link_htod_bw=375 * GB, link_dtoh_bw=297 * GB,
            sources="NVIDIA GH200 datasheet; NVLink-C2C measured ~375 GB/s H2D (docs/design.md §3), D2H assumed 0.8x",
        ),
    ]
}
# Handy for the GPU machines this project is lent (an H200 has 141 GB HBM3e at 4.8 TB/s, PCIe 5 host link).
PROFILES["h200-lit"] = dataclasses.replace(
    PROFILES["h100-sxm-lit"], name="h200-lit", memory_bytes=141 * GB, hbm_bw=4.8e12,
    sources="NVIDIA H200 datasheet (SXM); compute as H100 SXM; PCIe 5 host link",
)

# ``h100-pcie`` (the default) and ``h100-sxm``: the card's compute with the unified-memory costs bench/gpu/calibrate.py
# measured on a lent H100 (SXM5 board, PCIe 5 x16 host link, driver 580.159.04; tests/data/calibrate-h100.json).
# The literature numbers (``-lit``) are much kinder:
# - a dense read of host-resident managed memory (torch .sum over N 2 MiB blocks, N = 8..512) costs 320-400 us
#   per block (~6 GB/s), against ~43 us in the literature model. One 2 MiB block per fault batch
#   (fault_batch_size = 17 entries) at 330 us + the transfer fits the dense touch within -6..+17 % and the
#   sparse touch (one element per block: 20-39 us per block) within -14..+11 % (tests/unit/test_gpus_calibrated.py);
# - cudaMemPrefetchAsync to the host (the eviction path) runs at 6.2 GB/s for 2 MiB, 8-10 GB/s for 8 MiB-1 GiB
#   (pinned copies: 55 GB/s): 7.5 GB/s fits 2 MiB-1 GiB within -16..+31 %;
# - to the GPU, 49-50 GB/s for >= 128 MiB. Not modelled: one call of 2 MiB takes ~100 us (about 60 us of
#   latency per call), so prefetching scattered single blocks is slower than this profile says.
# docs/simulator.md, "Calibrated profiles", has the table. ``h100-sxm`` is the board that was measured
# (bench/gpu/fidelity.py replays live H100 runs with it).
# The copy path on the lent H100 and H200 (``COPY_PATH``, both boards): pinned cudaMemcpy ran at 55 GB/s each way
# there (docs/design.md §3; measured with plain device memory, not yet from GPU-resident managed memory). The per-call
# costs are assumptions until bench/gpu/evict_microbench.py has run on a GPU: the field comments in GpuProfile
# name the ``microbench`` entry that replaces each.
COPY_PATH = dict(copy_dtoh_bw=55 * GB, copy_htod_bw=55 * GB, copy_call_s=10e-6, discard_call_s=20e-6,
                 discard_block_s=2e-6, repopulate_call_s=20e-6, repopulate_block_s=2e-6)
for _base in ("h100-pcie", "h100-sxm"):
    PROFILES[_base] = dataclasses.replace(
        PROFILES[f"{_base}-lit"], name=_base, link_htod_bw=50 * GB, link_dtoh_bw=7.5 * GB,
        fault_batch_size=17, fault_batch_latency_s=330e-6, **COPY_PATH,
        sources=PROFILES[f"{_base}-lit"].sources + "; link and fault costs measured on an H100 "
                                                  "(tests/data/calibrate-h100.json)",
        calibrated="2026-11-23 bench/gpu/calibrate.py on NVIDIA H100 80GB HBM3 (driver 580.159.04), fitted by hand",
    )

# ``h200``: the H200 board's compute with the unified-memory costs bench/gpu/calibrate.py measured on a lent
# H200 (driver 580.159.04; tests/data/calibrate-h200.json), fitted by hand
# as the H100's were (the automatic atan fit fails here too: managed prefetches carry ~60 us per call):
# - a dense touch of host-resident managed memory costs ~300 us per 2 MiB block (H100: 320-400): one block per
#   fault batch (17 entries) at 280 us + the transfer fits the dense touch within -7..+22 % and the sparse
#   touch within -24..+16 %;
# - eviction (cudaMemPrefetchAsync to the host) 7.3 GB/s for 2 MiB, 9-11 GB/s for 8 MiB-1 GiB: 9 GB/s fits
#   2 MiB-1 GiB within -19..+25 %; to the GPU 49 GB/s for >= 128 MiB (within 0.1 %).
PROFILES["h200"] = dataclasses.replace(
    PROFILES["h200-lit"], name="h200", link_htod_bw=49 * GB, link_dtoh_bw=9 * GB,
    fault_batch_size=17, fault_batch_latency_s=280e-6, **COPY_PATH,
    sources=PROFILES["h200-lit"].sources + "; link and fault costs measured on an H200 "
                                          "(tests/data/calibrate-h200.json)",
    calibrated="2026-11-27 bench/gpu/calibrate.py on NVIDIA H200 (driver 580.159.04), fitted by hand",
)

# The cards nobody has measured yet keep the literature numbers under their plain name too (``calibrated`` is ""
# there: ``uvmprefetch bench`` says so in its header).
for _base in ("a100-pcie", "v100-pcie", "gh200-c2c"):
    PROFILES[_base] = dataclasses.replace(PROFILES[f"{_base}-lit"], name=_base)

# Plain names first (``--help`` lists them in this order), then the literature variants.
PROFILES = {k: PROFILES[k] for k in sorted(PROFILES, key=lambda k: (k.endswith("-lit"), list(PROFILES).index(k)))}

# Earlier names of the calibrated profiles, still accepted (``get_profile``) and listed nowhere.
ALIASES = {"h100-pcie-cal": "h100-pcie", "h100-sxm-cal": "h100-sxm", "h200-cal": "h200"}

DEFAULT_GPU = "h100-pcie"


def card_name(name: str) -> str:
    """The card a profile name stands for, without ``-lit`` / ``-cal`` (they differ in unified-memory costs only,
    not in compute: a trace's estimated durations are the same on all of them)."""
    return name.removesuffix("-lit").removesuffix("-cal")

# SSD tiers for ``GpuProfile.with_overrides(**SSD_PRESETS[name])`` (``--ssd NAME`` in replay/bench). The host
# capacity is left to the caller (``--gpu-set host_capacity_bytes=...``): it is a property of the experiment.
SSD_PRESETS: dict[str, dict] = {
    # Samsung 980 PRO (PCIe 4.0 x4 NVMe): 7,000 MB/s sequential read, 5,000 MB/s sequential write (Samsung's
    # rating, e.g. pugetsystems.com parts page for the 1 TB model); the kind of drive G10 (MICRO'23) assumes.
    # Latency: ~50 us per request batch, a typical NVMe 4 KiB QD1 read latency (order of magnitude, not measured).
    "pcie4-nvme": {"ssd_bw": 7.0e9, "ssd_write_bw": 5.0e9, "ssd_latency_s": 50e-6},
    # The same drive at the 6.4-6.5 GB/s read figure of early 980 PRO listings (Tom's Hardware, CES 2020: 6,500 MB/s).
    "pcie4-nvme-6.4": {"ssd_bw": 6.4e9, "ssd_write_bw": 5.0e9, "ssd_latency_s": 50e-6},
    # PCIe 3.0 x4 NVMe (Samsung 970 PRO 512 GB: 3,500 MB/s read, 2,300 MB/s write), FlashNeuron-era drives.
    "pcie3-nvme": {"ssd_bw": 3.5e9, "ssd_write_bw": 2.3e9, "ssd_latency_s": 80e-6},
}


def get_profile(name: str) -> GpuProfile:
    """The profile called ``name``.

    Raises
    ------
    ConfigError
        If no profile has that name; the message lists the valid ones.
    """
    try:
        return PROFILES[ALIASES.get(name, name)]
    except KeyError:
        raise ConfigError(f"unknown GPU profile {name!r}; valid: {', '.join(PROFILES)}") from None


def parse_overrides(items: list[str] | None) -> dict:
    """Turn ``["link_htod_bw=20e9", "fault_batch_latency_s=30e-6"]`` into a dict of floats/ints."""
    out: dict = {}
    for item in items or []:
        key, sep, val = item.partition("=")
        if not sep:
            raise ConfigError(f"--gpu-set {item!r}: expected FIELD=VALUE")
        try:
            num = float(val)
        except ValueError:
            raise ConfigError(f"--gpu-set {item!r}: {val!r} is not a number") from None
        out[key.strip()] = int(num) if num.is_integer() and key.strip().endswith(("_bytes", "_size")) else num
    return out
