#!/usr/bin/env bash
# An etcd or Redis image from Debian packages on the local base image, tagged
# with the Debian package's upstream version (3.4.23 for etcd-server
# 3.4.23-4+b6), so the chart's etcd.image.tag / redis.image.tag name a real
# version. Does nothing when REPOSITORY has an image already.
#
#   deploy/podman/service-image.sh BASE_IMAGE REPOSITORY PACKAGE [MORE PACKAGES...]
set -euo pipefail

base=${1:?usage: service-image.sh BASE_IMAGE REPOSITORY PACKAGE...}
repository=${2:?usage: service-image.sh BASE_IMAGE REPOSITORY PACKAGE...}
shift 2
main_package=$1
here=$(cd "$(dirname "$0")" && pwd)

existing=$(podman images --noheading --format '{{.Repository}}:{{.Tag}}' "$repository" | head -1)
if [ -n "$existing" ]; then
  echo ">> $existing exists"
  exit 0
fi
echo ">> building $repository from Debian packages: $*"
podman build -q -f "$here/service.Containerfile" --build-arg BASE_IMAGE="$base" \
  --build-arg PACKAGES="$*" -t "$repository:build" "$here" >/dev/null
version=$(podman run --rm "$repository:build" dpkg-query -W -f='${Version}' "$main_package")
tag=${version#*:}   # no epoch
tag=${tag%%-*}      # no Debian revision
tag=${tag%%+*}
podman tag "$repository:build" "$repository:$tag"
podman untag "$repository:build" "$repository:build"
echo ">> $repository:$tag ($main_package $version)"
