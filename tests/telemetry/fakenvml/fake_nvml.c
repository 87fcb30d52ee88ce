/*
 * EMULATION FOR TESTS ONLY - NOT NVIDIA'S LIBRARY, NO GPU BEHIND IT.
 *
 * A small stand-in for libnvidia-ml.so.1 that implements the NVML functions gpufleet's NVML adapter (and
 * nvidia-ml-py's nvmlInit) call, so that the real adapter and the real nvidia-ml-py binding run end to end
 * on machines without an NVIDIA GPU. The tests build it with gcc into a temporary directory as
 * libnvidia-ml.so.1 and put that directory on LD_LIBRARY_PATH of a subprocess.
 *
 * The emulated GPUs come from a text file named by GPUFLEET_FAKE_NVML_CONFIG, read by nvmlInit. One
 * directive a line ('#' starts a comment):
 *
 *   driver <version>                  the driver version string
 *   unsupported <nvml function>       that function answers NVML_ERROR_NOT_SUPPORTED on every GPU
 *   gpu                               starts the next GPU (indices 0, 1, ... in file order)
 *   name <text to end of line>        e.g. "name NVIDIA A100-SXM4-80GB"
 *   uuid <text>  bus_id <text>
 *   memory_total|memory_used|memory_reserved <bytes>
 *   util_gpu|util_mem <percent> [<percent> ...]   up to 16 values, one per call, cycling (idle, busy, ...)
 *   power_mw|power_limit_mw <milliwatts>   temperature <C>   sm_clock <MHz>
 *   ecc_sbe|ecc_dbe <count>   pcie_tx_kb|pcie_rx_kb <KB/s>
 *   nvlink_tx_kib|nvlink_rx_kib <KiB>  NVLink data counters (fields 138/139) grow by this at every read
 *   link <peer GPU index> | link switch   an active NVLink to that GPU, or to an NVSwitch
 *   proc <pid> <bytes>                a compute process and its GPU memory
 *   procs_file <path>                 (global) more compute processes, re-read at every process query, one
 *                                     "<gpu index> <pid> <bytes>" a line: tests start processes after nvmlInit
 *                                     and name them here (a missing file: none)
 *
 * Without GPUFLEET_FAKE_NVML_CONFIG nvmlInit answers NVML_ERROR_DRIVER_NOT_LOADED. Functions not here
 * (XID events, ...) are simply absent: nvidia-ml-py then raises "Function Not Found", which
 * the adapter must tolerate.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GPUS 64
#define MAX_LINKS 18
#define MAX_PROCS 32
#define MAX_UNSUPPORTED 32
#define MAX_STEPS 16

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))
#define NVLINK_TYPE_GPU 0
#define NVLINK_TYPE_SWITCH 2
#define LINK_TO_SWITCH -1

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned int fieldId, scopeId;
    long long timestamp, latencyUsec;
    int valueType, nvmlReturn;
    unsigned long long value; /* the union's ullVal */
} nvmlFieldValue_t;

#define FI_NVLINK_THROUGHPUT_DATA_TX 138
#define FI_NVLINK_THROUGHPUT_DATA_RX 139
#define VALUE_TYPE_UNSIGNED_LONG_LONG 3

typedef struct {
    char name[96], uuid[96], bus_id[32];
    unsigned long long memory_total, memory_used, memory_reserved;
    unsigned int util_gpu[MAX_STEPS], util_mem[MAX_STEPS];
    int n_util_gpu, n_util_mem, util_calls;
    unsigned int power_mw, power_limit_mw, temperature, sm_clock, pcie_tx_kb, pcie_rx_kb;
    unsigned long long ecc_sbe, ecc_dbe;
    unsigned long long nvlink_tx_step, nvlink_rx_step, nvlink_tx, nvlink_rx;
    int links[MAX_LINKS];
    int n_links;
    nvmlProcessInfo_v2_t procs[MAX_PROCS];
    int n_procs;
} fake_gpu;

