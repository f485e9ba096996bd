#!/usr/bin/env bash
# Install jetson-edge as a systemd service on a Jetson: user, groups, config, unit; then enable it.
# Idempotent: a second run changes nothing. A config the user edited is never overwritten (the shipped one
# is written beside it as config.yaml.dist instead).
#
#   sudo scripts/install_service.sh                       # prefix /opt/jetson-edge (the checkout with .venv/)
#   sudo scripts/install_service.sh --prefix /srv/edge    # ExecStart=/srv/edge/.venv/bin/edge
#   scripts/install_service.sh --dry-run                  # print what would be done, change nothing
#   DESTDIR=/tmp/stage scripts/install_service.sh         # stage the files under /tmp/stage only
#                                                         # (no user, no groups, no systemctl; for packaging/tests)
#
# Then: sudo systemctl start jetson-edge; journalctl -u jetson-edge -f   (see docs/service.md)
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
prefix=/opt/jetson-edge
dry_run=0
enable=1
user=jetson-edge
groups=(video render jtop)

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
say() { echo "install_service: $*"; }
act() {  # run a command, or only print it with --dry-run
  if [ "$dry_run" = 1 ]; then echo "would run: $*"; else "$@"; fi
}
step() {  # a recipe step: its failure stops the install with its message, nothing after it runs
  act "$@" || { echo "install_service.sh: step failed (exit $?): $* (see above; docs/service.md)" >&2; exit 1; }
}

# On a Jetson: the one install recipe (docs/service.md and README.md show these same lines;
# tests/test_install_recipe.py compares them). JetPack's TensorRT and OpenCV (GStreamer: csi:// cameras; never
# PyPI's OpenCV here, the constraints refuse it), nvcc of JetPack's CUDA where a minimal flash lacks it, a venv
# that sees JetPack's packages, pip under this JetPack's constraints (NumPy 1.x: JetPack's OpenCV and TensorRT
# are built against it), pycuda built against JetPack's CUDA, jtop's service, and the preprocessing kernel built
# into the state directory the service and the CLI both read (the service never runs nvcc; docs/gpu.md).
jetson_recipe() {
  local jp cuda
  jp="$(jetpack)" && cuda="$(cuda_package_version)" || exit 1
  step apt-get install -y python3-libnvinfer python3-opencv python3-venv python3-dev
  has_nvcc || step apt-get install -y "cuda-nvcc-$cuda"
  step python3 -m venv --system-site-packages .venv
  step env PATH="/usr/local/cuda/bin:$PATH" PIP_CONSTRAINT="constraints/$jp.txt" .venv/bin/pip install -e '.[jetson,service,check]'
  step .venv/bin/jtop --install-service
  step env PATH="/usr/local/cuda/bin:$PATH" .venv/bin/python scripts/build_kernel.py --into "$state/kernels"
}
has_nvcc() { [ -x /usr/local/cuda/bin/nvcc ]; }  # pycuda's build and the kernel's need it; minimal flashes lack it
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
# Sourced (tests/test_install_recipe.py runs the recipe's functions alone): stop here.
if [ "${BASH_SOURCE[0]}" != "$0" ]; then return 0; fi

while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
    --prefix=*) prefix="${1#--prefix=}"; shift ;;
    --dry-run|-n) dry_run=1; shift ;;
    --no-enable) enable=0; shift ;;
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
state="$destdir/var/lib/jetson-edge"

sha() { sha256sum "$1" | cut -d' ' -f1; }
system_changes() { [ -z "$destdir" ]; }  # users, groups and systemctl only on a real install

if system_changes && [ "$dry_run" = 0 ] && [ "$(id -u)" != 0 ]; then
  echo "install_service.sh: run as root (or use --dry-run, or DESTDIR=... to stage files)" >&2
  exit 1
fi
[ -f "$shipped_unit" ] && [ -f "$shipped_config" ] || { echo "install_service.sh: missing $shipped_unit or $shipped_config" >&2; exit 2; }
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
refuse_links "$config" "$record" "$config.dist" "$unit" "$state/engines" "$state/kernels"

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

if system_changes && [ -f /etc/nv_tegra_release ]; then
  if [ -f "$prefix/setup.py" ]; then
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

# 4. the unit, with ExecStart under --prefix
rendered="$(mktemp)"
trap 'rm -f "$rendered"' EXIT
sed "s|/opt/jetson-edge|${prefix%/}|g" "$shipped_unit" > "$rendered"
unit_changed=0
if [ -f "$unit" ] && cmp -s "$rendered" "$unit"; then
  say "unit $unit unchanged"
else
  say "installing $unit (ExecStart=$edge_bin)"
  act install -m 0644 "$rendered" "$unit"
  unit_changed=1
fi

# 5. systemd
if system_changes; then
  if [ -d /run/systemd/system ]; then
    if [ "$unit_changed" = 1 ]; then act systemctl daemon-reload; fi
    if [ "$enable" = 1 ]; then
      if systemctl is-enabled --quiet jetson-edge.service 2>/dev/null; then
        say "jetson-edge.service already enabled"
      else
        act systemctl enable jetson-edge.service
      fi
    fi
    say "start it with: systemctl start jetson-edge; follow it with: journalctl -u jetson-edge -f"
  else
    say "systemd is not running here: run 'systemctl daemon-reload && systemctl enable --now jetson-edge' on the device"
  fi
else
  say "staged under $destdir (DESTDIR): no users, groups or systemctl"
fi
