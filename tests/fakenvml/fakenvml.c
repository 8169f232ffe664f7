/*
 * A stand-in for the NVIDIA driver's libnvidia-ml.so.1, for running the unmodified
 * nvidia-ml-py (pynvml) and gpushare's two nvml backends on a machine without a GPU.
 *
 * It implements the NVML functions gpushare and pynvml's nvmlInit call, with the
 * structure layouts of NVML's nvml.h (as pynvml's ctypes mirror them), and answers from
 * a "world" file named by the environment variable FAKE_NVML_CONFIG. The file is read
 * again whenever it changes (inode, size or mtime), so a test can change the world while
 * a process runs; write it to a temp file and rename it over the old one.
 *
 * The world, one record per line ('#' starts a comment):
 *
 *   driver 550.54.15
 *   init DRIVER_NOT_LOADED                 nvmlInit fails with this error
 *   fail nvmlDeviceGetRemappedRows NOT_SUPPORTED [gpu=1]
 *                                          that function fails (on every GPU, or one);
 *                                          a trailing _vN of the name is ignored
 *   gpu uuid=GPU-... minor=0 total=BYTES [used=BYTES] [reserved=BYTES] [util=PCT] [memutil=PCT]
 *       [retired_sbe=N] [retired_dbe=N] [retired_pending=0|1]
 *       [remapped=CORRECTED,UNCORRECTED,PENDING,FAILURE]
 *       [ecc_corrected=N] [ecc_uncorrected=N] [events=MASK] name=NAME TO END OF LINE
 *                                          one GPU; the index is its order among gpu lines.
 *                                          used defaults to the sum of its processes;
 *                                          reserved (0) is what _v2 of the memory info
 *                                          reports the driver keeps
 *   process gpu=0 pid=PID used=BYTES|- [sm=PCT|-]
 *                                          a compute process; used=- is "not available",
 *                                          sm=- gives no utilisation samples. A PID that does
 *                                          not exist (or is a zombie) is not reported, as the
 *                                          driver drops a context when its process exits
 *   event gpu=0 type=MASK data=N           an NVML event (8 = XID, data the XID; 2 =
 *                                          double-bit ECC). Events are a log: append only.
 *
 * Events already in the file when a process first reads it are history and never
 * delivered; each later one is delivered once to every event set registered for its GPU
 * and type (also when the set registers after the event appeared). Rewriting the file
 * with fewer events makes the remaining ones history.
 *
 * FAKE_NVML_LOG, when set, names a file the fake appends one line to per call:
 * "<function> <gpu index or -> <return code>".
 */

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_VALUE_NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFULL
#define NO_INSTANCE 0xFFFFFFFFu

/* Layouts of nvml.h, as pynvml's ctypes structures declare them. */
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct nvmlDevice_st {
    char opaque; /* a handle is &handles[index] */
} *nvmlDevice_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

#define MAX_GPUS 16
#define MAX_PROCESSES 512
#define MAX_EVENTS 4096
#define MAX_FAILURES 64
#define MAX_SETS 16
#define TEXT 96

typedef struct {
    char uuid[TEXT], name[TEXT];
    unsigned int minor, util, memutil, retired_sbe, retired_dbe, retired_pending;
    unsigned int remapped[4];
    unsigned long long total, used, reserved, ecc_corrected, ecc_uncorrected, events;
    int used_given;
} Gpu;

typedef struct {
    int gpu;
    unsigned int pid;
    unsigned long long used;
    int sm; /* -1: no samples */
} Process;

typedef struct {
    int gpu;
    unsigned long long type, data;
} Event;

typedef struct {
    char function[64];
    int gpu; /* -1: every GPU */
    nvmlReturn_t error;
} Failure;

typedef struct {
    char driver[TEXT];
    nvmlReturn_t init_error;
    int gpus, processes, events, failures;
    Gpu gpu[MAX_GPUS];
    Process process[MAX_PROCESSES];
    Event event[MAX_EVENTS];
    Failure failure[MAX_FAILURES];
} World;

