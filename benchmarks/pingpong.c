/* Plain TCP socket 1-byte ping-pong: the latency baseline of benchmarks/comm.py.
 *
 *   pingpong server PORT              accept one connection, echo every byte until EOF
 *   pingpong client HOST PORT ITERS   send 1 byte, wait for it back, ITERS times
 *
 * TCP_NODELAY on both sides, blocking send/recv, no framing: the floor any
 * message-passing library pays on the same path. The client prints one JSON line with
 * the round-trip times in microseconds (min, median, mean) after 1000 warm-up rounds.
 * Compiled by the benchmark at run time with `cc -O2`.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what) {
  perror(what);
  exit(1);
}

static void nodelay(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) die("TCP_NODELAY");
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int server(int port) {
  int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  if (ls < 0) die("socket");
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = INADDR_ANY};
  if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0) die("bind");
  if (listen(ls, 1) < 0) die("listen");
  int fd = accept(ls, NULL, NULL);
  if (fd < 0) die("accept");
  nodelay(fd);
  char c;
  for (;;) {
    ssize_t n = recv(fd, &c, 1, 0);
    if (n == 0) break;
    if (n < 0) die("recv");
    if (send(fd, &c, 1, 0) != 1) die("send");
  }
  close(fd);
  close(ls);
  return 0;
}

static int client(const char *host, int port, int iters) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die("socket");
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
    fprintf(stderr, "bad IPv4 address %s\n", host);
    return 2;
  }
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
  nodelay(fd);
  double *rtt = malloc(sizeof(double) * iters);
  if (!rtt) die("malloc");
  char c = 'x';
  for (int i = -1000; i < iters; i++) {
    double t0 = now_us();
    if (send(fd, &c, 1, 0) != 1) die("send");
    if (recv(fd, &c, 1, MSG_WAITALL) != 1) die("recv");
    if (i >= 0) rtt[i] = now_us() - t0;
  }
  close(fd);
  double sum = 0;
  for (int i = 0; i < iters; i++) sum += rtt[i];
  qsort(rtt, iters, sizeof(double), cmp_double);
  printf("{\"iters\": %d, \"rtt_us_min\": %.2f, \"rtt_us_median\": %.2f, \"rtt_us_mean\": %.2f}\n", iters, rtt[0],
         rtt[iters / 2], sum / iters);
  free(rtt);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "server") == 0) return server(atoi(argv[2]));
  if (argc == 5 && strcmp(argv[1], "client") == 0) return client(argv[2], atoi(argv[3]), atoi(argv[4]));
  fprintf(stderr, "usage: %s server PORT | client HOST PORT ITERS\n", argv[0]);
  return 2;
}
