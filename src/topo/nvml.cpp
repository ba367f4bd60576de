// NVML, opened with dlopen so that it stays optional: NUMA placement comes
// from sysfs, NVLink state from here. Only the few declarations we use.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstring>

#include "topo/clock_sampler.hpp"
#include "topo/topology.hpp"

namespace ferry {
namespace {

typedef struct nvmlDevice_st* nvmlDevice_t;
struct nvmlPciInfo_t {  // layout of NVML's nvmlPciInfo_st (v3)
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
constexpr unsigned kMaxLinks = 18;            // NVML_NVLINK_MAX_LINKS
constexpr int kRemoteSwitch = 2;              // NVML_NVLINK_DEVICE_TYPE_SWITCH
constexpr int kClockSm = 1;                   // NVML_CLOCK_SM
constexpr unsigned kFieldPowerInstant = 186;  // NVML_FI_DEV_POWER_INSTANT, milliwatts
struct nvmlFieldValue_t {                     // layout of NVML's nvmlFieldValue_st
  unsigned int fieldId, scopeId;
  long long timestamp, latencyUsec;
  int valueType, nvmlReturn;
  union {
    double d;
    unsigned int ui;
    unsigned long ul;
    unsigned long long ull;
    long long sll;
  } value;
};
constexpr int kValueUnsignedInt = 1, kValueUnsignedLong = 2, kValueUnsignedLongLong = 3;  // nvmlValueType_t

struct Nvml {
  void* lib = nullptr;
  int (*Init)() = nullptr;
  int (*Shutdown)() = nullptr;
  int (*HandleByPciBusId)(const char*, nvmlDevice_t*) = nullptr;
  int (*NvLinkState)(nvmlDevice_t, unsigned, int*) = nullptr;
  int (*NvLinkRemotePci)(nvmlDevice_t, unsigned, nvmlPciInfo_t*) = nullptr;
  int (*NvLinkRemoteType)(nvmlDevice_t, unsigned, int*) = nullptr;
  int (*TotalEnergy)(nvmlDevice_t, unsigned long long*) = nullptr;
  int (*ClockInfo)(nvmlDevice_t, int, unsigned int*) = nullptr;
  int (*FieldValues)(nvmlDevice_t, int, nvmlFieldValue_t*) = nullptr;
  int (*PowerUsage)(nvmlDevice_t, unsigned int*) = nullptr;
  int (*ClockReasons)(nvmlDevice_t, unsigned long long*) = nullptr;
  // Asked with no array: how many compute processes run (the struct's version does not matter then).
  int (*ComputeProcs)(nvmlDevice_t, unsigned int*, void*) = nullptr;

  bool ok = false;

