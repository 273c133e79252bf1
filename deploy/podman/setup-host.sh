#!/usr/bin/env bash
# Podman on this Debian machine: the packages when missing, and a
# containers.conf when none exists yet (an existing one is left alone).
#
# What a VM like this one needs (seen on the machine the image was verified on):
#   runtime = "runc"            crun refuses hybrid (v1 + v2) cgroup hierarchies
#   cgroup_manager = "cgroupfs" no systemd to delegate cgroups to
#   events_logger = "file"      no journald
#   network_backend = "netavark" user networks resolve container names and
#                               aliases (aardvark-dns), as cluster DNS does
#   default_ulimits nofile / nproc at most 20000 / 32768: root here lacks
#                               CAP_SYS_RESOURCE, so podman's defaults (1048576)
#                               cannot be set
set -euo pipefail

SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
# netavark + aardvark-dns: user networks with name resolution (CNI has none without dnsname).
PACKAGES=(podman buildah runc slirp4netns fuse-overlayfs uidmap debootstrap netavark aardvark-dns)

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo ">> installing Debian packages: ${missing[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

if [ "$(id -u)" = 0 ]; then
  conf=/etc/containers/containers.conf
else
  conf="${XDG_CONFIG_HOME:-$HOME/.config}/containers/containers.conf"
fi
if [ ! -e "$conf" ]; then
  echo ">> writing $conf"
  $SUDO mkdir -p "$(dirname "$conf")"
  $SUDO tee "$conf" >/dev/null <<'CONF'
# Written by Lazarus `make image` (deploy/podman/setup-host.sh) for a VM with
# hybrid cgroups, no systemd and no CAP_SYS_RESOURCE.
[containers]
default_ulimits = [
  "nofile=20000:20000",
  "nproc=32768:32768",
]

[network]
network_backend = "netavark"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
fi
