#!/usr/bin/env bash
# System packages skyfn needs on a fresh Debian/Ubuntu machine (run as root, or with sudo).
# Idempotent: installs only what is missing.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
# Endpoint agent: container runtimes really exercised by the tests, and a single-node
# Slurm cluster (slurmctld, slurmd, munge) for the Slurm provider tests.
command -v podman >/dev/null 2>&1 || need+=(podman crun)
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v slurmctld >/dev/null 2>&1 || need+=(slurmctld slurmd slurm-client munge)
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
# The embedded runtime starts its own redis-server; the distribution's service is not needed.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet redis-server 2>/dev/null; then
  echo "note: the system redis-server service is running; skyfn does not use it"
fi
# issue 4: comm — NAT tests and benchmarks: network namespaces with source NAT (iproute2,
# iptables, conntrack), the iperf3 baseline and a C compiler for the socket ping-pong baseline.
comm_need=()
command -v ip >/dev/null 2>&1 || comm_need+=(iproute2)
command -v iptables >/dev/null 2>&1 || comm_need+=(iptables)
command -v conntrack >/dev/null 2>&1 || comm_need+=(conntrack)
command -v iperf3 >/dev/null 2>&1 || comm_need+=(iperf3)
command -v cc >/dev/null 2>&1 || comm_need+=(gcc libc6-dev)
# issue 4: comm — the C++ core and its GoogleTest suite (make test-cpp).
command -v cmake >/dev/null 2>&1 || comm_need+=(cmake)
command -v g++ >/dev/null 2>&1 || comm_need+=(g++)
[ -f /usr/include/gtest/gtest.h ] || comm_need+=(libgtest-dev)
if [ ${#comm_need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${comm_need[@]}" >/dev/null
fi
# issue 13: the status page (/ui) is tested in real headless Chromium driven by Selenium
# through Debian's chromedriver (no browser download).
ui_need=()
command -v chromium >/dev/null 2>&1 || ui_need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || ui_need+=(chromium-driver)
if [ ${#ui_need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${ui_need[@]}" >/dev/null
fi
