#!/bin/sh
# The NVIDIA driver's packages and what keeps them where they are, for the survey and prepare
# (facts.nvidia.parse_driver_packages): "@manager apt|dnf", then "@pkg NAME VERSION" for every
# installed package named like the driver's (nvidia*, libnvidia*, libcuda*, cuda-drivers*,
# xserver-xorg-video-nvidia*), "@held NAME" for each apt-mark hold, "@lock SPEC" for each dnf
# versionlock entry, and "@pin LINE" for each line of tensorless-deploy's apt pin file.
: "${pin_file:?}"
if command -v dpkg-query >/dev/null 2>&1; then
  echo "@manager apt"
  dpkg-query -W -f '${db:Status-Abbrev}|${Package}|${Version}\n' 2>/dev/null \
    | while IFS='|' read -r status name version; do
        case $status in ii*|hi*) ;; *) continue ;; esac
        case $name in
          nvidia*|libnvidia*|libcuda*|cuda-drivers*|xserver-xorg-video-nvidia*)
            echo "@pkg $name $version" ;;
        esac
      done
  apt-mark showhold 2>/dev/null | sed 's/^/@held /'
  if [ -f "$pin_file" ]; then sed 's/^/@pin /' "$pin_file"; fi
elif command -v rpm >/dev/null 2>&1; then
  echo "@manager dnf"
  rpm -qa --qf '@pkg %{NAME} %{EPOCH}:%{VERSION}-%{RELEASE}\n' \
    'nvidia*' 'libnvidia*' 'cuda-drivers*' 2>/dev/null | sed 's/ (none):/ /'
  dnf versionlock list 2>/dev/null | grep -v '^Last metadata' | sed 's/^/@lock /'
fi
exit 0
