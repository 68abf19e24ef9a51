#!/bin/sh
# One hop of a relay, on its receiver: the program the hop may run here (stdin, kept in dir as
# receive.sh) and one line in the login user's authorized_keys that lets the hop's key run
# only that (restrict, from= the sender's address, command=). The file is recorded in dir, and
# that this created it, for relay-revoke.sh, which takes both away again.
: "${dir:?}" "${line:?}"
umask 077
user=${SUDO_USER:-$(id -un)}
home=$(getent passwd "$user" | cut -d: -f6)
[ -n "$home" ] || { echo "no home directory for the login user $user" >&2; exit 1; }
mkdir -p "$dir"
cat > "$dir/receive.sh"
keys="$home/.ssh/authorized_keys"
if [ ! -e "$keys" ]; then
  [ -d "$home/.ssh" ] || { mkdir -m 700 "$home/.ssh" && chown "$user" "$home/.ssh"; }
  : > "$keys" && chown "$user" "$keys" && echo created > "$dir/created"
elif [ -s "$keys" ] && [ -n "$(tail -c 1 "$keys")" ]; then
  printf '\n' >> "$keys"
fi
printf '%s\n' "$keys" > "$dir/keys"
printf '%s\n' "$line" >> "$keys"
echo "granted"
