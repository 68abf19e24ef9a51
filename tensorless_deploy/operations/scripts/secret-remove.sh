#!/bin/sh
# Remove a unit's secrets directory (the plan no longer gives it a key or TLS files).
: "${dir:?}"
if [ -d "$dir" ]; then
  rm -rf -- "$dir"
  echo "removed $dir"
fi
true
