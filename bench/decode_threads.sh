#!/usr/bin/env bash
# bench/decode_threads.sh OLD_MULTIHEAD NEW_MULTIHEAD [ROUNDS]: the decode-step
# measurement of docs/threads.md. Median step (ms, as `multihead decode`
# prints it) of a small model, threads 1 and 2, OMP_WAIT_POLICY unset
# (OpenMP's default), active and passive, each binary in turn, ROUNDS rounds
# (default 3, alternated round by round), with one busy loop loading the other core the whole time, as a
# shared machine does.
set -euo pipefail
old=$1 new=$2 rounds=${3:-3}
sh -c 'while :; do :; done' &
busy=$!
trap 'kill $busy 2>/dev/null' EXIT
step() {  # binary threads policy E prompt
  local env_cmd=(env OMP_WAIT_POLICY="$3")
  [[ $3 == unset ]] && env_cmd=(env -u OMP_WAIT_POLICY)
  "${env_cmd[@]}" "$1" decode --embed-dim "$4" --num-heads 4 --prompt-len "$5" --tokens 32 --threads "$2" 2>&1 |
    sed -n 's/.*median step \([0-9.]*\) ms.*/\1/p'
}
echo "| E, prompt | policy | old T=1 | old T=2 | new T=1 | new T=2 |"
echo "| --- | --- | --- | --- | --- | --- |"
for cfg in "64 4" "256 512" "256 2048"; do
  read -r E P <<<"$cfg"
  for policy in unset active passive; do
    row="| $E, $P | ${policy/unset/default} |"
    declare -A cell=()
    # Round by round, the four programs in turn, so a busy spell hits all alike.
    for ((r = 0; r < rounds; ++r)); do
      for key in "old 1" "old 2" "new 1" "new 2"; do
        read -r which t <<<"$key"
        bin=$old
        [[ $which == new ]] && bin=$new
        cell[$key]="${cell[$key]:-} $(step "$bin" "$t" "$policy" "$E" "$P")"
      done
    done
    for key in "old 1" "old 2" "new 1" "new 2"; do row="$row${cell[$key]} |"; done
    unset cell
    echo "$row"
  done
done
