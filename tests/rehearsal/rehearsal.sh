#!/usr/bin/env bash
# The suite's copy of ../shared/tools/rehearsal.sh (tests/test_rehearsal.py; the same commands, and `base`).
# A rehearsal machine: a Debian root booted with a real systemd as PID 1 of its own PID and mount namespaces, so an
# install recipe, a unit (Type=notify, WatchdogSec, ExecReload, the whole sandbox), a restart and a reboot can be run
# for real on a machine without a Jetson. Needs root. The network is the host's (package registries reachable).
#
#   rehearsal.sh up ROOT [SUITE]  give ROOT a copy of the base (below) if it has no systemd yet, boot it, wait until
#                                 systemd is up; prints the PID of its systemd
#   rehearsal.sh base [SUITE]     debootstrap the base once per machine (SUITE: bookworm; ~1-2 min, ~430 MB) into
#                                 /var/cache/jetson-edge-rehearsal (root's alone), keyed by what debootstrap is asked
#                                 for; prints its path (scripts/bootstrap.sh --dev makes it; `up` makes it if missing)
#   rehearsal.sh run ROOT CMD...  run CMD inside as root (in its namespaces, chroot ROOT, cwd /)
#   rehearsal.sh down ROOT        power off and wait (its mounts vanish with its mount namespace)
#
# ROOT is a plain folder of this machine: copy a checkout into ROOT/opt/... before or after `up`. Stubs for what only a
# Jetson has (nvpmodel, tegrastats, /etc/nv_tegra_release, apt packages from NVIDIA's repository) are the caller's.
# EDGE_REHEARSAL_ARCH=arm64 (the suite's copy only) debootstraps an arm64 root, which this machine runs through
# qemu-user's binfmt_misc entry (qemu-user-static, registered with the F flag): systemd boots as PID 1 under the
# emulation (tests/test_rehearsal_arm64.py).
# An executable ROOT.preboot (the suite's copy only) runs in the new mount namespace just before systemd starts: the
# caller's mounts (a fake sysfs, a device tree) are there from the first unit on, at every boot.
set -euo pipefail
cmd=${1:?usage: rehearsal.sh up|run|down ROOT ... | base [SUITE]}
if [ "$cmd" = base ]; then root=; else root=$(realpath -m "${2:?ROOT}"); shift; fi
shift
pidfile="$root.pid"
pid() { local p; p=$(cat "$pidfile" 2>/dev/null) && kill -0 "$p" 2>/dev/null && echo "$p"; }
inside() { nsenter -t "$1" -m -p -r -w "${@:2}"; }
cache=/var/cache/jetson-edge-rehearsal
# The base of every root of SUITE ($2), debootstrapped once per machine (log: $1) into a folder named by what
# debootstrap is asked for; prints its path. Root runs it, so the cache must be root's alone; the base is made whole
# (a temporary folder, then one rename) under a lock.
base() (
  args=(${EDGE_REHEARSAL_ARCH:+--arch="$EDGE_REHEARSAL_ARCH"} --variant=minbase
    --include=systemd,systemd-sysv,dbus,procps,sudo,git,python3,python3-venv,ca-certificates "$2")
  dir="$cache/$(printf '%s\n' "${args[@]}" | sha256sum | cut -c1-16)"
  mkdir -p -m 0700 "$cache"
  [ "$(stat -c '%u %a' "$cache")" = "0 700" ] || { echo "$cache is not root's alone (0700): not used" >&2; exit 1; }
  exec 9>"$cache/.lock" && flock 9
  if [ ! -x "$dir/lib/systemd/systemd" ]; then
    command -v debootstrap >/dev/null || apt-get install -y -q debootstrap >/dev/null
    mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
    rm -rf "$dir.partial"
    debootstrap "${args[@]}" "$dir.partial" ${mirror:+"$mirror"} >"$1" 2>&1 \
      || { echo "debootstrap failed: see $1" >&2; exit 1; }
    mv "$dir.partial" "$dir"
  fi
  echo "$dir"
)
case $cmd in
base)
  base "$cache/debootstrap.log" "${1:-bookworm}"
  ;;
up)
  if p=$(pid); then echo "$p"; exit 0; fi
  if [ ! -x "$root/lib/systemd/systemd" ]; then
    made=$(base "$root.debootstrap.log" "${1:-bookworm}")
    mkdir -p "$root" && cp -a "$made/." "$root/"
  fi
  # this machine's trust store and pip settings, so pip and apt inside reach the same registries as outside
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt" 2>/dev/null || true
  for f in /etc/pip.conf /etc/xdg/pip; do [ -e "$f" ] && mkdir -p "$root$(dirname "$f")" && cp -r "$f" "$root$(dirname "$f")/"; done
  # no consoles to wait for: getty units would hold the boot for 90 s
  for u in getty@tty1 serial-getty@ttyS0 console-getty getty-static; do ln -sf /dev/null "$root/etc/systemd/system/$u.service"; done
  boot=$(mktemp)
  cat >"$boot" <<EOF
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount -t tmpfs tmpfs "$root/run"
mount -t tmpfs tmpfs "$root/tmp"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
if [ -x "$root.preboot" ]; then "$root.preboot"; fi
exec chroot "$root" /lib/systemd/systemd --system
EOF
  setsid unshare -fpm --propagation private bash "$boot" >"$root.console.log" 2>&1 </dev/null &
  u=$! p=
  for _ in $(seq 100); do
    p=$(pgrep -P "$u" | head -n1 || true)
    [ -n "$p" ] && [ "$(cat /proc/"$p"/comm 2>/dev/null)" = systemd ] && break
    p=; sleep 0.2
  done
  [ -n "${p:-}" ] || { echo "systemd did not start: see $root.console.log" >&2; exit 1; }
  echo "$p" >"$pidfile"
  for _ in $(seq 150); do inside "$p" test -S /run/dbus/system_bus_socket 2>/dev/null && break; sleep 0.2; done
  state=$(inside "$p" timeout 120 systemctl is-system-running --wait 2>/dev/null || true)
  rm -f "$boot"
  echo "$p"
  [ "$state" = running ] || echo "systemd is $state (systemctl --failed inside says why)" >&2
  ;;
run)
  p=$(pid) || { echo "not running: rehearsal.sh up $root" >&2; exit 1; }
  inside "$p" "$@"
  ;;
down)
  p=$(pid) || exit 0
  inside "$p" systemctl poweroff 2>/dev/null || kill -s SIGRTMIN+4 "$p" 2>/dev/null || true
  for _ in $(seq 150); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$p" 2>/dev/null && kill -KILL "$p"
  rm -f "$pidfile"
  ;;
*) echo "usage: rehearsal.sh up|run|down ROOT ... | base [SUITE]" >&2; exit 2 ;;
esac
