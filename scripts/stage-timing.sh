# scripts/stage-timing.sh: sourced by scripts/test.sh and .ci/run. Times
# each CI stage: wall seconds, and CPU seconds (user + system of every
# process the stage ran and waited for, from the shell's cumulative child
# times in /proc). On a shared machine the wall time says little; CPU
# seconds / cores is about the wall time on an idle one.
#
#   stage NAME COMMAND [ARG...]   runs COMMAND (a function or a program) as
#                                 one stage; prints "== stage NAME: ..." at its end
#   stage_summary                 prints every stage so far and the totals
#
# Stages are recorded in $MULTIHEAD_TIMING_FILE, so that .ci/run's summary
# also holds the stages scripts/test.sh ran. A failing COMMAND stops the
# script as before (set -e); the EXIT trap prints the summary so far, with
# the stage that failed.

# Sets _stage_cpu to the cumulative user + system CPU seconds of this
# shell's waited-for children. No command substitution here: it would fork,
# and read the subshell's own (empty) child times.
_stage_read_child_cpu() {
  local stat fields
  read -r stat </proc/$BASHPID/stat
  # Fields after the command name (which may hold spaces): cutime and
  # cstime are fields 16 and 17 of the whole line, 14 and 15 after ") ".
  read -r -a fields <<<"${stat##*) }"
  _stage_cpu=$(((fields[13] + fields[14]) * 100 / _stage_hz))  # centiseconds
}
_stage_hz=$(getconf CLK_TCK)

_stage_now() { date +%s.%N; }

if [[ -z ${MULTIHEAD_TIMING_FILE:-} ]]; then
  MULTIHEAD_TIMING_FILE=$(mktemp "${TMPDIR:-/tmp}/multihead-stages.XXXXXX")
  export MULTIHEAD_TIMING_FILE
  _stage_owner=1
else
  _stage_owner=0
fi
_stage_current=""

stage() {
  local name=$1 w0 c0 w1 c1 wall cpu
  shift
  _stage_current=$name
  w0=$(_stage_now)
  _stage_read_child_cpu
  c0=$_stage_cpu
  "$@"
  _stage_read_child_cpu
  c1=$_stage_cpu
  w1=$(_stage_now)
  wall=$(awk -v a="$w0" -v b="$w1" 'BEGIN { printf "%.0f", b - a }')
  cpu=$(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.0f", (b - a) / 100 }')
  printf '%s\t%s\t%s\n' "$name" "$wall" "$cpu" >>"$MULTIHEAD_TIMING_FILE"
  echo "== stage $name: wall ${wall} s, CPU ${cpu} s"
  _stage_current=""
}

stage_summary() {
  [[ -s $MULTIHEAD_TIMING_FILE ]] || return 0
  echo "== stage timings (CPU = user + system of the stage's processes; CPU / $(nproc) cores ~ wall on an idle machine)"
  awk -F'\t' -v cores="$(nproc)" '
    { printf "  %-28s wall %6d s   CPU %6d s\n", $1, $2, $3; w += $2; c += $3 }
    END { printf "  %-28s wall %6d s   CPU %6d s   (CPU / %d = %d s)\n", "total", w, c, cores, c / cores }' \
    "$MULTIHEAD_TIMING_FILE"
}

# The process that made the file prints the summary when it exits and
# removes the file; a nested script (test.sh under .ci/run) only appends.
_stage_exit() {
  local status=$?
  if [[ -n $_stage_current ]]; then
    echo "== stage $_stage_current FAILED (exit $status)"
  fi
  if ((_stage_owner)); then
    stage_summary
    rm -f "$MULTIHEAD_TIMING_FILE"
  fi
  return "$status"
}
trap _stage_exit EXIT