static fake_gpu gpus[MAX_GPUS];
static int n_gpus = 0;
static int initialised = 0;
static char driver[80] = "000.00-gpufleet-fake-nvml";
static char unsupported[MAX_UNSUPPORTED][64];
static int n_unsupported = 0;
static char procs_file[400] = "";

static int is_unsupported(const char *fn) {
    for (int i = 0; i < n_unsupported; i++)
        if (strcmp(unsupported[i], fn) == 0) return 1;
    return 0;
}

static fake_gpu *gpu_of(void *device) {
    fake_gpu *g = (fake_gpu *)device;
    if (!initialised || g < gpus || g >= gpus + n_gpus) return NULL;
    return g;
}

#define DEVICE_OR_FAIL(fn)                                              \
    fake_gpu *g = gpu_of(device);                                       \
    if (!initialised) return NVML_ERROR_UNINITIALIZED;                  \
    if (g == NULL) return NVML_ERROR_INVALID_ARGUMENT;                  \
    if (is_unsupported(fn)) return NVML_ERROR_NOT_SUPPORTED;

static void copy_rest(char *dst, size_t size, const char *src) {
    while (*src == ' ' || *src == '\t') src++;
    snprintf(dst, size, "%s", src);
    size_t len = strlen(dst);
    while (len > 0 && (dst[len - 1] == '\n' || dst[len - 1] == '\r' || dst[len - 1] == ' ')) dst[--len] = '\0';
}

static int parse_steps(const char *text, unsigned int *steps) {
    int n = 0;
    char *end = NULL;
    while (n < MAX_STEPS) {
        unsigned long v = strtoul(text, &end, 10);
        if (end == text) break;
        steps[n++] = (unsigned int)v;
        text = end;
    }
    return n;
}

