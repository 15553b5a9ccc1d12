# Sourced by run.sh and scripts/repro_*.sh. stage NAME DONE_FILE COMMAND...: runs COMMAND unless DONE_FILE exists
# (a finished stage is reused, and says so), stops the script with the stage's name when it fails, and prints its
# seconds and the total since T0 (set by the caller); with STAGE_LOG set, also appends "NAME<tab>SECONDS" to it.
stage() {
  local name=$1 done_file=$2 t=$SECONDS; shift 2
  if [ -e "$done_file" ]; then echo "== $name: reusing $done_file (delete it to redo this stage)"; return; fi
  echo "== $name: $*"
  "$@" || { echo "$0: stage '$name' failed (command: $*)" >&2; exit 1; }
  if [ -n "${STAGE_LOG:-}" ]; then printf '%s\t%s\n' "$name" $((SECONDS - t)) >> "$STAGE_LOG"; fi
  echo "== $name: done in $((SECONDS - t)) s (total $((SECONDS - T0)) s)"
}
lr() { echo --lr "$1" --min_lr "$(awk "BEGIN { print $1 / 10 }")"; }  # lr RATE: a peak rate, its floor a tenth of it
# sweep GRID_VAR TRAIN CHOOSE: TRAIN RATE for each rate in $GRID_VAR, then CHOOSE RATES... prints the rate past the
# sweep's choice when that is its edge (or nothing): the sweep goes on there, three rates more at most. GRID_VAR ends
# holding every rate run. TRAIN and CHOOSE are commands, split into words.
sweep() {
  local -n sweep_grid=$1; local train=$2 choose=$3 more r next
  for more in 0 1 2 3; do
    for r in $sweep_grid; do $train $r; done
    next=$($choose $sweep_grid)
    [ -n "$next" ] && [ $more -lt 3 ] || break
    echo "== the sweep chose its edge; it goes on at $next"
    sweep_grid="$sweep_grid $next"
  done
}
# sweep2 LAMBDAS_VAR RATES_VAR TRAIN CHOOSE: TRAIN λ RATE over the grid $LAMBDAS_VAR × $RATES_VAR, then CHOOSE
# "LAMBDAS" "RATES" prints the axis and the value past the choice when it is an edge of the grid ("lambda 0.1",
# "rate 3e-4") or nothing: the value joins its axis and the grid's new runs are trained, three times at most.
sweep2() {
  local -n sweep_lams=$1 sweep_rates=$2; local train=$3 choose=$4 more l r axis next
  for more in 0 1 2 3; do
    for l in $sweep_lams; do for r in $sweep_rates; do $train $l $r; done; done
    next=
    read -r axis next < <($choose "$sweep_lams" "$sweep_rates") || true
    [ -n "$next" ] && [ $more -lt 3 ] || break
    echo "== the sweep chose its edge; it goes on at $axis $next"
    if [ "$axis" = lambda ]; then sweep_lams="$sweep_lams $next"; else sweep_rates="$sweep_rates $next"; fi
  done
}
