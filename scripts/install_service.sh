#!/usr/bin/env bash
# Install jetson-edge as a systemd service on a Jetson: user, groups, config, unit; then enable it.
# Idempotent: a second run changes nothing. A config the user edited is never overwritten (the shipped one
# is written beside it as config.yaml.dist instead).
#
#   sudo scripts/install_service.sh                       # prefix /opt/jetson-edge (the checkout with .venv/)
#   sudo scripts/install_service.sh --prefix /srv/edge    # ExecStart=/srv/edge/.venv/bin/edge
#   sudo scripts/install_service.sh --wheelhouse DIR      # pycuda from DIR's wheel (SHA256SUMS checked), no build
#   scripts/install_service.sh --dry-run                  # print what would be done, change nothing
#   DESTDIR=/tmp/stage scripts/install_service.sh         # stage the files under /tmp/stage only
#                                                         # (no user, no groups, no systemctl; for packaging/tests)
#   sudo scripts/install_service.sh --power-mode max      # also set nvpmodel's mode once (max or an ID; it persists)
#   sudo scripts/install_service.sh --clocks              # also pin the clocks at boot (jetson-edge-clocks.service)
#
# Then: sudo systemctl start jetson-edge; journalctl -u jetson-edge -f   (see docs/service.md)
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
prefix=/opt/jetson-edge
dry_run=0
enable=1
user=jetson-edge
groups=(video render jtop)
wheelhouse=""

power_mode=""  # --power-mode max|ID
clocks=0       # --clocks: jetson-edge-clocks.service installed and enabled

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
say() { echo "install_service: $*"; }
act() {  # run a command, or only print it with --dry-run
  if [ "$dry_run" = 1 ]; then echo "would run: $*"; else "$@"; fi
}
step() {  # a recipe step: its failure stops the install with its message, nothing after it runs
  act "$@" || { echo "install_service.sh: step failed (exit $?): $* (see above; docs/service.md)" >&2; exit 1; }
}
optional() {  # a recipe step the service can run without: its failure is named, with its log, and the install goes on
  [ "$dry_run" = 1 ] && { echo "would run: $*"; return 0; }
  local log
  log="$(mktemp -t jetson-edge-install.XXXXXX)"
  if "$@" > >(tee "$log") 2>&1; then return 0; fi
  echo "install_service.sh: optional step failed: $* (log: $log); the service runs without it: edge doctor names" \
    "what is missing and how to add it (docs/service.md)" >&2
}
pycuda_source() {  # pip's arguments for pycuda: a wheelhouse's checked wheel, or the sdist built here
  if [ -n "$wheelhouse" ]; then
    (cd "$wheelhouse" && sha256sum --quiet -c SHA256SUMS) >&2 || { echo "install_service.sh: $wheelhouse/SHA256SUMS" \
      "does not match its wheels" >&2; return 1; }
    echo "--no-index --find-links $wheelhouse pycuda"
  else
    echo "pycuda"
  fi
}

