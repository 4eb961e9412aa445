/*
 * plexus: the CNI binary a container runtime execs.
 *
 * It forwards the call (the CNI_* environment and stdin) to the Plexus node daemon
 * over a unix socket and prints the daemon's answer, so each call costs a process
 * start of well under a millisecond instead of a Python interpreter's ~25 ms.
 * When the daemon is not listening it execs `plexus-thin` next to itself (hosts
 * where Plexus is installed with its interpreter), which runs the engine in-process;
 * without one it waits up to daemonWaitSeconds for the daemon to come back, then
 * fails with "try again later". It talks only to a root-owned socket in a root-owned
 * directory nobody else can write. Wire format: meta/daemon/protocol.py.
 *
 * `plexus --exec-delegate PID ROOT BINARY` is how Plexus execs a delegate plugin: see
 * exec_delegate().
 */
#define _GNU_SOURCE
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAGIC "PXS1"
/* How the daemon recognises this file under any name (meta/install.py: IDENTITY). */
#define IDENTITY "plexus-cni-meta-plugin"
#define MAX_STDIN (8u << 20)
#define DEFAULT_SOCKET_DIR "/run/plexus"
#define SOCKET_NAME "plexus.sock"
#define DEFAULT_WAIT_SECONDS 10.0

extern char **environ;

/* The config's cniVersion once stdin is read (errors are reported in it, as the spec asks). */
static const char *version = "1.0.0";

static void put_json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static void fail(int code, const char *msg, const char *details) {
    /* A CNI error on stdout (paths in it are escaped). */
    printf("{\"cniVersion\":\"%s\",\"code\":%d,\"msg\":", version, code);
    put_json_string(msg);
    printf(",\"details\":");
    put_json_string(details);
    printf("}\n");
    exit(1);
}

static char *top_level_string(const char *json, size_t len, const char *key);

/* Take the config's cniVersion for errors if it looks like one (digits and dots). */
static void use_config_version(const char *json, size_t len) {
    char *v = top_level_string(json, len, "cniVersion");
    if (!v || !*v || strlen(v) > 16 || strspn(v, "0123456789.") != strlen(v)) {
        free(v);
        return;
    }
    version = v;
}

static char *read_stdin(size_t *len) {
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) fail(5, "plexus shim: out of memory", "");
        ssize_t r = read(0, buf + n, cap - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) fail(5, "plexus shim: cannot read stdin", strerror(errno));
        if (r == 0) break;
        n += (size_t)r;
        if (n == cap) {
            if (cap >= MAX_STDIN) {
                use_config_version(buf, n);
                fail(6, "plexus shim: config on stdin is too large", "");
            }
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Where the value of a top-level key of a JSON object starts, or NULL. */
static const char *top_level_value(const char *json, size_t len, const char *key) {
    size_t klen = strlen(key);
    int depth = 0;
    for (size_t i = 0; i < len; i++) {
        char c = json[i];
        if (c == '{' || c == '[') { depth++; continue; }
        if (c == '}' || c == ']') { depth--; continue; }
        if (c != '"') continue;
        size_t start = ++i;
        while (i < len && json[i] != '"') i += (json[i] == '\\') ? 2 : 1;
        if (i >= len) return NULL;
        if (depth != 1 || i - start != klen || strncmp(json + start, key, klen) != 0) continue;
        size_t j = i + 1;
        while (j < len && (json[j] == ' ' || json[j] == '\t' || json[j] == '\n' || json[j] == '\r')) j++;
        if (j >= len || json[j] != ':') continue;
        j++;
        while (j < len && (json[j] == ' ' || json[j] == '\t' || json[j] == '\n' || json[j] == '\r')) j++;
        return j < len ? json + j : NULL;
    }
    return NULL;
}

/* The string value of a top-level key, or NULL. Escapes are not decoded: a socket
 * path has none. */
static char *top_level_string(const char *json, size_t len, const char *key) {
    const char *v = top_level_value(json, len, key);
    if (!v || *v != '"') return NULL;
    const char *end = json + len, *p = ++v;
    while (p < end && *p != '"') p += (*p == '\\') ? 2 : 1;
    return p < end ? strndup(v, (size_t)(p - v)) : NULL;
}

/* The number value of a top-level key, or `fallback` (stdin is NUL-terminated). */
static double top_level_number(const char *json, size_t len, const char *key, double fallback) {
    const char *v = top_level_value(json, len, key);
    char *end;
    double d = v ? strtod(v, &end) : 0;
    return v && end != v && d >= 0 ? d : fallback;
}

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

static uint32_t get_u32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static int write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w; len -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t len) {
    char *p = buf;
    while (len) {
        ssize_t r = read(fd, p, len);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r; len -= (size_t)r;
    }
    return 0;
}

