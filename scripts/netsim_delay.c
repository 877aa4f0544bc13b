/*
 * scripts/netsim_delay.c - the switch of `scripts/netsim up N --delay MS`: a user-space Ethernet switch
 * between TAP devices that holds every frame MS milliseconds before it forwards it, so the simulated
 * hosts see a link with that one-way latency (the kernels this runs on may lack sch_netem).  netsim
 * compiles it with the system C compiler on first use and runs it in the switch namespace:
 *
 *   netsim_delay DELAY_US READY_FILE TAP0 TAP1 ...
 *
 * creates the TAP devices (IFF_TAP | IFF_NO_PI, so frames arrive whole, checksummed, one per read),
 * writes READY_FILE once they exist (netsim then moves each into its host's namespace as eth0; the
 * file descriptors stay attached) and forwards until it is killed or every device is gone.  It learns
 * which port each source MAC address sits behind and floods frames to unknown, broadcast and multicast
 * destinations.  One FIFO of frames in flight (the delay is the same for all, so the earliest due is
 * always at its head); when it is full a frame is dropped, as a switch's queue would (TCP resends it).
 * Not part of tpserve: a test and benchmark tool for one Linux machine.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define PORTS_MAX 64
#define FRAME_MAX 9216  /* jumbo frames fit */
#define QUEUE_LEN 2048  /* frames in flight: ~19 MiB */
#define MACS_MAX 256

struct frame {
    uint64_t due_ns;
    int from, len;
    unsigned char data[FRAME_MAX];
};

static struct frame queue[QUEUE_LEN]; /* ring: head .. head + n */
static int q_head, q_n;
static unsigned char mac_addr[MACS_MAX][6];
static int mac_port[MACS_MAX], n_macs;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int tap_open(const char *name)
{
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return -1;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", name);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The port behind mac, -1 when not learnt. */
static int mac_lookup(const unsigned char *mac)
{
    for (int i = 0; i < n_macs; i++)
        if (memcmp(mac_addr[i], mac, 6) == 0) return mac_port[i];
    return -1;
}

static void mac_learn(const unsigned char *mac, int port)
{
    if (mac[0] & 1) return; /* a group address is never a source */
    for (int i = 0; i < n_macs; i++)
        if (memcmp(mac_addr[i], mac, 6) == 0) {
            mac_port[i] = port;
            return;
        }
    if (n_macs == MACS_MAX) return;
    memcpy(mac_addr[n_macs], mac, 6);
    mac_port[n_macs++] = port;
}

static void forward(const int *fd, int n_ports, const struct frame *f)
{
    const int to = f->data[0] & 1 ? -1 : mac_lookup(f->data);
    for (int p = 0; p < n_ports; p++) {
        if (p == f->from || (to >= 0 && p != to)) continue;
        ssize_t w = write(fd[p], f->data, (size_t)f->len);
        (void)w; /* a frame the destination stack refuses is lost, as on a wire */
    }
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: netsim_delay DELAY_US READY_FILE TAP0 TAP1 ...\n");
        return 2;
    }
    char *end = NULL;
    const long delay_us = strtol(argv[1], &end, 10);
    if (!end || *end || delay_us < 0 || delay_us > 10000000L) {
        fprintf(stderr, "netsim_delay: DELAY_US must be 0..10000000, got '%s'\n", argv[1]);
        return 2;
    }
    const int n_ports = argc - 3;
    if (n_ports > PORTS_MAX) {
        fprintf(stderr, "netsim_delay: at most %d ports\n", PORTS_MAX);
        return 2;
    }
    int fd[PORTS_MAX];
    struct pollfd pfd[PORTS_MAX];
    for (int p = 0; p < n_ports; p++) {
        if ((fd[p] = tap_open(argv[3 + p])) < 0) {
            fprintf(stderr, "netsim_delay: cannot create TAP device %s: %s\n", argv[3 + p], strerror(errno));
            return 1;
        }
        pfd[p].fd = fd[p];
        pfd[p].events = POLLIN;
    }
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* wake at the due time, not up to 50 us after it */
    FILE *ready = fopen(argv[2], "w");
    if (!ready || fclose(ready) != 0) {
        fprintf(stderr, "netsim_delay: cannot write %s\n", argv[2]);
        return 1;
    }
    const uint64_t delay_ns = (uint64_t)delay_us * 1000u;
    for (;;) {
        uint64_t now = now_ns();
        while (q_n > 0 && queue[q_head].due_ns <= now) {
            forward(fd, n_ports, &queue[q_head]);
            q_head = (q_head + 1) % QUEUE_LEN;
            q_n--;
        }
        struct timespec ts, *tsp = NULL;
        if (q_n > 0) {
            const uint64_t wait = queue[q_head].due_ns - now;
            ts.tv_sec = (time_t)(wait / 1000000000ull);
            ts.tv_nsec = (long)(wait % 1000000000ull);
            tsp = &ts;
        }
        int rc = ppoll(pfd, (nfds_t)n_ports, tsp, NULL);
        if (rc < 0) {
            if (errno == EINTR) continue;
            fprintf(stderr, "netsim_delay: poll: %s\n", strerror(errno));
            return 1;
        }
        now = now_ns();
        int alive = 0;
        for (int p = 0; p < n_ports; p++) {
            if (pfd[p].revents & (POLLERR | POLLHUP | POLLNVAL)) {
                pfd[p].fd = -1; /* the device is gone (its namespace was deleted) */
                continue;
            }
            alive += pfd[p].fd >= 0;
            if (!(pfd[p].revents & POLLIN)) continue;
            for (;;) { /* drain: every frame read now is due at now + delay */
                struct frame *f = &queue[(q_head + q_n) % QUEUE_LEN];
                unsigned char drop[FRAME_MAX];
                unsigned char *buf = q_n < QUEUE_LEN ? f->data : drop;
                ssize_t len = read(fd[p], buf, FRAME_MAX);
                if (len < 0) break; /* EAGAIN: drained */
                if (len < 14 || buf == drop) continue;
                mac_learn(buf + 6, p);
                f->from = p;
                f->len = (int)len;
                f->due_ns = now + delay_ns;
                if (delay_ns == 0) forward(fd, n_ports, f);
                else q_n++;
            }
        }
        if (alive == 0) return 0;
    }
}