# On a Jetson: the one install recipe (docs/service.md shows these lines per JetPack and README.md names them;
# tests/test_install_recipe.py compares them). JetPack's TensorRT and OpenCV (GStreamer: csi:// cameras; never
# PyPI's OpenCV here, the constraints refuse it), g++ (pycuda compiles at install), gst-inspect-1.0 (edge doctor's
# nvarguscamerasrc check), the CUDA parts pycuda builds against where a minimal flash lacks them (nvcc, cuda.h,
# cudaProfiler.h, curand.h and libcurand), a venv that sees JetPack's packages with a pip that has the 2020 resolver
# (JetPack 5's venv has pip 20.0), pip under this JetPack's constraints (NumPy 1.x: JetPack's OpenCV and TensorRT
# are built against it), pycuda built against JetPack's CUDA, and the preprocessing kernel built into the state
# directory the service and the CLI both read (the service never runs nvcc; docs/gpu.md). jtop: jtop_service.
jetson_recipe() {
  local jp cuda
  jp="$(jetpack)" && cuda="$(cuda_package_version)" || exit 1
  step apt-get update
  step apt-get install -y g++ python3-libnvinfer python3-opencv python3-venv python3-dev gstreamer1.0-tools
  has_cuda_dev || step apt-get install -y "cuda-nvcc-$cuda" "cuda-cudart-dev-$cuda" "cuda-profiler-api-$cuda" "libcurand-dev-$cuda"
  step python3 -m venv --system-site-packages .venv
  step env PIP_CONSTRAINT="constraints/$jp.txt" .venv/bin/python -m pip install --upgrade 'pip>=23.1'
  step env PATH="/usr/local/cuda/bin:$PATH" PIP_CONSTRAINT="constraints/$jp.txt" .venv/bin/pip install -e '.[jetson,service,check]'
  say "pycuda: $([ -n "$wheelhouse" ] && echo "from $wheelhouse" || echo "compiling (5-15 min on an Orin or Xavier, 20+ on a Nano; progress below)")"
  optional env PATH="/usr/local/cuda/bin:$PATH" PIP_CONSTRAINT="constraints/$jp.txt" .venv/bin/pip install -v $(pycuda_source)
  step env PATH="/usr/local/cuda/bin:$PATH" .venv/bin/python scripts/build_kernel.py --into "$state/kernels"
}
has_cuda_dev() {  # pycuda's build: nvcc, cuda.h, cudaProfiler.h, curand.h and libcurand; the kernel's: nvcc
  local h
  [ -x /usr/local/cuda/bin/nvcc ] && compgen -G '/usr/local/cuda/lib*/libcurand.so' >/dev/null || return 1
  for h in cuda.h cudaProfiler.h curand.h; do [ -f "/usr/local/cuda/include/$h" ] || return 1; done
}
# jtop's service, running the venv's jtop: jetson-stats' --install-service writes ExecStart=/usr/local/bin/jtop, which
# the recipe never installs (203/EXEC every 10 s, for ever) or which is another jetson-stats whose service the venv's
# client refuses ("Mismatch version"). The drop-in (systemd/jtop.service.d/) is in place before --install-service
# reloads, enables and starts the unit; a restart replaces a jtop.service already running; the step waits for the
# service to answer on its socket (it prints "installed and enabled" whether or not it started).
jtop_service() {
  local dropin=/etc/systemd/system/jtop.service.d/jetson-edge.conf
  foreign_jtop
  act install -d -m 0755 "$(dirname "$dropin")"
  render "$here/systemd/jtop.service.d/jetson-edge.conf" | write_if_changed "$dropin" || true
  step "$prefix/.venv/bin/jtop" --install-service
  step systemctl restart jtop.service
  step jtop_answers 30
}
jtop_answers() {  # the jtop service accepts a connection on /run/jtop.sock within $1 s
  [ "$dry_run" = 1 ] && return 0
  local i
  for i in $(seq "$(( $1 * 5 ))"); do
    "$prefix/.venv/bin/python" -c 'import socket; socket.socket(socket.AF_UNIX).connect("/run/jtop.sock")' \
      2>/dev/null && { say "jtop.service answers on /run/jtop.sock"; return 0; }
    sleep 0.2
  done
  echo "install_service.sh: jtop.service does not answer on /run/jtop.sock after $1 s:" >&2
  systemctl --no-pager --lines=5 status jtop.service >&2 || true
  return 1
}
jtop_elsewhere=(/usr/local/bin/jtop /usr/bin/jtop)  # where a system-wide jetson-stats puts its jtop
foreign_jtop() {  # a jtop outside the venv of another major.minor: named; the service never runs it (the drop-in)
  local ours theirs path
  ours="$("$prefix/.venv/bin/jtop" --version 2>/dev/null | awk '{print $NF}')"
  for path in "${jtop_elsewhere[@]}"; do
    [ -x "$path" ] || continue
    theirs="$("$path" --version 2>/dev/null | awk '{print $NF}')"
    [ -n "$theirs" ] && [ "${theirs%.*}" = "${ours%.*}" ] && continue
    say "warning: refusing $path (jetson-stats ${theirs:-of unknown version}) for jtop.service: it runs the venv's" \
      "jetson-stats $ours instead, and $path cannot talk to that ('Mismatch version'): sudo pip3 uninstall jetson-stats"
  done
}
render() { sed "s|/opt/jetson-edge|${prefix%/}|g" "$1"; }  # a shipped file with the checkout's --prefix
write_if_changed() {  # stdin -> $1 (mode 0644) unless it already holds exactly that; status 1 when it did
  local staged status=0
  staged="$(mktemp)"
  cat > "$staged"
  if [ -f "$1" ] && cmp -s "$staged" "$1"; then
    status=1
  else
    act install -m 0644 "$staged" "$1"
  fi
  rm -f "$staged"
  return "$status"
}
jetpack() {  # jetpack5/6/7 from L4T's release file ('# R36 (release), REVISION: 4.0, ...')
  local release
  release="$(sed -n 's/^# R\([0-9]*\) .*/\1/p' /etc/nv_tegra_release 2>/dev/null | head -n 1)"
  case "$release" in
    35) echo jetpack5 ;; 36) echo jetpack6 ;; 38) echo jetpack7 ;;
    *) echo "install_service.sh: L4T release '${release:-unknown}' is not JetPack 5, 6 or 7 (R35, R36, R38)" >&2
       return 1 ;;
  esac
}
cuda_package_version() {  # '12-6' for /usr/local/cuda -> cuda-12.6: apt's cuda-nvcc-12-6 matches JetPack's CUDA
  local version
  version="$(readlink -f /usr/local/cuda | sed -n 's|.*/cuda-\([0-9]*\)\.\([0-9]*\)$|\1-\2|p')"
  [ -n "$version" ] || { echo "install_service.sh: no /usr/local/cuda-X.Y: install JetPack's CUDA (apt install nvidia-jetpack)" >&2; return 1; }
  echo "$version"
}
# --power-mode: "max" (MAXN where the board has one, else the most watts: edge.board, as `edge check` judges it;
# mode 0 is 15 W on Xavier NX and Orin Nano) or an ID of the board's nvpmodel.conf -> "ID NAME"; exit 2 otherwise.
power_mode_of() {  # $1 python with edge, $2 nvpmodel.conf
  "$1" - "$2" "$power_mode" <<'PY'
import sys
from edge.board import max_power_mode, power_modes
with open(sys.argv[1], encoding="utf-8") as fh:
    modes = power_modes(fh.read())
want = sys.argv[2]
mode = max_power_mode(modes) if want == "max" else next((m for m in modes if str(m.id) == want), None)
if mode is None:
    print("install_service.sh: --power-mode {}: {} in {} ({})".format(
        want, "no single maximum" if want == "max" else "no such mode", sys.argv[1],
        ", ".join(map(str, modes)) or "no modes"), file=sys.stderr)
    sys.exit(2)
print(mode.id, mode.name)
PY
}
# Set once: nvpmodel keeps the mode across boots. A mode that changes the online CPU cores asks on stdin whether to
# reboot now: answered "no" here, and the reboot left to the operator (the new mode applies after it).
set_power_mode() {  # $1 python with edge, $2 nvpmodel.conf
  local id name current
  read -r id name < <(power_mode_of "$1" "$2") || exit 2
  current="$(nvpmodel -q 2>/dev/null | sed -n '$p' || true)"
  if [ "$current" = "$id" ]; then
    say "power mode $name ($id) already set"
  else
    say "setting the power mode $name ($id) (was ${current:-unknown}); if nvpmodel asks for a reboot, reboot to apply it"
    act sh -c "echo NO | nvpmodel -m $id"
  fi
}