typedef struct nvmlEventSet_st {
    int used;
    unsigned long long mask[MAX_GPUS];
    int next[MAX_GPUS]; /* the first event not yet considered, per GPU */
} EventSet;
typedef EventSet *nvmlEventSet_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static World world, loading;
static int loaded, initialised;
static char world_path[4096];
static struct stat world_stat;
static int history; /* events that were in the file before this process looked */
static struct nvmlDevice_st handles[MAX_GPUS];
static EventSet sets[MAX_SETS];

static const struct {
    const char *name;
    nvmlReturn_t code;
    const char *text;
} errors[] = {
    {"SUCCESS", 0, "Success"},
    {"UNINITIALIZED", 1, "Uninitialized"},
    {"INVALID_ARGUMENT", 2, "Invalid Argument"},
    {"NOT_SUPPORTED", 3, "Not Supported"},
    {"NO_PERMISSION", 4, "Insufficient Permissions"},
    {"ALREADY_INITIALIZED", 5, "Already Initialized"},
    {"NOT_FOUND", 6, "Not Found"},
    {"INSUFFICIENT_SIZE", 7, "Insufficient Size"},
    {"INSUFFICIENT_POWER", 8, "Insufficient External Power"},
    {"DRIVER_NOT_LOADED", 9, "Driver Not Loaded"},
    {"TIMEOUT", 10, "Timeout"},
    {"IRQ_ISSUE", 11, "Interrupt Request Issue"},
    {"LIBRARY_NOT_FOUND", 12, "NVML Shared Library Not Found"},
    {"FUNCTION_NOT_FOUND", 13, "Function Not Found"},
    {"CORRUPTED_INFOROM", 14, "Corrupted infoROM"},
    {"GPU_IS_LOST", 15, "GPU is lost"},
    {"RESET_REQUIRED", 16, "GPU requires restart"},
    {"OPERATING_SYSTEM", 17, "The operating system has blocked the request."},
    {"LIB_RM_VERSION_MISMATCH", 18, "RM has detected an NVML/RM version mismatch."},
    {"IN_USE", 19, "In use by another client"},
    {"MEMORY", 20, "Insufficient Memory"},
    {"NO_DATA", 21, "No data"},
    {"UNKNOWN", 999, "Unknown Error"},
};

/* ----- reading the world */

static void complain(const char *path, int line, const char *format, ...) {
    va_list args;
    va_start(args, format);
    fprintf(stderr, "fakenvml: %s:%d: ", path, line);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
}

static int parse_error(const char *text, nvmlReturn_t *code) {
    const char *name = strncmp(text, "NVML_ERROR_", 11) == 0 ? text + 11 : text;
    char *end;
    long number = strtol(text, &end, 10);
    if (*text && *end == '\0') {
        *code = (nvmlReturn_t)number;
        return 1;
    }
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++) {
        if (strcmp(errors[i].name, name) == 0) {
            *code = errors[i].code;
            return 1;
        }
    }
    return 0;
}

static int parse_number(const char *text, unsigned long long *value) {
    char *end;
    errno = 0;
    *value = strtoull(text, &end, 0);
    return *text && *end == '\0' && errno == 0;
}

/* The value of key=... in a line of space-separated tokens, copied into out. */
static int field(const char *line, const char *key, char *out, size_t size) {
    size_t length = strlen(key);
    for (const char *at = line; (at = strstr(at, key)) != NULL; at += length) {
        if ((at == line || at[-1] == ' ' || at[-1] == '\t') && at[length] == '=') {
            const char *value = at + length + 1;
            size_t n = strcspn(value, " \t");
            if (n >= size) n = size - 1;
            memcpy(out, value, n);
            out[n] = '\0';
            return 1;
        }
    }
    return 0;
}

static int number_field(const char *path, int line_no, const char *line, const char *key,
                        unsigned long long *value) {
    char text[TEXT];
    if (!field(line, key, text, sizeof text)) return 0;
    if (!parse_number(text, value)) {
        complain(path, line_no, "%s=%s is not a number", key, text);
        return 0;
    }
    return 1;
}

