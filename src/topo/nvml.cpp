// NVML, opened with dlopen so that it stays optional: NUMA placement comes
// from sysfs, NVLink state from here. Only the few declarations we use.
#include <dlfcn.h>

#include <cstring>

#include "topo/topology.hpp"

namespace ferry {
namespace {

typedef struct nvmlDevice_st* nvmlDevice_t;
struct nvmlPciInfo_t {  // layout of NVML's nvmlPciInfo_st (v3)
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
constexpr unsigned kMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS
constexpr int kRemoteSwitch = 2;    // NVML_NVLINK_DEVICE_TYPE_SWITCH

struct Nvml {
  void* lib = nullptr;
  int (*Init)() = nullptr;
  int (*Shutdown)() = nullptr;
  int (*HandleByPciBusId)(const char*, nvmlDevice_t*) = nullptr;
  int (*NvLinkState)(nvmlDevice_t, unsigned, int*) = nullptr;
  int (*NvLinkRemotePci)(nvmlDevice_t, unsigned, nvmlPciInfo_t*) = nullptr;
  int (*NvLinkRemoteType)(nvmlDevice_t, unsigned, int*) = nullptr;
  int (*TotalEnergy)(nvmlDevice_t, unsigned long long*) = nullptr;

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
    return Init && Shutdown && HandleByPciBusId && NvLinkState && NvLinkRemotePci && Init() == 0;
  }
};

// Opened once and never closed: NVML may keep threads of its own, and
// unloading it under them crashed a benchmark process (2026-11-22, the energy
// step, after several open/close cycles in one process).
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