static int load_config(const char *path) {
    FILE *f = fopen(path, "r");
    if (f == NULL) return NVML_ERROR_UNKNOWN;
    char line[512], key[64];
    fake_gpu *g = NULL;
    n_gpus = 0;
    n_unsupported = 0;
    procs_file[0] = '\0';
    while (fgets(line, sizeof line, f) != NULL) {
        int offset = 0;
        if (line[0] == '#' || sscanf(line, "%63s%n", key, &offset) != 1) continue;
        const char *rest = line + offset;
        if (strcmp(key, "gpu") == 0) {
            if (n_gpus == MAX_GPUS) break;
            g = &gpus[n_gpus++];
            memset(g, 0, sizeof *g);
            snprintf(g->name, sizeof g->name, "NVIDIA A100-SXM4-80GB");
            snprintf(g->uuid, sizeof g->uuid, "GPU-fake-%d", n_gpus - 1);
            snprintf(g->bus_id, sizeof g->bus_id, "00000000:%02X:00.0", 0x10 + n_gpus - 1);
            g->memory_total = 85899345920ULL;
            g->power_limit_mw = 400000;
            continue;
        }
        if (strcmp(key, "driver") == 0) { copy_rest(driver, sizeof driver, rest); continue; }
        if (strcmp(key, "procs_file") == 0) { copy_rest(procs_file, sizeof procs_file, rest); continue; }
        if (strcmp(key, "unsupported") == 0) {
            if (n_unsupported < MAX_UNSUPPORTED) copy_rest(unsupported[n_unsupported++], 64, rest);
            continue;
        }
        if (g == NULL) continue;
        unsigned long long v = strtoull(rest, NULL, 10);
        if (strcmp(key, "name") == 0) copy_rest(g->name, sizeof g->name, rest);
        else if (strcmp(key, "uuid") == 0) copy_rest(g->uuid, sizeof g->uuid, rest);
        else if (strcmp(key, "bus_id") == 0) copy_rest(g->bus_id, sizeof g->bus_id, rest);
        else if (strcmp(key, "memory_total") == 0) g->memory_total = v;
        else if (strcmp(key, "memory_used") == 0) g->memory_used = v;
        else if (strcmp(key, "memory_reserved") == 0) g->memory_reserved = v;
        else if (strcmp(key, "util_gpu") == 0) g->n_util_gpu = parse_steps(rest, g->util_gpu);
        else if (strcmp(key, "util_mem") == 0) g->n_util_mem = parse_steps(rest, g->util_mem);
        else if (strcmp(key, "power_mw") == 0) g->power_mw = (unsigned)v;
        else if (strcmp(key, "power_limit_mw") == 0) g->power_limit_mw = (unsigned)v;
        else if (strcmp(key, "temperature") == 0) g->temperature = (unsigned)v;
        else if (strcmp(key, "sm_clock") == 0) g->sm_clock = (unsigned)v;
        else if (strcmp(key, "ecc_sbe") == 0) g->ecc_sbe = v;
        else if (strcmp(key, "ecc_dbe") == 0) g->ecc_dbe = v;
        else if (strcmp(key, "nvlink_tx_kib") == 0) g->nvlink_tx_step = v;
        else if (strcmp(key, "nvlink_rx_kib") == 0) g->nvlink_rx_step = v;
        else if (strcmp(key, "pcie_tx_kb") == 0) g->pcie_tx_kb = (unsigned)v;
        else if (strcmp(key, "pcie_rx_kb") == 0) g->pcie_rx_kb = (unsigned)v;
        else if (strcmp(key, "link") == 0 && g->n_links < MAX_LINKS) {
            char peer[32] = "";
            copy_rest(peer, sizeof peer, rest);
            g->links[g->n_links++] = strcmp(peer, "switch") == 0 ? LINK_TO_SWITCH : atoi(peer);
        } else if (strcmp(key, "proc") == 0 && g->n_procs < MAX_PROCS) {
            nvmlProcessInfo_v2_t *p = &g->procs[g->n_procs++];
            char *end = NULL;
            p->pid = (unsigned)strtoul(rest, &end, 10);
            p->usedGpuMemory = strtoull(end, NULL, 10);
            p->gpuInstanceId = 0xFFFFFFFFu;
            p->computeInstanceId = 0xFFFFFFFFu;
        }
    }
    fclose(f);
    return NVML_SUCCESS;
}

int nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    const char *path = getenv("GPUFLEET_FAKE_NVML_CONFIG");
    if (path == NULL || *path == '\0') return NVML_ERROR_DRIVER_NOT_LOADED;
    int ret = load_config(path);
    if (ret == NVML_SUCCESS) initialised = 1;
    return ret;
}
int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlInit(void) { return nvmlInitWithFlags(0); }
int nvmlShutdown(void) { return NVML_SUCCESS; }

const char *nvmlErrorString(int result) {
    switch (result) {
        case NVML_SUCCESS: return "Success";
        case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
        case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
        case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
        case NVML_ERROR_NOT_FOUND: return "Not Found";
        case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
        case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
        case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
        default: return "Unknown Error";
    }
}