static int gpu_field(const char *path, int line_no, const char *line, int *gpu) {
    unsigned long long value;
    if (!number_field(path, line_no, line, "gpu", &value) || value >= MAX_GPUS) {
        complain(path, line_no, "needs gpu=<index below %d>", MAX_GPUS);
        return 0;
    }
    *gpu = (int)value;
    return 1;
}

static void parse_gpu(const char *path, int line_no, const char *line, World *into) {
    if (into->gpus == MAX_GPUS) {
        complain(path, line_no, "more than %d GPUs", MAX_GPUS);
        return;
    }
    Gpu *gpu = &into->gpu[into->gpus];
    memset(gpu, 0, sizeof *gpu);
    unsigned long long value;
    gpu->minor = (unsigned int)into->gpus;
    gpu->events = 0xb; /* single- and double-bit ECC, XID */
    if (!field(line, "uuid", gpu->uuid, sizeof gpu->uuid)) {
        complain(path, line_no, "a gpu needs uuid=");
        return;
    }
    const char *name = strstr(line, " name=");
    snprintf(gpu->name, sizeof gpu->name, "%s", name ? name + 6 : "Fake GPU");
    number_field(path, line_no, line, "total", &gpu->total);
    gpu->used_given = number_field(path, line_no, line, "used", &gpu->used);
    number_field(path, line_no, line, "reserved", &gpu->reserved);
    if (number_field(path, line_no, line, "minor", &value)) gpu->minor = (unsigned int)value;
    if (number_field(path, line_no, line, "util", &value)) gpu->util = (unsigned int)value;
    if (number_field(path, line_no, line, "memutil", &value)) gpu->memutil = (unsigned int)value;
    if (number_field(path, line_no, line, "retired_sbe", &value))
        gpu->retired_sbe = (unsigned int)value;
    if (number_field(path, line_no, line, "retired_dbe", &value))
        gpu->retired_dbe = (unsigned int)value;
    if (number_field(path, line_no, line, "retired_pending", &value))
        gpu->retired_pending = value != 0;
    number_field(path, line_no, line, "ecc_corrected", &gpu->ecc_corrected);
    number_field(path, line_no, line, "ecc_uncorrected", &gpu->ecc_uncorrected);
    number_field(path, line_no, line, "events", &gpu->events);
    char rows[TEXT];
    if (field(line, "remapped", rows, sizeof rows) &&
        sscanf(rows, "%u,%u,%u,%u", &gpu->remapped[0], &gpu->remapped[1], &gpu->remapped[2],
               &gpu->remapped[3]) != 4)
        complain(path, line_no, "remapped=%s is not CORRECTED,UNCORRECTED,PENDING,FAILURE", rows);
    into->gpus++;
}

static void parse_process(const char *path, int line_no, const char *line, World *into) {
    if (into->processes == MAX_PROCESSES) {
        complain(path, line_no, "more than %d processes", MAX_PROCESSES);
        return;
    }
    Process *process = &into->process[into->processes];
    unsigned long long value;
    char text[TEXT];
    if (!gpu_field(path, line_no, line, &process->gpu)) return;
    if (!number_field(path, line_no, line, "pid", &value)) {
        complain(path, line_no, "a process needs pid=");
        return;
    }
    process->pid = (unsigned int)value;
    process->used = 0;
    if (field(line, "used", text, sizeof text)) {
        if (strcmp(text, "-") == 0)
            process->used = NVML_VALUE_NOT_AVAILABLE;
        else if (!parse_number(text, &process->used))
            complain(path, line_no, "used=%s is not a number or -", text);
    }
    process->sm = -1;
    if (field(line, "sm", text, sizeof text) && strcmp(text, "-") != 0) process->sm = atoi(text);
    into->processes++;
}

static void parse_event(const char *path, int line_no, const char *line, World *into) {
    if (into->events == MAX_EVENTS) {
        complain(path, line_no, "more than %d events", MAX_EVENTS);
        return;
    }
    Event *event = &into->event[into->events];
    if (!gpu_field(path, line_no, line, &event->gpu)) return;
    if (!number_field(path, line_no, line, "type", &event->type)) {
        complain(path, line_no, "an event needs type=");
        return;
    }
    event->data = 0;
    number_field(path, line_no, line, "data", &event->data);
    into->events++;
}