/* `plexus-thin` beside this binary, or "" if this binary cannot be located. */
static void thin_path(char *out, size_t size) {
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    out[0] = '\0';
    if (n < 0) return;
    self[n] = '\0';
    snprintf(out, size, "%s/plexus-thin", dirname(self));
}

/* No daemon: hand stdin to the in-process fallback. */
static void exec_thin(const char *thin, const char *input, size_t len) {
    int fd = memfd_create("plexus-stdin", 0);
    if (fd < 0 || write_all(fd, input, len) < 0 || lseek(fd, 0, SEEK_SET) < 0 || dup2(fd, 0) < 0)
        fail(5, "plexus shim: cannot pass stdin to plexus-thin", strerror(errno));
    char *argv[] = {(char *)thin, NULL};
    execv(thin, argv);
    fail(50, "plexus daemon unavailable and plexus-thin cannot run", strerror(errno));
}

/* Whoever can write the socket's directory can answer the runtime in the daemon's
 * place: talk only through a root-owned directory and socket nobody else can write. */
static void check_owned_by_root(const char *path, mode_t type) {
    struct stat st;
    if (lstat(path, &st) < 0) return; /* absent: connect() says so */
    if ((st.st_mode & S_IFMT) == type && st.st_uid == 0 && !(st.st_mode & 022)) return;
    char msg[PATH_MAX + 128];
    snprintf(msg, sizeof msg, "plexus shim: refusing %s: not a %s owned by root and writable only by root",
             path, type == S_IFDIR ? "directory" : "socket");
    fail(5, msg, "the daemon creates its socketDir as root with mode 0700");
}

static int try_connect(const struct sockaddr_un *addr, const char *dir) {
    check_owned_by_root(dir, S_IFDIR);
    check_owned_by_root(addr->sun_path, S_IFSOCK);
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0) fail(5, "plexus shim: cannot create a socket", strerror(errno));
    if (connect(sock, (const struct sockaddr *)addr, sizeof *addr) == 0) {
        struct ucred peer;
        socklen_t plen = sizeof peer;
        if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &plen) < 0 || peer.uid != 0)
            fail(5, "plexus shim: the process listening on the daemon socket is not root's",
                 addr->sun_path);
        return sock;
    }
    int err = errno;
    close(sock);
    if (err != ENOENT && err != ECONNREFUSED)
        fail(11, "plexus shim: cannot connect to the plexus daemon", strerror(err));
    return -1;
}

/* Connect to the daemon; if it is not listening, run plexus-thin when installed,
 * else wait up to `wait` seconds for the daemon (a restart takes seconds). */