  bool open() {
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return false;
    Init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    Shutdown = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlShutdown"));
    HandleByPciBusId = reinterpret_cast<decltype(HandleByPciBusId)>(dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2"));
    NvLinkState = reinterpret_cast<decltype(NvLinkState)>(dlsym(lib, "nvmlDeviceGetNvLinkState"));
    NvLinkRemotePci = reinterpret_cast<decltype(NvLinkRemotePci)>(dlsym(lib, "nvmlDeviceGetNvLinkRemotePciInfo_v2"));
    NvLinkRemoteType = reinterpret_cast<decltype(NvLinkRemoteType)>(dlsym(lib, "nvmlDeviceGetNvLinkRemoteDeviceType"));
    TotalEnergy = reinterpret_cast<decltype(TotalEnergy)>(dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption"));
    ClockInfo = reinterpret_cast<decltype(ClockInfo)>(dlsym(lib, "nvmlDeviceGetClockInfo"));
    FieldValues = reinterpret_cast<decltype(FieldValues)>(dlsym(lib, "nvmlDeviceGetFieldValues"));
    PowerUsage = reinterpret_cast<decltype(PowerUsage)>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
    // Renamed in r535; older drivers only have the throttle spelling.
    ClockReasons = reinterpret_cast<decltype(ClockReasons)>(dlsym(lib, "nvmlDeviceGetCurrentClocksEventReasons"));
    if (!ClockReasons)
      ClockReasons = reinterpret_cast<decltype(ClockReasons)>(dlsym(lib, "nvmlDeviceGetCurrentClocksThrottleReasons"));
    for (const char* name : {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2",
                             "nvmlDeviceGetComputeRunningProcesses"})
      if (!ComputeProcs) ComputeProcs = reinterpret_cast<decltype(ComputeProcs)>(dlsym(lib, name));
    return Init && Shutdown && HandleByPciBusId && NvLinkState && NvLinkRemotePci && Init() == 0;
  }
};

// Opened once and never closed: NVML may keep threads of its own, and
// unloading it under them crashed a benchmark process (the energy step,
// after several open/close cycles in one process).
Nvml& nvml_once() {
  static Nvml* n = [] {
    auto* x = new Nvml();
    x->ok = x->open();
    return x;
  }();
  return *n;
}

}  // namespace

long long total_energy_mj(const std::string& pci_bus_id) {
  Nvml& nvml = nvml_once();
  if (!nvml.ok || !nvml.TotalEnergy) return -1;
  nvmlDevice_t dev = nullptr;
  if (nvml.HandleByPciBusId(pci_bus_id.c_str(), &dev) != 0) return -1;
  unsigned long long mj = 0;
  if (nvml.TotalEnergy(dev, &mj) != 0) return -1;
  return static_cast<long long>(mj);
}

bool read_clocks(const std::string& pci_bus_id, ClockReading* out) {
  Nvml& nvml = nvml_once();
  if (!nvml.ok) return false;
  nvmlDevice_t dev = nullptr;
  if (nvml.HandleByPciBusId(pci_bus_id.c_str(), &dev) != 0) return false;
  ClockReading r;
  unsigned int mhz = 0;
  if (nvml.ClockInfo && nvml.ClockInfo(dev, kClockSm, &mhz) == 0) r.sm_mhz = static_cast<int>(mhz);
  // Instantaneous power where the driver has it: the plain query averages
  // over a second on Ampere and newer, longer than what we time.
  nvmlFieldValue_t f;
  std::memset(&f, 0, sizeof(f));
  f.fieldId = kFieldPowerInstant;
  if (nvml.FieldValues && nvml.FieldValues(dev, 1, &f) == 0 && f.nvmlReturn == 0) {
    if (f.valueType == kValueUnsignedInt) r.power_mw = f.value.ui;
    if (f.valueType == kValueUnsignedLong) r.power_mw = static_cast<long long>(f.value.ul);
    if (f.valueType == kValueUnsignedLongLong) r.power_mw = static_cast<long long>(f.value.ull);
  }
  unsigned int mw = 0;
  if (r.power_mw < 0 && nvml.PowerUsage && nvml.PowerUsage(dev, &mw) == 0) r.power_mw = mw;
  unsigned long long reasons = 0;
  if (nvml.ClockReasons && nvml.ClockReasons(dev, &reasons) == 0) r.reasons = reasons;
  *out = r;
  return true;
}

int gpu_compute_processes(int cuda_device) {
  constexpr int kInsufficientSize = 7;  // NVML_ERROR_INSUFFICIENT_SIZE: the count is set
  Nvml& nvml = nvml_once();
  if (!nvml.ok || !nvml.ComputeProcs) return -1;
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, cuda_device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  nvmlDevice_t dev = nullptr;
  if (nvml.HandleByPciBusId(bus, &dev) != 0) return -1;
  unsigned int count = 0;
  const int r = nvml.ComputeProcs(dev, &count, nullptr);
  if (r == 0) return 0;
  return r == kInsufficientSize ? static_cast<int>(count) : -1;
}

void fill_from_nvml(Topology& topo) {
  Nvml& nvml = nvml_once();
  if (!nvml.ok) return;
  for (auto& g : topo.gpus) {
    nvmlDevice_t dev = nullptr;
    if (nvml.HandleByPciBusId(g.pci_bus_id.c_str(), &dev) != 0) continue;
    for (unsigned link = 0; link < kMaxLinks; ++link) {
      int active = 0;
      if (nvml.NvLinkState(dev, link, &active) != 0 || !active) continue;
      int type = -1;
      if (nvml.NvLinkRemoteType && nvml.NvLinkRemoteType(dev, link, &type) == 0 && type == kRemoteSwitch) {
        ++g.nvswitch_links;
        continue;
      }
      nvmlPciInfo_t remote;
      std::memset(&remote, 0, sizeof(remote));
      if (nvml.NvLinkRemotePci(dev, link, &remote) != 0) continue;
      for (auto& peer : topo.gpus)
        if (same_pci_bus_id(peer.pci_bus_id, remote.busId)) ++topo.nvlink[g.index][peer.index];
    }
  }
}

}  // namespace ferry