static void parse_failure(const char *path, int line_no, const char *line, World *into) {
    char function[64], error[TEXT];
    if (sscanf(line, "fail %63s %95s", function, error) != 2 || into->failures == MAX_FAILURES) {
        complain(path, line_no, "expected: fail <function> <error> [gpu=N]");
        return;
    }
    Failure *failure = &into->failure[into->failures];
    if (!parse_error(error, &failure->error)) {
        complain(path, line_no, "unknown error %s", error);
        return;
    }
    snprintf(failure->function, sizeof failure->function, "%s", function);
    failure->gpu = -1;
    if (strstr(line, " gpu=") && !gpu_field(path, line_no, line, &failure->gpu)) return;
    into->failures++;
}

static void parse_line(const char *path, int line_no, char *line, World *into) {
    char *comment = strchr(line, '#');
    if (comment) *comment = '\0';
    size_t n = strlen(line);
    while (n && (line[n - 1] == ' ' || line[n - 1] == '\t' || line[n - 1] == '\r')) line[--n] = '\0';
    while (*line == ' ' || *line == '\t') line++;
    char word[16] = "";
    sscanf(line, "%15s", word);
    if (word[0] == '\0') return;
    if (strcmp(word, "driver") == 0) {
        sscanf(line, "driver %95s", into->driver);
    } else if (strcmp(word, "init") == 0) {
        char error[TEXT] = "";
        sscanf(line, "init %95s", error);
        if (!parse_error(error, &into->init_error))
            complain(path, line_no, "unknown error %s", error);
    } else if (strcmp(word, "fail") == 0) {
        parse_failure(path, line_no, line, into);
    } else if (strcmp(word, "gpu") == 0) {
        parse_gpu(path, line_no, line, into);
    } else if (strcmp(word, "process") == 0) {
        parse_process(path, line_no, line, into);
    } else if (strcmp(word, "event") == 0) {
        parse_event(path, line_no, line, into);
    } else {
        complain(path, line_no, "unknown record %s", word);
    }
}

static int parse_file(const char *path, World *into) {
    FILE *file = fopen(path, "r");
    if (!file) return 0;
    memset(into, 0, sizeof *into);
    snprintf(into->driver, sizeof into->driver, "550.54.15");
    char line[1024];
    for (int line_no = 1; fgets(line, sizeof line, file); line_no++) {
        line[strcspn(line, "\n")] = '\0';
        parse_line(path, line_no, line, into);
    }
    fclose(file);
    return 1;
}

/* Reads the world again if its file changed; false when there is none. */
static int refresh(void) {
    const char *path = getenv("FAKE_NVML_CONFIG");
    struct stat now;
    if (!path || !*path || stat(path, &now) != 0) {
        loaded = 0;
        return 0;
    }
    int same_file = strcmp(path, world_path) == 0;
    if (loaded && same_file && now.st_ino == world_stat.st_ino && now.st_dev == world_stat.st_dev &&
        now.st_size == world_stat.st_size && now.st_mtim.tv_sec == world_stat.st_mtim.tv_sec &&
        now.st_mtim.tv_nsec == world_stat.st_mtim.tv_nsec)
        return 1;
    if (!parse_file(path, &loading)) {
        loaded = 0;
        return 0;
    }
    if (!same_file) initialised = 0; /* another world: nvmlInit it anew */
    if (!same_file || loading.events < world.events) {
        /* A new world, or a rewritten log: what is there now is history. */
        history = loading.events;
        for (int s = 0; s < MAX_SETS; s++)
            for (int g = 0; g < MAX_GPUS; g++) sets[s].next[g] = history;
    }
    world = loading;
    world_stat = now;
    snprintf(world_path, sizeof world_path, "%s", path);
    loaded = 1;
    return 1;
}

/* ----- every call: lock, world, initialised, the device, configured failures, log */

static const char *current_function;
static int current_gpu;

