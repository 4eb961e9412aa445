/*
 * The sandbox ("pause") process for the runtime tier's local image: no registry is
 * reachable here, so the test fixture compiles this with `cc -Os -static` and packs it
 * into an image archive. Like Kubernetes' pause: it holds the pod's namespaces, reaps
 * zombies, and exits on SIGTERM or SIGINT.
 */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction stop = {.sa_handler = quit};
    struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
    if (sigaction(SIGTERM, &stop, NULL) < 0 || sigaction(SIGINT, &stop, NULL) < 0 ||
        sigaction(SIGCHLD, &child, NULL) < 0)
        return 1;
    for (;;) pause();
}
