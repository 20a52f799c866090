#!/bin/bash
# Writes the static pod manifest of one cluster member to stdout, from
# ephd-member.yaml (the manifest of the member it names in --name, cp-1 at
# 192.0.2.10 as shipped): the member's name and node IP replace the
# template's own ones everywhere except in comments and in
# --initial-cluster, which lists every member and stays as it is.
#
# Usage: render.sh NAME NODE_IP [IMAGE]
#   deploy/cluster/static-pod/render.sh cp-2 192.0.2.11 > /etc/kubernetes/manifests/ephd.yaml
set -euo pipefail
name="${1:?usage: render.sh NAME NODE_IP [IMAGE]}"
ip="${2:?usage: render.sh NAME NODE_IP [IMAGE]}"
image="${3:-registry.example.com/ephd:0.1.0}"
template="$(dirname "${BASH_SOURCE[0]}")/ephd-member.yaml"

# The template's own member: its --name and the host of its advertised
# peer URL.
own_name="$(sed -n 's/^[[:space:]]*- --name=\(.*\)$/\1/p' "$template")"
own_ip="$(sed -n 's|^[[:space:]]*- --initial-advertise-peer-urls=https://\([^:]*\):.*$|\1|p' "$template")"
if [ -z "$own_name" ] || [ -z "$own_ip" ]; then
  echo "render.sh: $template has no --name or --initial-advertise-peer-urls line" >&2
  exit 1
fi
if ! grep -q -- "--initial-cluster=\(.*,\)\{0,1\}${name}=https://${ip}:" "$template"; then
  echo "render.sh: --initial-cluster in $template has no member ${name} at ${ip};" \
    "edit that line for your nodes first" >&2
  exit 1
fi
own_ip_re="${own_ip//./\\.}"
echo "# Rendered by deploy/cluster/static-pod/render.sh for member ${name} at ${ip}."
sed -e '/^[[:space:]]*#/b' -e '/--initial-cluster=/b' \
  -e "s/--name=${own_name}\$/--name=${name}/" -e "s/${own_ip_re}/${ip}/g" \
  -e "s|registry.example.com/ephd:0.1.0|${image}|" "$template"
