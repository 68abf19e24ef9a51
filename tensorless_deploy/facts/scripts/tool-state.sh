#!/bin/sh
# needs: units.sh
# What tensorless-deploy put on this host, for the survey (read by facts.parsers.parse_tool_state):
# its unit files (units.sh's blocks, without the containers), the model blobs under the models
# directory with their verification stamps (@blob: the blob's stamp as it is now), the snapshot
# links (target first, then the link), and the images the engine holds: everything a converged
# deploy needs to know.
# podman_images (optional): the name of a survey section that lists podman's images by digest
: "${models_dir:?}" "${state_dir:?}" "${podman_images=}"
read_units
for b in "$models_dir"/models--*/blobs/*; do
  [ -f "$b" ] || continue
  echo "@blob $(stamp_of "$b")"
  s="$state_dir/verified/${b##*/}"
  if [ -f "$s" ]; then echo "@stamp $(cat "$s")"; fi
done
for l in "$models_dir"/models--*/snapshots/*/* "$models_dir"/models--*/snapshots/*/*/*; do
  [ -L "$l" ] && echo "@link $(readlink "$l") $l"
done
for engine in podman docker; do
  command -v "$engine" >/dev/null 2>&1 || continue
  if [ "$engine" = podman ] && [ -n "$podman_images" ]; then
    # listed once, with their labels, by the survey's section of that name (one podman less)
    echo "@images-in $podman_images $engine"
  elif "$engine" images --digests --format '@image {{.Repository}}@{{.Digest}}' 2>/dev/null; then
    echo "@images-ok $engine"
  fi
  break
done
exit 0
