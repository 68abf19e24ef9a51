#!/bin/sh
# needs: lib.sh
# A blob verified earlier whose snapshot link is missing or wrong: link it, stamp it again.
: "${blob:?}" "${stamp:?}" "${snapshot:?}" "${target:?}"
stamp_and_link
