"""The shell side of kill safety and of record writes, for hosts reached by commands (SSH): proving a job's
leader and signalling its group in one step, reading one variable of a process's environment, finding the
processes that carry a tag, the host's boot id and name, and a write that installs a file only when every byte
arrived (and, for a compare-and-swap, only while the file holds what was expected). Each is a `sh -c` script
whose values travel as positional parameters, never inside the script."""

# $1 signal, $2 pid, $3 pgid, $4 start time, $5 NAME=value: prove the leader, then signal its group.
# 45: the leader is gone (or a zombie), 46: the pid is another process, 47: not permitted.
PROVEN_SIGNAL_SCRIPT = r"""sig=$1 pid=$2 pgid=$3 start=$4 line=$5
stat=$(cat "/proc/$pid/stat" 2>/dev/null) || exit 45
set -f
set -- ${stat##*\)}
[ "$1" != Z ] || exit 45
[ "$3" = "$pgid" ] && [ "${20}" = "$start" ] || exit 46
[ -r "/proc/$pid/environ" ] || exit 46
tr '\0' '\n' < "/proc/$pid/environ" | grep -qxF -e "$line" || exit 46
err=$(kill -"$sig" "-$pgid" 2>&1) && exit 0
case "$err" in *"No such process"*) exit 45;; *ermitted*) echo "$err"; exit 47;; esac
echo "$err"; exit 1"""
# $1 pid, $2 NAME: the value (exit 0), none (exit 1), or the environment cannot be read (exit 44).
ENV_VALUE_SCRIPT = r"""f=/proc/$1/environ
[ -e "$f" ] && [ -r "$f" ] || exit 44
tr '\0' '\n' < "$f" | awk -v n="$2=" 'index($0, n) == 1 { print substr($0, length(n) + 1); found = 1; exit }
END { exit !found }'"""
# $1 NAME=value: the environ files that hold exactly that line (GNU or busybox grep -z).
# Twice, 10 ms apart: a process caught inside an exec() reads as an empty environment for a moment (a job
# starting through `sh` and `env`); the caller merges the two lists.
FIND_ENV_SCRIPT = ('grep -laxzF -e "$1" /proc/[0-9]*/environ 2>/dev/null; sleep 0.01; '
                   'grep -laxzF -e "$1" /proc/[0-9]*/environ 2>/dev/null; exit 0')
IDENTITY_SCRIPT = "cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo; uname -n"

# A file write: $1 path, $2 its length in bytes, $3 "any", or the sha256 the file must still hold ("absent": it
# must not exist) for a compare-and-swap, done under `flock` on "$1.lock". The text arrives on stdin into a
# temporary file of its own; it is renamed over the file only when every byte arrived (48: fewer came; the old
# file stays) and, for a swap, the file still holds what was expected (49).
WRITE_SCRIPT = r"""path=$1 want=$2 expect=$3
mkdir -p -- "$(dirname -- "$path")" || exit 1
tmp=$(mktemp "$path.tmp.XXXXXX") || exit 1
trap 'rm -f -- "$tmp"' EXIT
cat > "$tmp" || exit 1
got=$(wc -c < "$tmp") || exit 1
[ "$got" -eq "$want" ] || { echo "received $got of $want bytes; $path was left as it was" >&2; exit 48; }
m=$(umask)
chmod "$(printf %o $((0666 & ~m)))" "$tmp" 2>/dev/null
sync -- "$tmp" 2>/dev/null
if [ "$expect" != any ]; then
  command -v flock >/dev/null 2>&1 || { echo "flock (util-linux) is not installed" >&2; exit 50; }
  exec 9>>"$path.lock"
  flock 9 || exit 1
  if [ -e "$path" ]; then now=$(sha256sum < "$path") || exit 1; now=${now%% *}; else now=absent; fi
  [ "$now" = "$expect" ] || exit 49
fi
mv -f -- "$tmp" "$path" || exit 1
trap - EXIT"""