# Sourced (tests/test_install_recipe.py runs the recipe's functions alone): stop here.
if [ "${BASH_SOURCE[0]}" != "$0" ]; then return 0; fi

while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
    --prefix=*) prefix="${1#--prefix=}"; shift ;;
    --wheelhouse) wheelhouse="$(cd "${2:?--wheelhouse needs a directory}" && pwd)" || exit 2; shift 2 ;;
    --dry-run|-n) dry_run=1; shift ;;
    --no-enable) enable=0; shift ;;
    --power-mode) power_mode="${2:?--power-mode needs max or a mode ID}"; shift 2 ;;
    --power-mode=*) power_mode="${1#--power-mode=}"; shift ;;
    --clocks) clocks=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install_service.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
# The prefix goes into the unit's ExecStart= (through sed): only an absolute path of plain characters, so no
# space splits ExecStart=, no '&' or '|' changes the sed substitution and no sed command can be smuggled in.
if ! [[ "$prefix" =~ ^/[A-Za-z0-9._+@/-]*$ ]] || [[ "$prefix" == *//* || "$prefix" =~ (^|/)\.\.?(/|$) ]]; then
  echo "install_service.sh: --prefix must be an absolute path of letters, digits and . _ + @ - / only, got '$prefix'" >&2
  exit 2
fi
if ! [[ "$power_mode" =~ ^(|max|[0-9]{1,3})$ ]]; then
  echo "install_service.sh: --power-mode is max or a mode ID (sudo nvpmodel -p --verbose lists them), got '$power_mode'" >&2
  exit 2
fi
prefix="${prefix%/}"
prefix="${prefix:-/}"
edge_bin="${prefix%/}/.venv/bin/edge"  # --prefix /: /.venv/bin/edge, not //.venv/bin/edge

destdir="${DESTDIR:-}"
destdir="${destdir%/}"
shipped_unit="$here/systemd/jetson-edge.service"
shipped_config="$here/systemd/config.yaml"
etc="$destdir/etc/jetson-edge"
config="$etc/config.yaml"
record="$etc/.config.yaml.installed-sha256"  # hash of the config this script last installed
unit="$destdir/etc/systemd/system/jetson-edge.service"
engine_unit="$destdir/etc/systemd/system/jetson-edge-engine.service"  # builds the engine this board lacks
clocks_unit="$destdir/etc/systemd/system/jetson-edge-clocks.service"  # --clocks
state="$destdir/var/lib/jetson-edge"

sha() { sha256sum "$1" | cut -d' ' -f1; }
system_changes() { [ -z "$destdir" ]; }  # users, groups and systemctl only on a real install

if system_changes && [ "$dry_run" = 0 ] && [ "$(id -u)" != 0 ]; then
  echo "install_service.sh: run as root (or use --dry-run, or DESTDIR=... to stage files)" >&2
  exit 1
fi
for shipped in "$shipped_unit" "$here/systemd/jetson-edge-engine.service" "$shipped_config" \
               "$here/systemd/jtop.service.d/jetson-edge.conf" "$here/systemd/jetson-edge-clocks.service" \
               "$here/calibration/default" "$here/calibration/regression"; do
  [ -e "$shipped" ] || { echo "install_service.sh: missing $shipped (a partial checkout?)" >&2; exit 2; }
done
if [ ! -x "$edge_bin" ]; then
  say "warning: $edge_bin does not exist yet (clone the repo to $prefix; on a Jetson this script makes it, elsewhere run scripts/bootstrap.sh)"
fi

# No write may follow a symbolic link (a link planted in a DESTDIR stage, or under /etc, would redirect a write
# made as root): refuse before writing anything if any file or folder written to, or a folder above it, is one.
refuse_links() {
  local path
  for path in "$@"; do
    while [ -n "$path" ] && [ "$path" != / ] && [ "$path" != "$destdir" ]; do
      if [ -L "$path" ]; then
        echo "install_service.sh: refusing to write through the symbolic link $path (remove it, then run again)" >&2
        exit 2
      fi
      path="$(dirname "$path")"
    done
  done
}
refuse_links "$config" "$record" "$config.dist" "$unit" "$engine_unit" "$clocks_unit" "$state/engines" "$state/kernels" \
  "$state/calibration"

# 1. groups and the service user
if system_changes; then
  for g in "${groups[@]}"; do
    if ! getent group "$g" >/dev/null; then
      say "creating missing group $g (SupplementaryGroups= fails the unit if a group does not exist)"
      act groupadd --system "$g"
    fi
  done
  if ! id -u "$user" >/dev/null 2>&1; then
    say "creating system user $user"
    act useradd --system --user-group --home-dir /var/lib/jetson-edge --no-create-home \
      --shell /usr/sbin/nologin --comment "jetson-edge inference service" "$user"
  else
    say "user $user exists"
  fi
  missing_groups=()
  for g in "${groups[@]}"; do
    id -nG "$user" 2>/dev/null | tr ' ' '\n' | grep -qx "$g" || missing_groups+=("$g")
  done
  if [ ${#missing_groups[@]} -gt 0 ]; then
    act usermod -a -G "$(IFS=,; echo "${missing_groups[*]}")" "$user"
  fi
fi

# 2. directories (systemd also creates StateDirectory/ConfigurationDirectory at start)
for d in "$etc" "$state/engines" "$(dirname "$unit")"; do
  [ -d "$d" ] || act install -d -m 0755 "$d"
done
if system_changes && [ "$dry_run" = 0 ]; then
  chown "$user:$user" "$state" "$state/engines"
fi

on_jetson=0
if system_changes && [ -f /etc/nv_tegra_release ]; then
  if [ -f "$prefix/setup.py" ]; then
    on_jetson=1
    (cd "$prefix" && jetson_recipe) || exit 1
    if [ "$dry_run" = 0 ] && [ -d "$state/kernels" ]; then chown -R "$user:$user" "$state/kernels"; fi
  else
    say "warning: no jetson-edge checkout at $prefix: clone it there, then run this script again"
  fi
fi

# 3. config: install, update if untouched, never overwrite the user's edits
new_sha="$(sha "$shipped_config")"
if [ ! -f "$config" ]; then
  say "installing $config"
  act install -m 0644 "$shipped_config" "$config"
  if [ "$dry_run" = 0 ]; then echo "$new_sha" > "$record"; fi
elif [ "$(sha "$config")" = "$new_sha" ]; then
  say "config $config unchanged"
  if [ "$dry_run" = 0 ] && [ ! -f "$record" ]; then echo "$new_sha" > "$record"; fi
elif [ -f "$record" ] && [ "$(sha "$config")" = "$(cat "$record")" ]; then
  say "updating $config (not edited since it was installed)"
  act install -m 0644 "$shipped_config" "$config"
  if [ "$dry_run" = 0 ]; then echo "$new_sha" > "$record"; fi
else
  say "keeping $config: it was changed locally; the shipped config is in $config.dist (diff them)"
  if [ ! -f "$config.dist" ] || [ "$(sha "$config.dist")" != "$new_sha" ]; then
    act install -m 0644 "$shipped_config" "$config.dist"
  fi
fi

# 4. the shipped calibration and regression sets where the config's build section points (edge build's default
#    inputs); a set already there (your own, or one a rebuild installed) is kept
for set in default regression; do
  if [ -e "$state/calibration/$set" ]; then
    say "calibration set $state/calibration/$set exists: kept"
  else
    say "installing the shipped calibration set $state/calibration/$set"
    act install -d -m 0755 "$state/calibration/$set"
    act cp -R "$here/calibration/$set/." "$state/calibration/$set/"
  fi
done
if system_changes && [ "$dry_run" = 0 ]; then
  chown -R "$user:$user" "$state/calibration"
fi

# 5. the units, with ExecStart under --prefix
unit_changed=0
if render "$shipped_unit" | write_if_changed "$unit"; then
  unit_changed=1
  say "installed $unit (ExecStart=$edge_bin)"
else
  say "unit $unit unchanged"
fi
if render "$here/systemd/jetson-edge-engine.service" | write_if_changed "$engine_unit"; then
  unit_changed=1
  say "installed $engine_unit (builds the engine when it is missing or stale for this board)"
fi
if [ "$clocks" = 1 ]; then
  if render "$here/systemd/jetson-edge-clocks.service" | write_if_changed "$clocks_unit"; then
    unit_changed=1
    say "installed $clocks_unit (jetson_clocks once a boot, before the service)"
  else
    say "unit $clocks_unit unchanged"
  fi
fi

# 6. systemd: jtop's service from the venv (on a Jetson), then the unit enabled (not started: see 8)
if system_changes; then
  if [ -d /run/systemd/system ]; then
    if [ "$unit_changed" = 1 ]; then act systemctl daemon-reload; fi
    if [ "$on_jetson" = 1 ]; then jtop_service; fi
    if [ "$enable" = 1 ]; then
      names=(jetson-edge.service jetson-edge-engine.service)
      if [ "$clocks" = 1 ]; then names+=(jetson-edge-clocks.service); fi
      for name in "${names[@]}"; do
        if systemctl is-enabled --quiet "$name" 2>/dev/null; then
          say "$name already enabled"
        else
          act systemctl enable "$name"
        fi
      done
    fi
  else
    say "systemd is not running here: run 'systemctl daemon-reload && systemctl enable --now jetson-edge' on the device"
  fi
else
  say "staged under $destdir (DESTDIR): no users, groups or systemctl"
fi

# 7. the power mode, when asked: once, on the board itself (staged: only said)
if [ -n "$power_mode" ]; then
  if ! system_changes; then
    say "staged: --power-mode $power_mode is set on the device itself"
  elif [ ! -f /etc/nvpmodel.conf ] || ! command -v nvpmodel >/dev/null; then
    say "warning: --power-mode $power_mode: no nvpmodel here (not a Jetson): nothing set"
  else
    set_power_mode "$prefix/.venv/bin/python" /etc/nvpmodel.conf
  fi
fi

# 8. the model: without it the service stops at once (exit 2, RestartPreventExitStatus=2), no restart loop
model="$(awk '/^model:/ {m = 1; next} /^[^ #]/ {m = 0} m && $1 == "path:" {print $2; exit}' "$config" 2>/dev/null || true)"
if [ -n "$model" ] && [ ! -f "$destdir$model" ]; then
  say "no model at $model yet: make it (docs/service.md, 'The first model'), then: systemctl start jetson-edge"
else
  say "start it with: systemctl start jetson-edge; follow it with: journalctl -u jetson-edge -f"
fi