static int copy_out(char *dst, unsigned int length, const char *src) {
    if (dst == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    return copy_out(version, length, driver);
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned)n_gpus;
    return NVML_SUCCESS;
}
int nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= (unsigned)n_gpus) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}
int nvmlDeviceGetHandleByIndex(unsigned int index, void **device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

int nvmlDeviceGetName(void *device, char *name, unsigned int length) {
    DEVICE_OR_FAIL("nvmlDeviceGetName");
    return copy_out(name, length, g->name);
}

int nvmlDeviceGetUUID(void *device, char *uuid, unsigned int length) {
    DEVICE_OR_FAIL("nvmlDeviceGetUUID");
    return copy_out(uuid, length, g->uuid);
}

int nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory) {
    DEVICE_OR_FAIL("nvmlDeviceGetMemoryInfo");
    if (memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    /* v1 counts the driver's reserve as used, as the real v1 does. */
    memory->total = g->memory_total;
    memory->used = g->memory_used + g->memory_reserved;
    memory->free = g->memory_total - memory->used;
    return NVML_SUCCESS;
}

int nvmlDeviceGetMemoryInfo_v2(void *device, nvmlMemory_v2_t *memory) {
    DEVICE_OR_FAIL("nvmlDeviceGetMemoryInfo_v2");
    if (memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = g->memory_total;
    memory->reserved = g->memory_reserved;
    memory->used = g->memory_used;
    memory->free = g->memory_total - g->memory_used - g->memory_reserved;
    return NVML_SUCCESS;
}

int nvmlDeviceGetUtilizationRates(void *device, nvmlUtilization_t *util) {
    DEVICE_OR_FAIL("nvmlDeviceGetUtilizationRates");
    if (util == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    int step = g->util_calls++;
    util->gpu = g->n_util_gpu ? g->util_gpu[step % g->n_util_gpu] : 0;
    util->memory = g->n_util_mem ? g->util_mem[step % g->n_util_mem] : 0;
    return NVML_SUCCESS;
}

int nvmlDeviceGetPowerUsage(void *device, unsigned int *power) {
    DEVICE_OR_FAIL("nvmlDeviceGetPowerUsage");
    if (power == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *power = g->power_mw;
    return NVML_SUCCESS;
}

int nvmlDeviceGetEnforcedPowerLimit(void *device, unsigned int *limit) {
    DEVICE_OR_FAIL("nvmlDeviceGetEnforcedPowerLimit");
    if (limit == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *limit = g->power_limit_mw;
    return NVML_SUCCESS;
}

int nvmlDeviceGetTemperature(void *device, int sensor, unsigned int *temp) {
    DEVICE_OR_FAIL("nvmlDeviceGetTemperature");
    if (temp == NULL || sensor != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = g->temperature;
    return NVML_SUCCESS;
}

int nvmlDeviceGetClockInfo(void *device, int type, unsigned int *clock) {
    DEVICE_OR_FAIL("nvmlDeviceGetClockInfo");
    if (clock == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (type != 1) return NVML_ERROR_NOT_SUPPORTED; /* only the SM clock is emulated */
    *clock = g->sm_clock;
    return NVML_SUCCESS;
}

int nvmlDeviceGetTotalEccErrors(void *device, int error_type, int counter_type, unsigned long long *count) {
    DEVICE_OR_FAIL("nvmlDeviceGetTotalEccErrors");
    if (count == NULL || counter_type != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *count = error_type == 0 ? g->ecc_sbe : g->ecc_dbe;
    return NVML_SUCCESS;
}

int nvmlDeviceGetPcieThroughput(void *device, int counter, unsigned int *value) {
    DEVICE_OR_FAIL("nvmlDeviceGetPcieThroughput");
    if (value == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *value = counter == 0 ? g->pcie_tx_kb : g->pcie_rx_kb;
    return NVML_SUCCESS;
}

/* The GPU's processes: its `proc` lines, then those `procs_file` names for it now. */
static int gpu_procs(fake_gpu *g, nvmlProcessInfo_v2_t *out) {
    int n = g->n_procs;
    memcpy(out, g->procs, sizeof(nvmlProcessInfo_v2_t) * (size_t)n);
    if (procs_file[0] == '\0') return n;
    FILE *f = fopen(procs_file, "r");
    if (f == NULL) return n;
    int index = (int)(g - gpus);
    char line[128];
    while (n < MAX_PROCS && fgets(line, sizeof line, f) != NULL) {
        int gpu = -1;
        unsigned int pid = 0;
        unsigned long long used = 0;
        if (sscanf(line, "%d %u %llu", &gpu, &pid, &used) != 3 || gpu != index) continue;
        out[n].pid = pid;
        out[n].usedGpuMemory = used;
        out[n].gpuInstanceId = 0xFFFFFFFFu;
        out[n].computeInstanceId = 0xFFFFFFFFu;
        n++;
    }
    fclose(f);
    return n;
}

int nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *count, nvmlProcessInfo_v2_t *infos) {
    DEVICE_OR_FAIL("nvmlDeviceGetComputeRunningProcesses_v3");
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlProcessInfo_v2_t procs[MAX_PROCS];
    int n = gpu_procs(g, procs);
    if (*count < (unsigned)n) {
        *count = (unsigned)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = (unsigned)n;
    if (n > 0) {
        if (infos == NULL) return NVML_ERROR_INVALID_ARGUMENT;
        memcpy(infos, procs, sizeof(nvmlProcessInfo_v2_t) * (size_t)n);
    }
    return NVML_SUCCESS;
}

static void fill_pci(nvmlPciInfo_t *pci, const char *bus_id) {
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", bus_id + (strlen(bus_id) > 12 ? 4 : 0));
    unsigned domain = 0, bus = 0, dev = 0;
    sscanf(bus_id, "%x:%x:%x", &domain, &bus, &dev);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = 0x20B510DEu;
}

int nvmlDeviceGetPciInfo_v3(void *device, nvmlPciInfo_t *pci) {
    DEVICE_OR_FAIL("nvmlDeviceGetPciInfo_v3");
    if (pci == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    fill_pci(pci, g->bus_id);
    return NVML_SUCCESS;
}

int nvmlDeviceGetNvLinkState(void *device, unsigned int link, int *active) {
    DEVICE_OR_FAIL("nvmlDeviceGetNvLinkState");
    if (active == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (g->n_links == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned)g->n_links) return NVML_ERROR_INVALID_ARGUMENT;
    *active = 1;
    return NVML_SUCCESS;
}

int nvmlDeviceGetNvLinkRemoteDeviceType(void *device, unsigned int link, int *type) {
    DEVICE_OR_FAIL("nvmlDeviceGetNvLinkRemoteDeviceType");
    if (type == NULL || link >= (unsigned)g->n_links) return NVML_ERROR_INVALID_ARGUMENT;
    *type = g->links[link] == LINK_TO_SWITCH ? NVLINK_TYPE_SWITCH : NVLINK_TYPE_GPU;
    return NVML_SUCCESS;
}

int nvmlDeviceGetNvLinkRemotePciInfo_v2(void *device, unsigned int link, nvmlPciInfo_t *pci) {
    DEVICE_OR_FAIL("nvmlDeviceGetNvLinkRemotePciInfo_v2");
    if (pci == NULL || link >= (unsigned)g->n_links) return NVML_ERROR_INVALID_ARGUMENT;
    int peer = g->links[link];
    if (peer == LINK_TO_SWITCH) fill_pci(pci, "00000000:C0:00.0");
    else if (peer >= 0 && peer < n_gpus) fill_pci(pci, gpus[peer].bus_id);
    else return NVML_ERROR_NOT_FOUND;
    return NVML_SUCCESS;
}

int nvmlDeviceGetFieldValues(void *device, int count, nvmlFieldValue_t *values) {
    DEVICE_OR_FAIL("nvmlDeviceGetFieldValues");
    if (values == NULL || count < 0) return NVML_ERROR_INVALID_ARGUMENT;
    /* The cumulative NVLink data counters advance once per read, as if traffic flowed between reads. */
    g->nvlink_tx += g->nvlink_tx_step;
    g->nvlink_rx += g->nvlink_rx_step;
    for (int i = 0; i < count; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->valueType = VALUE_TYPE_UNSIGNED_LONG_LONG;
        v->nvmlReturn = NVML_SUCCESS;
        if (v->fieldId == FI_NVLINK_THROUGHPUT_DATA_TX) v->value = g->nvlink_tx;
        else if (v->fieldId == FI_NVLINK_THROUGHPUT_DATA_RX) v->value = g->nvlink_rx;
        else v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
    }
    return NVML_SUCCESS;
}