static const char *without_version(const char *name, size_t *length) {
    const char *suffix = strrchr(name, '_');
    *length = strlen(name);
    if (suffix && suffix[1] == 'v' && suffix[2] && strspn(suffix + 2, "0123456789") == strlen(suffix + 2))
        *length = (size_t)(suffix - name);
    return name;
}

static int same_function(const char *a, const char *b) {
    size_t la, lb;
    without_version(a, &la);
    without_version(b, &lb);
    return la == lb && strncmp(a, b, la) == 0;
}

static nvmlReturn_t configured_failure(const char *function, int gpu) {
    for (int i = 0; i < world.failures; i++) {
        Failure *failure = &world.failure[i];
        if (same_function(failure->function, function) && (failure->gpu < 0 || failure->gpu == gpu))
            return failure->error;
    }
    return NVML_SUCCESS;
}

/* Locks; the answer stands unless it is not NVML_SUCCESS. Pair with finish(). */
static nvmlReturn_t begin(const char *function) {
    pthread_mutex_lock(&lock);
    current_function = function;
    current_gpu = -1;
    if (!refresh() || !initialised) return NVML_ERROR_UNINITIALIZED;
    return configured_failure(function, -1);
}

static int device_index(nvmlDevice_t device) {
    if (device < handles || device >= handles + MAX_GPUS) return -1;
    int index = (int)(device - handles);
    return index < world.gpus ? index : -1;
}

static nvmlReturn_t begin_device(const char *function, nvmlDevice_t device, Gpu **gpu) {
    nvmlReturn_t ret = begin(function);
    if (ret != NVML_SUCCESS) return ret;
    int index = device_index(device);
    if (index < 0) return NVML_ERROR_INVALID_ARGUMENT;
    current_gpu = index;
    *gpu = &world.gpu[index];
    return configured_failure(function, index);
}

static nvmlReturn_t finish(nvmlReturn_t ret) {
    const char *log_path = getenv("FAKE_NVML_LOG");
    if (log_path && *log_path) {
        FILE *log = fopen(log_path, "a");
        if (log) {
            if (current_gpu < 0)
                fprintf(log, "%s - %d\n", current_function, ret);
            else
                fprintf(log, "%s %d %d\n", current_function, current_gpu, ret);
            fclose(log);
        }
    }
    pthread_mutex_unlock(&lock);
    return ret;
}

static nvmlReturn_t copy_text(char *out, unsigned int length, const char *text) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

/* Whether a process still runs here: the driver drops the context of one that exited. */
static int running(unsigned int pid) {
    char path[64], stat_line[512];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    FILE *file = fopen(path, "r");
    if (!file) return 0;
    size_t n = fread(stat_line, 1, sizeof stat_line - 1, file);
    fclose(file);
    stat_line[n] = '\0';
    const char *end = strrchr(stat_line, ')');
    return end && end[1] == ' ' && end[2] != 'Z' && end[2] != 'X';
}

static int processes_of(int gpu, const Process **found) {
    int n = 0;
    for (int i = 0; i < world.processes; i++)
        if (world.process[i].gpu == gpu && running(world.process[i].pid))
            found[n++] = &world.process[i];
    return n;
}

/* ----- initialisation and the system */

static nvmlReturn_t init(const char *function) {
    pthread_mutex_lock(&lock);
    current_function = function;
    current_gpu = -1;
    nvmlReturn_t ret = NVML_SUCCESS;
    if (!refresh()) {
        const char *path = getenv("FAKE_NVML_CONFIG");
        fprintf(stderr, "fakenvml: no world: FAKE_NVML_CONFIG %s%s\n",
                path && *path ? "names no readable file: " : "is not set",
                path && *path ? path : "");
        ret = NVML_ERROR_DRIVER_NOT_LOADED;
    } else if (world.init_error != NVML_SUCCESS) {
        ret = world.init_error;
    } else {
        initialised++;
    }
    return finish(ret);
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return init(__func__);
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return init(__func__); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    nvmlReturn_t ret = begin(__func__);
    if (ret == NVML_SUCCESS) initialised--;
    return finish(ret);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++)
        if (errors[i].code == result) return errors[i].text;
    return "Unknown Error";
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t ret = begin(__func__);
    if (ret == NVML_SUCCESS) ret = copy_text(version, length, world.driver);
    return finish(ret);
}

