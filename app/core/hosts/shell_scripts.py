"""The shell side of kill safety and of record writes, for hosts reached by commands (SSH): proving a job's
leader and signalling its group in one step, reading one variable of a process's environment, finding the
processes that carry a tag, the host's boot id and name, a write that installs a file only when every byte
arrived (and, for a compare-and-swap, only while the file holds what was expected), an exclusive create that
never leaves a half file, a path's age by the host's own clock, and the folder rule of the state folder (0700,
no symbolic links followed). Each is a `sh -c` script whose values travel as positional parameters, never inside
the script."""

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

# The folder rule of every write under the state folder, as a shell function: `folder STATE FOLDER` creates FOLDER
# (mkdir -p); when FOLDER is the state folder or inside it, what it creates is 0700 (umask 077), every folder from
# FOLDER up to the state folder is tightened to 0700 (chmod go-rwx: what an older tunedash left at 0755), and a
# symbolic link among them below the state folder is refused (51). The state folder itself may be a link of the
# user's (moved to another disk).
_FOLDER_FUNCTION = r"""folder() {
  state=$1 d=$2
  case "$d/" in
    "$state"/*) [ -n "$state" ] || { [ -d "$d" ] || mkdir -p -- "$d"; return; } ;;
    *) [ -d "$d" ] || mkdir -p -- "$d"; return ;;
  esac
  [ -d "$d" ] || (umask 077 && mkdir -p -- "$d") || return 1
  set -- "$state"
  while [ -n "$d" ] && [ "$d" != "$state" ] && [ "$d" != . ] && [ "$d" != / ]; do
    if [ -L "$d" ]; then
      echo "$d is a symbolic link; tunedash follows no link inside its state folder $state: remove it" >&2; return 51
    fi
    set -- "$@" "$d"
    case $d in */*) d=${d%/*} ;; *) d=. ;; esac
  done
  chmod go-rwx -- "$@" 2>/dev/null
  return 0
}
"""
# $1 the state folder, $2 a folder: Host.make_folder.
FOLDER_SCRIPT = _FOLDER_FUNCTION + 'folder "$1" "$2"'

# $1 a path, $2 how many bytes of it to print (0: none): "PLAIN NOW MTIME %y" (PLAIN 1 for a plain file, 0 for a
# link or anything else; NOW the host's time; MTIME and %y the path's own, by lstat: a link is never followed),
# then, for a plain file, its first $2 bytes; 44 when nothing is there. Host.path_age.
AGE_SCRIPT = r"""[ -e "$1" ] || [ -L "$1" ] || exit 44
if [ -f "$1" ] && [ ! -L "$1" ]; then plain=1; else plain=0; fi
m=$(stat -c '%Y %y' -- "$1") || exit 1
echo "$plain $(date +%s.%N) $m"
[ "$plain" = 1 ] && [ "$2" -gt 0 ] || exit 0
head -c "$2" -- "$1" || exit 44"""

# $1 the state folder, $2 a path, $3 its text: create it only if nothing (not even a link) is there (53 when
# something is). The text goes to a temporary file of its own (0600, flushed) first, then `ln` (link(2): it
# fails when the path exists) installs it whole; so a crash or a full disk never leaves a half-written file.
CREATE_SCRIPT = _FOLDER_FUNCTION + r"""path=$2
case $path in */*) ;; *) path=./$path ;; esac
folder "$1" "${path%/*}" || exit $?
if [ -e "$path" ] || [ -L "$path" ]; then exit 53; fi
tmp=$(mktemp "$path.tmp.XXXXXX") || exit 1
trap 'rm -f -- "$tmp"' EXIT
printf '%s' "$3" > "$tmp" || exit 1
sync -- "$tmp" 2>/dev/null
ln -- "$tmp" "$path" 2>/dev/null && exit 0
if [ -e "$path" ] || [ -L "$path" ]; then exit 53; fi
echo "cannot link $path" >&2; exit 1"""

# A file write: $1 path, $2 its length in bytes, $3 "any", or the sha256 the file must still hold ("absent": it
# must not exist) for a compare-and-swap, done under `flock` on "$1.lock"; $4 the state folder ("" for none: the
# folder rule above). The text arrives on stdin into a temporary file of its own (0600, as mktemp makes it); it
# is renamed over the file only when every byte arrived (48: fewer came; the old file stays) and, for a swap, the
# file still holds what was expected (49). A link at the path is replaced (a plain write) or refused (a swap,
# and the lock file: 51), never followed.
WRITE_SCRIPT = _FOLDER_FUNCTION + r"""path=$1 want=$2 expect=$3
case $path in */*) ;; *) path=./$path ;; esac
folder "${4:-}" "${path%/*}" || exit $?
tmp=$(mktemp "$path.tmp.XXXXXX") || exit 1
trap 'rm -f -- "$tmp"' EXIT
cat > "$tmp" || exit 1
got=$(wc -c < "$tmp") || exit 1
[ "$got" -eq "$want" ] || { echo "received $got of $want bytes; $path was left as it was" >&2; exit 48; }
sync -- "$tmp" 2>/dev/null
if [ "$expect" != any ]; then
  command -v flock >/dev/null 2>&1 || { echo "flock (util-linux) is not installed" >&2; exit 50; }
  for f in "$path.lock" "$path"; do
    if [ -L "$f" ]; then
      echo "$f is a symbolic link; tunedash follows no link in its state folder: remove it" >&2; exit 51
    fi
  done
  m=$(umask); umask 077
  exec 9>>"$path.lock"
  umask "$m"
  flock 9 || exit 1
  if [ -e "$path" ]; then now=$(sha256sum < "$path") || exit 1; now=${now%% *}; else now=absent; fi
  [ "$now" = "$expect" ] || exit 49
elif [ -L "$path" ]; then
  rm -f -- "$path"
fi
if [ -d "$path" ]; then echo "$path is a folder; $path was left as it was" >&2; exit 51; fi
mv -f -- "$tmp" "$path" || exit 1
trap - EXIT"""
