#!/usr/bin/env bash
# A base image made from Debian packages with debootstrap, for machines with no
# registry: python3, python3-venv and the CA certificates, plus this host's
# extra CA certificates (/usr/local/share/ca-certificates), and a pip.conf that
# points pip at the system bundle, so pip inside a build trusts what the host's
# pip trusts. Does nothing when the image exists already.
#
#   deploy/podman/debian-base.sh localhost/lazarus-base:bookworm [suite] [mirror]
set -euo pipefail

image=${1:?usage: debian-base.sh IMAGE [SUITE] [MIRROR]}
suite=${2:-bookworm}
mirror=${3:-http://deb.debian.org/debian}
packages=python3,python3-venv,ca-certificates

if podman image exists "$image"; then
  echo ">> base image $image exists"
  exit 0
fi
echo ">> making $image from Debian $suite ($packages) with debootstrap"
root=$(mktemp -d /var/tmp/lazarus-base-XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" >"$root.log" 2>&1 || {
  tail -20 "$root.log"; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# The host's extra CAs (a TLS-inspecting proxy's, a company CA) into the image's bundle.
if compgen -G "/usr/local/share/ca-certificates/*" >/dev/null; then
  cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
fi
chroot "$root" update-ca-certificates >/dev/null
# pip vendors certifi; this makes it use the system bundle (with the CAs above).
printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$root/etc/pip.conf"
# Smaller: no package lists, caches, docs or locales (apt-get update restores the lists).
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/usr/share/doc/* \
  "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/log/*.log
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} + 2>/dev/null || true
tar --numeric-owner -C "$root" -c . | podman import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  --message "debootstrap $suite: $packages + host CAs" - "$image" >/dev/null
echo ">> $image: $(podman image inspect --format '{{.Size}}' "$image" | numfmt --to=iec)"