/* ----- devices */

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    nvmlReturn_t ret = begin(__func__);
    if (ret == NVML_SUCCESS) {
        if (count)
            *count = (unsigned int)world.gpus;
        else
            ret = NVML_ERROR_INVALID_ARGUMENT;
    }
    return finish(ret);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    nvmlReturn_t ret = begin(__func__);
    if (ret == NVML_SUCCESS) {
        if (!device || index >= (unsigned int)world.gpus) {
            ret = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            current_gpu = (int)index;
            ret = configured_failure(__func__, (int)index);
            if (ret == NVML_SUCCESS) *device = &handles[index];
        }
    }
    return finish(ret);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    nvmlReturn_t ret = begin(__func__);
    if (ret == NVML_SUCCESS) {
        ret = NVML_ERROR_NOT_FOUND;
        for (int i = 0; uuid && device && i < world.gpus; i++) {
            if (strcmp(world.gpu[i].uuid, uuid) == 0) {
                current_gpu = i;
                ret = configured_failure(__func__, i);
                if (ret == NVML_SUCCESS) *device = &handles[i];
                break;
            }
        }
    }
    return finish(ret);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    Gpu *gpu;
    nvmlReturn_t ret = begin_device(__func__, device, &gpu);
    if (ret == NVML_SUCCESS) ret = copy_text(name, length, gpu->name);
    return finish(ret);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    Gpu *gpu;
    nvmlReturn_t ret = begin_device(__func__, device, &gpu);
    if (ret == NVML_SUCCESS) ret = copy_text(uuid, length, gpu->uuid);
    return finish(ret);
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minor) {
    Gpu *gpu;
    nvmlReturn_t ret = begin_device(__func__, device, &gpu);
    if (ret == NVML_SUCCESS) {
        if (minor)
            *minor = gpu->minor;
        else
            ret = NVML_ERROR_INVALID_ARGUMENT;
    }
    return finish(ret);
}

/* What the GPU's memory holds: the world's used=, else the sum of its processes'. */
static unsigned long long used_of(const Gpu *gpu) {
    if (gpu->used_given) return gpu->used;
    const Process *found[MAX_PROCESSES];
    int n = processes_of(current_gpu, found);
    unsigned long long used = 0;
    for (int i = 0; i < n; i++)
        if (found[i]->used != NVML_VALUE_NOT_AVAILABLE) used += found[i]->used;
    return used;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    Gpu *gpu;
    nvmlReturn_t ret = begin_device(__func__, device, &gpu);
    if (ret == NVML_SUCCESS && !memory) ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) {
        unsigned long long used = used_of(gpu);
        if (used > gpu->total) used = gpu->total;
        memory->total = gpu->total;
        memory->used = used;
        memory->free = gpu->total - used;
    }
    return finish(ret);
}

/* As the driver's since 510: the reserved memory apart, total = reserved + used + free. */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    Gpu *gpu;
    nvmlReturn_t ret = begin_device(__func__, device, &gpu);
    if (ret == NVML_SUCCESS && !memory) ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) {
        unsigned long long reserved = gpu->reserved < gpu->total ? gpu->reserved : gpu->total;
        unsigned long long used = used_of(gpu);
        if (used > gpu->total - reserved) used = gpu->total - reserved;
        memory->total = gpu->total;
        memory->reserved = reserved;
        memory->used = used;
        memory->free = gpu->total - reserved - used;
    }
    return finish(ret);
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *rates) {
    Gpu *gpu;
    nvmlReturn_t ret = begin_device(__func__, device, &gpu);
    if (ret == NVML_SUCCESS && !rates) ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) {
        rates->gpu = gpu->util;
        rates->memory = gpu->memutil;
    }
    return finish(ret);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                            unsigned int *count,
                                                            nvmlProcessInfo_t *infos) {
    Gpu *gpu;
    nvmlReturn_t ret = begin_device(__func__, device, &gpu);
    if (ret == NVML_SUCCESS && !count) ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) {
        const Process *found[MAX_PROCESSES];
        unsigned int n = (unsigned int)processes_of(current_gpu, found);
        if (n > *count || (n > 0 && !infos)) {
            ret = NVML_ERROR_INSUFFICIENT_SIZE;
        } else {
            for (unsigned int i = 0; i < n; i++) {
                infos[i].pid = found[i]->pid;
                infos[i].usedGpuMemory = found[i]->used;
                infos[i].gpuInstanceId = NO_INSTANCE;
                infos[i].computeInstanceId = NO_INSTANCE;
            }
        }
        *count = n;
    }
    return finish(ret);
}

