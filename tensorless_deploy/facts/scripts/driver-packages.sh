#!/bin/sh
# The NVIDIA driver's packages and what keeps them where they are, for the survey and prepare
# (facts.nvidia.parse_driver_packages): "@manager apt|dnf", then "@pkg NAME VERSION" for every
# installed package named like the driver's (nvidia*, libnvidia*, libcuda*, cuda-drivers*,
# xserver-xorg-video-nvidia*), "@held NAME" for each one on hold (apt-mark hold), "@lock LINE"
# for each line of dnf's version-lock list (read from its file: dnf itself loads its metadata,
# and may go to the network, to list it), and "@pin LINE" for each line of tensorless-deploy's
# apt pin file.
: "${pin_file:?}"
if command -v dpkg-query >/dev/null 2>&1; then
  echo "@manager apt"
  # dpkg-query matches the names itself (listing every package through a shell loop took
  # seconds on a busy host); a pattern without a match only complains on stderr
  dpkg-query -W -f '${db:Status-Abbrev}|${Package}|${Version}\n' 'nvidia*' 'libnvidia*' \
      'libcuda*' 'cuda-drivers*' 'xserver-xorg-video-nvidia*' 2>/dev/null \
    | while IFS='|' read -r status name version; do
        # the first letter is dpkg's selection: h = hold, what apt-mark hold sets (and
        # apt-mark showhold lists, loading the whole cache to do so)
        case $status in
          ii*) echo "@pkg $name $version" ;;
          hi*) echo "@pkg $name $version"; echo "@held $name" ;;
        esac
      done
  if [ -f "$pin_file" ]; then sed 's/^/@pin /' "$pin_file"; fi
elif command -v rpm >/dev/null 2>&1; then
  echo "@manager dnf"
  rpm -qa --qf '@pkg %{NAME} %{EPOCH}:%{VERSION}-%{RELEASE}\n' \
    'nvidia*' 'libnvidia*' 'cuda-drivers*' 2>/dev/null | sed 's/ (none):/ /'
  # dnf 4's versionlock plugin (NAME-EPOCH:VERSION-RELEASE.* lines), dnf 5's versionlock.toml
  for list in /etc/dnf/plugins/versionlock.list /etc/dnf/versionlock.toml; do
    if [ -f "$list" ]; then grep -v '^[[:space:]]*#' "$list" | sed '/^[[:space:]]*$/d; s/^/@lock /'; fi
  done
fi
exit 0