static int connect_daemon(const struct sockaddr_un *addr, const char *dir, double wait,
                          const char *input, size_t in_len) {
    int sock = try_connect(addr, dir);
    if (sock >= 0) return sock;
    char thin[PATH_MAX];
    thin_path(thin, sizeof thin);
    if (*thin && access(thin, X_OK) == 0) exec_thin(thin, input, in_len);
    struct timespec start, now, pause = {0, 100 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((double)(now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 >= wait) break;
        nanosleep(&pause, NULL);
        if ((sock = try_connect(addr, dir)) >= 0) return sock;
    }
    char msg[sizeof addr->sun_path + 64], details[128];
    snprintf(msg, sizeof msg, "plexus shim: the Plexus daemon is not running at %s", addr->sun_path);
    snprintf(details, sizeof details,
             "waited %g s for it (daemonWaitSeconds); the runtime will retry", wait);
    fail(11, msg, details);
    return -1;
}

/* Exec BINARY, chrooted at ROOT unless it is "/", so that it gets SIGKILL when the thread
 * that forked us (a daemon worker) dies, even by SIGKILL: a delegate must not finish an
 * ADD behind the runtime's DEL. If that parent died before prctl() took effect, getppid()
 * is no longer PID. Chrooting here, not by exec'ing chroot(8) first, saves that exec
 * (~0.7 ms: a dynamically linked glibc binary). */
static int exec_delegate(const char *parent, const char *root, const char *binary) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
        fprintf(stderr, "plexus: prctl(PR_SET_PDEATHSIG): %s\n", strerror(errno));
        return 126;
    }
    if (getppid() != (pid_t)strtol(parent, NULL, 10)) return 126;
    if (strcmp(root, "/") != 0 && (chroot(root) != 0 || chdir("/") != 0)) {
        fprintf(stderr, "plexus: cannot chroot to %s: %s\n", root, strerror(errno));
        return 126;
    }
    char *argv[] = {(char *)binary, NULL};
    execv(binary, argv);
    fprintf(stderr, "plexus: cannot exec %s: %s\n", binary, strerror(errno));
    return 126;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--exec-delegate") == 0) {
        /* PID ROOT BINARY; a daemon before ROOT passes PID BINARY (a DaemonSet update
         * with maxSurge runs it beside the shim its successor installed). */
        if (argc == 5) return exec_delegate(argv[2], argv[3], argv[4]);
        if (argc == 4) return exec_delegate(argv[2], "/", argv[3]);
        fprintf(stderr, "usage: plexus --exec-delegate PID ROOT BINARY (" IDENTITY ")\n");
        return 126;
    }
    size_t in_len;
    char *input = read_stdin(&in_len);
    use_config_version(input, in_len);
    char *dir = top_level_string(input, in_len, "socketDir");
    if (!dir || !*dir) dir = DEFAULT_SOCKET_DIR;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int plen = snprintf(addr.sun_path, sizeof addr.sun_path, "%s/%s", dir, SOCKET_NAME);
    if (plen < 0 || (size_t)plen >= sizeof addr.sun_path)
        fail(7, "plexus shim: socketDir is too long for a unix socket path", "");
    double wait = top_level_number(input, in_len, "daemonWaitSeconds", DEFAULT_WAIT_SECONDS);
    int sock = connect_daemon(&addr, dir, wait, input, in_len);

    size_t env_len = 0;
    for (char **e = environ; *e; e++)
        if (strncmp(*e, "CNI_", 4) == 0) env_len += strlen(*e) + 1;
    size_t frame_len = 4 + 4 + env_len + 4 + in_len;
    unsigned char *frame = malloc(frame_len), *p = frame;
    if (!frame) fail(5, "plexus shim: out of memory", "");
    memcpy(p, MAGIC, 4); p += 4;
    put_u32(p, (uint32_t)env_len); p += 4;
    for (char **e = environ; *e; e++) {
        if (strncmp(*e, "CNI_", 4) != 0) continue;
        size_t l = strlen(*e) + 1;
        memcpy(p, *e, l); p += l;
    }
    put_u32(p, (uint32_t)in_len); p += 4;
    memcpy(p, input, in_len);
    if (write_all(sock, frame, frame_len) < 0)
        fail(11, "plexus shim: the plexus daemon closed the connection", strerror(errno));
    shutdown(sock, SHUT_WR);

    unsigned char head[12];
    if (read_all(sock, head, sizeof head) < 0 || memcmp(head, MAGIC, 4) != 0)
        fail(11, "plexus shim: no answer from the plexus daemon (it may have restarted)",
             "the runtime will retry");
    uint32_t code = get_u32(head + 4), out_len = get_u32(head + 8);
    char *out = malloc((size_t)out_len + 1);
    if (!out || read_all(sock, out, out_len) < 0)
        fail(11, "plexus shim: truncated answer from the plexus daemon", "the runtime will retry");
    if (write_all(1, out, out_len) < 0) return 1;
    return (int)code;
}