/* One sample per process with a utilisation, taken now: newer than any the caller saw. */
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                    nvmlProcessUtilizationSample_t *samples,
                                                    unsigned int *count,
                                                    unsigned long long last_seen) {
    Gpu *gpu;
    nvmlReturn_t ret = begin_device(__func__, device, &gpu);
    if (ret == NVML_SUCCESS && !count) ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        unsigned long long at = (unsigned long long)now.tv_sec * 1000000ULL +
                                (unsigned long long)now.tv_nsec / 1000ULL;
        const Process *found[MAX_PROCESSES];
        int n = processes_of(current_gpu, found);
        unsigned int sampled = 0;
        for (int i = 0; i < n; i++) sampled += found[i]->sm >= 0;
        if (sampled == 0 || at <= last_seen) {
            ret = NVML_ERROR_NOT_FOUND;
        } else if (!samples || *count < sampled) {
            ret = NVML_ERROR_INSUFFICIENT_SIZE;
            *count = sampled;
        } else {
            unsigned int k = 0;
            for (int i = 0; i < n; i++) {
                if (found[i]->sm < 0) continue;
                samples[k] = (nvmlProcessUtilizationSample_t){
                    .pid = found[i]->pid, .timeStamp = at, .smUtil = (unsigned int)found[i]->sm};
                k++;
            }
            *count = k;
        }
    }
    return finish(ret);
}

/* ----- memory health */

static nvmlReturn_t retired_pages(nvmlDevice_t device, const char *function, int cause,
                                  unsigned int *count, unsigned long long *addresses,
                                  unsigned long long *timestamps) {
    Gpu *gpu;
    nvmlReturn_t ret = begin_device(function, device, &gpu);
    if (ret == NVML_SUCCESS && (!count || cause < 0 || cause > 1)) ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) {
        unsigned int n = cause == 0 ? gpu->retired_sbe : gpu->retired_dbe;
        if (n > *count || (n > 0 && !addresses)) {
            ret = NVML_ERROR_INSUFFICIENT_SIZE;
        } else {
            for (unsigned int i = 0; i < n; i++) {
                addresses[i] = 0x100000ULL * (unsigned long long)(cause + 1) + i;
                if (timestamps) timestamps[i] = 1700000000ULL + i;
            }
        }
        *count = n;
    }
    return finish(ret);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, int cause, unsigned int *count,
                                              unsigned long long *addresses) {
    return retired_pages(device, __func__, cause, count, addresses, NULL);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, int cause,
                                                 unsigned int *count,
                                                 unsigned long long *addresses,
                                                 unsigned long long *timestamps) {
    return retired_pages(device, __func__, cause, count, addresses, timestamps);
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, int *pending) {
    Gpu *gpu;
    nvmlReturn_t ret = begin_device(__func__, device, &gpu);
    if (ret == NVML_SUCCESS) {
        if (pending)
            *pending = gpu->retired_pending != 0;
        else
            ret = NVML_ERROR_INVALID_ARGUMENT;
    }
    return finish(ret);
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrected,
                                              unsigned int *uncorrected, unsigned int *pending,
                                              unsigned int *failure) {
    Gpu *gpu;
    nvmlReturn_t ret = begin_device(__func__, device, &gpu);
    if (ret == NVML_SUCCESS && !(corrected && uncorrected && pending && failure))
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) {
        *corrected = gpu->remapped[0];
        *uncorrected = gpu->remapped[1];
        *pending = gpu->remapped[2];
        *failure = gpu->remapped[3];
    }
    return finish(ret);
}

