#!/usr/bin/env bash
# scripts/check-fresh-machine.sh: does README's demo command work on a fresh
# Debian 12 machine? A green CI on a machine that already has the packages
# cannot tell; this can.
#
# It builds a minimal Debian 12 root (debootstrap --variant=minbase: no
# compiler, no recommended packages) in a folder of its own, puts a clean
# clone of this repository's HEAD inside at /src, and runs README's command there with
# chroot, as root, as a new user would. It always unmounts and removes what it
# made, on success, failure or Ctrl-C.
#
# Usage (as root):  bash scripts/check-fresh-machine.sh [demo|test|mpi]
#   demo (default)  bash scripts/demo.sh   (about 3-6 minutes, most of it apt)
#   test            bash scripts/test.sh   (the whole suite: about 30 minutes)
#   mpi             install-deps.sh, a Release build of the MPI tests and
#                   the CLI, then ctest -L mpi: mpirun at P = 1..4, the CLI's
#                   --parallel rows and their faults, data-parallel training
#                   (issue 18: a fresh root has no ssh; about 15 minutes)
# Environment:
#   FRESH_ROOT_PARENT  where the root's folder is made (default /var/tmp)
#   FRESH_KEEP=1       keep the root afterwards (mounts are still removed)
#   FRESH_CLONE_DIR    where the clone goes inside the root (default /src:
#                      a short path that is also a piece of other paths,
#                      such as python/src/module.cpp, so a test that looks
#                      for the source folder as plain text, not as a whole
#                      path, fails here; issue 22 found install_consumer's)
#
# The mirror is read from this machine's own apt configuration (apt-get
# indextargets), so nothing here names a host. The root's apt sources are the
# machine's: the same suites (bookworm, -updates, -security) the machine sees.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
what=${1:-demo}
case "$what" in
  demo) command="bash scripts/demo.sh" ;;
  test) command="bash scripts/test.sh" ;;
  mpi) command="bash scripts/install-deps.sh && cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMULTIHEAD_WITH_MPI=ON >/dev/null && cmake --build build -j\$(nproc) --target multihead_mpi_tests multihead_cli && ctest --test-dir build -L mpi --output-on-failure" ;;
  *) echo "check-fresh-machine: unknown check '$what' (expected demo, test or mpi)" >&2; exit 2 ;;
esac
if [[ $(id -u) -ne 0 ]]; then
  echo "check-fresh-machine: needs root (debootstrap, chroot, mount)" >&2
  exit 2
fi
say() { echo "check-fresh-machine: $*"; }
started=$(date +%s)

# ---- tools on the host ----------------------------------------------------------
if ! command -v debootstrap >/dev/null; then
  say "installing debootstrap"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

# ---- the mirror: the host's Debian archive for bookworm -----------------------
mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Identifier: Packages' 2>/dev/null |
  awk '$2 == "bookworm" { print $1; exit }')
if [[ -z $mirror ]]; then
  echo "check-fresh-machine: this machine's apt configuration has no bookworm archive to debootstrap from" >&2
  exit 1
fi

# ---- the root, and its cleanup --------------------------------------------------
root=$(mktemp -d "${FRESH_ROOT_PARENT:-/var/tmp}/multihead-fresh.XXXXXX")
chmod 755 "$root"  # apt's _apt user must reach /var/cache/apt inside it
mounts=()
cleanup() {
  local status=$? m
  # Innermost first; a lazy unmount cannot leave the root pinned.
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    m=${mounts[i]}
    mountpoint -q "$m" && { umount "$m" 2>/dev/null || umount -l "$m"; }
  done
  if findmnt -rn -o TARGET | grep -qF "$root"; then
    echo "check-fresh-machine: mounts under $root remain; not removing it" >&2
  elif [[ ${FRESH_KEEP:-0} == 1 ]]; then
    say "kept the root at $root"
  else
    rm -rf --one-file-system "$root"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "debootstrap minbase bookworm from the machine's apt mirror into $root"
t0=$(date +%s)
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 || {
  tail -20 "$root.debootstrap.log" >&2
  rm -f "$root.debootstrap.log"
  echo "check-fresh-machine: debootstrap failed" >&2
  exit 1
}
rm -f "$root.debootstrap.log"
say "root ready in $(($(date +%s) - t0)) s"

# The machine's apt sources (every suite it uses), not debootstrap's single line.
rm -f "$root/etc/apt/sources.list"
cp /etc/apt/sources.list "$root/etc/apt/" 2>/dev/null || true
for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  if [[ -f $f ]]; then cp "$f" "$root/etc/apt/sources.list.d/"; fi
done
# Proxy settings of the machine's apt, if any.
for f in /etc/apt/apt.conf.d/*; do
  if [[ -f $f ]] && grep -qi 'proxy' "$f"; then cp "$f" "$root/etc/apt/apt.conf.d/"; fi
done
cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
# /etc/hosts naming this hostname, as Debian's installer writes on a booted
# machine (debootstrap writes none): without it every mpirun in the root
# looked its own hostname up in DNS (2026-12-02: each mpirun about 5 s
# slower there, mpi_cli past its timeout; the cause is not yet confirmed).
cp -L /etc/hosts "$root/etc/hosts" 2>/dev/null || true
# The machine's own certificate authorities (a network that inspects TLS
# signs with one): part of the network, like the proxy and the resolver, not
# of what a fresh machine has installed. ca-certificates, installed by
# install-deps.sh inside the root, adds them to the root's store.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
fi

# What a booted machine has: /proc, /sys, /dev, a terminal device tree, and a
# world-writable /dev/shm (LLVM's OpenMP runtime opens a file there, also for
# unprivileged users; a plain bind of /dev does not bring the host's).
for m in proc sys dev dev/pts dev/shm; do
  case $m in
    proc) mount -t proc proc "$root/proc" ;;
    sys) mount -t sysfs sysfs "$root/sys" ;;
    # Private, so the mounts below stay inside the root even where the
    # host's /dev propagates mounts (systemd makes it shared).
    dev) mount --bind /dev "$root/dev" && mount --make-private "$root/dev" ;;
    dev/pts) mount -t devpts devpts "$root/dev/pts" ;;
    dev/shm) mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm" ;;
  esac
  mounts+=("$root/$m")
done

# A clean clone of HEAD: only committed files, as a new user would get them.
# (The minimal root has no git yet; the host clones into it.)
clone_dir=${FRESH_CLONE_DIR:-/src}
git clone -q --no-hardlinks "$repo" "$root$clone_dir"
say "cloned $(git -C "$root$clone_dir" rev-parse --short HEAD) into the root at $clone_dir"

say "running '$command' in the fresh root"
t1=$(date +%s)
status=0
chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 TERM=dumb /bin/bash -c "cd '$clone_dir' && $command" || status=$?
t2=$(date +%s)
if ((status != 0)); then
  echo "check-fresh-machine: '$command' FAILED in a fresh Debian 12 root (exit $status) after $((t2 - t1)) s" >&2
  exit "$status"
fi
say "'$command' passed in a fresh Debian 12 root: $((t2 - t1)) s (total $((t2 - started)) s with debootstrap)"
