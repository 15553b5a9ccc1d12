#!/usr/bin/env bash
# The embedded default, end to end on a CPU: installs the run-time requirements into the current
# Python, prepares the corpus (this Python's standard library), trains the tiny AR teacher, converts it
# into the two kinds of DLM and trains the bidirectional one with REPR-ALIGN (the project's main job).
# A stage whose output already exists is reused, and says so.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
"$PYTHON" -m pip install -q --disable-pip-version-check -r requirements.txt

stage() {  # stage NAME OUTPUT_FILE COMMAND...
  local name=$1 done_file=$2; shift 2
  if [ -e "$done_file" ]; then
    echo "== $name: reusing $(dirname "$done_file") (delete it to redo this stage)"
  else
    echo "== $name: $*"
    "$@" || { echo "run.sh: stage '$name' failed (command: $*)" >&2; exit 1; }
  fi
}

stage corpus     data/stdlib/meta.json        "$PYTHON" data.py --out_dir data/stdlib
resume=$([ -e out/ar-tiny/train_state.pt ] && echo --resume || true)  # an interrupted run continues
stage pretrain   out/ar-tiny/results.json     "$PYTHON" pretrain.py --data data/stdlib --out_dir out/ar-tiny $resume
stage convert    out/dlm-tiny/config.json     "$PYTHON" convert.py --ar out/ar-tiny --out_dir out/dlm-tiny --attn bidirectional
stage convert    out/dlm-block/config.json    "$PYTHON" convert.py --ar out/ar-tiny --out_dir out/dlm-block --attn block --block_size 4
resume=$([ -e out/align/train_state.pt ] && echo --resume || true)
stage align      out/align/results.json       "$PYTHON" align.py --init out/dlm-tiny --data data/stdlib --out_dir out/align $resume
echo "done: AR teacher out/ar-tiny; converted DLMs out/dlm-tiny (bidirectional), out/dlm-block (block, size 4);"
echo "      REPR-ALIGN student out/align (results.json, log.jsonl). Try: python sample.py --ckpt out/align"