/* Volatile and aggregate counters alike. */
EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int error_type,
                                                int counter_type, unsigned long long *count) {
    Gpu *gpu;
    nvmlReturn_t ret = begin_device(__func__, device, &gpu);
    if (ret == NVML_SUCCESS && (!count || error_type < 0 || error_type > 1 || counter_type < 0 ||
                                counter_type > 1))
        ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS) *count = error_type == 0 ? gpu->ecc_corrected : gpu->ecc_uncorrected;
    return finish(ret);
}

/* ----- events */

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                     unsigned long long *types) {
    Gpu *gpu;
    nvmlReturn_t ret = begin_device(__func__, device, &gpu);
    if (ret == NVML_SUCCESS) {
        if (types)
            *types = gpu->events;
        else
            ret = NVML_ERROR_INVALID_ARGUMENT;
    }
    return finish(ret);
}

static int valid_set(nvmlEventSet_t set) {
    return set >= sets && set < sets + MAX_SETS && set->used;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    nvmlReturn_t ret = begin(__func__);
    if (ret == NVML_SUCCESS) {
        ret = set ? NVML_ERROR_UNKNOWN : NVML_ERROR_INVALID_ARGUMENT;
        for (int s = 0; set && s < MAX_SETS; s++) {
            if (!sets[s].used) {
                memset(&sets[s], 0, sizeof sets[s]);
                sets[s].used = 1;
                for (int g = 0; g < MAX_GPUS; g++) sets[s].next[g] = history;
                *set = &sets[s];
                ret = NVML_SUCCESS;
                break;
            }
        }
    }
    return finish(ret);
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                             nvmlEventSet_t set) {
    Gpu *gpu;
    nvmlReturn_t ret = begin_device(__func__, device, &gpu);
    if (ret == NVML_SUCCESS && !valid_set(set)) ret = NVML_ERROR_INVALID_ARGUMENT;
    if (ret == NVML_SUCCESS && (types & ~gpu->events)) ret = NVML_ERROR_NOT_SUPPORTED;
    if (ret == NVML_SUCCESS) set->mask[current_gpu] |= types;
    return finish(ret);
}

/* The next event for the set, if any; under the lock. */
static int next_event(nvmlEventSet_t set, nvmlEventData_t *data) {
    for (int i = history; i < world.events; i++) {
        const Event *event = &world.event[i];
        if (event->gpu >= world.gpus || i < set->next[event->gpu] ||
            !(set->mask[event->gpu] & event->type))
            continue;
        set->next[event->gpu] = i + 1;
        data->device = &handles[event->gpu];
        data->eventType = event->type;
        data->eventData = event->data;
        data->gpuInstanceId = NO_INSTANCE;
        data->computeInstanceId = NO_INSTANCE;
        current_gpu = event->gpu;
        return 1;
    }
    return 0;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                        unsigned int timeout_ms) {
    struct timespec start, now, nap = {0, 5 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        nvmlReturn_t ret = begin(__func__);
        if (ret == NVML_SUCCESS && (!valid_set(set) || !data)) ret = NVML_ERROR_INVALID_ARGUMENT;
        if (ret != NVML_SUCCESS || next_event(set, data)) return finish(ret);
        pthread_mutex_unlock(&lock);
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long waited_ms = (now.tv_sec - start.tv_sec) * 1000LL +
                              (now.tv_nsec - start.tv_nsec) / 1000000LL;
        if (waited_ms >= (long long)timeout_ms) {
            pthread_mutex_lock(&lock);
            current_function = __func__;
            current_gpu = -1;
            return finish(NVML_ERROR_TIMEOUT);
        }
        nanosleep(&nap, NULL);
    }
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    nvmlReturn_t ret = begin(__func__);
    if (ret == NVML_SUCCESS) {
        if (valid_set(set))
            set->used = 0;
        else
            ret = NVML_ERROR_INVALID_ARGUMENT;
    }
    return finish(ret);
}
